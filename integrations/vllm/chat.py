"""vLLM's chat API: reasoning, content and tool calls from the core's :class:`~detok_plugin.ChatStream`.

``--reasoning-parser detok_qwen3 --tool-call-parser detok_qwen3 --enable-auto-tool-choice``
(or ``detok_<preset>`` for any preset of ``detok_plugin.families``, and ``detok_gpt_oss``)
makes vLLM's chat layer split each request's output with one ``ChatStream``, fed the token
ids vLLM passes (``chat_registry`` plugs the names in):

1. a tag spread over any number of tokens or steps never leaks into ``content`` and
   switches channel in the step of its last token (one boundary for tags and stops);
2. a tool call is sent once the model has finished it (its body's close tag, or the end of
   a body that runs to the end), whole: a call cut short by ``max_tokens`` is never sent,
   streamed or not (a client may run what it receives), and the calls before it stay. A
   request may ask for a call's name and ``arguments`` as they form instead (the family's
   body reader) with ``"vllm_xargs": {"detok_stream_arguments": true}``: then a call cut
   short has had its name and part of its arguments sent. A body that closed but does not
   parse is reported as ``content`` (its raw text, tags included);
3. stop strings are cut where the detokenizer cuts them: with the detokenizer plugin on,
   only outside reasoning (vllm-project/vllm#53066, ``xargs``); without it, anywhere, as
   stock vLLM's detokenizer does;
4. nothing the stream raises reaches vLLM's serving loop (which would end the reply with an
   error event): the failure is logged and the rest of the reply is the detokenizer's text,
   as content (``DetokChatParser.parse_delta``).

The fields become vLLM's ``DeltaMessage`` through :data:`new_delta`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from detok_plugin import ChatStream, TagSet, families, live_tags
from detok_plugin.families import mistral

from . import _framework
from .detokenizer import detokenizer_is_ours
from .harmony import HarmonyChannels
from .tool_ids import call_counter, new_call_id
from .xargs import tag_xargs

__all__ = [
    "STREAM_ARGUMENTS_KEY", "DetokChatParser", "DetokHarmonyParser", "DetokToolParser", "chat_stream", "new_delta",
    "request_tags", "streams_arguments", "tokenizer_reasoning_tags",
]

#: The ``vllm_xargs`` key by which a request asks for tool-call arguments as they form.
STREAM_ARGUMENTS_KEY = "detok_stream_arguments"

logger = logging.getLogger("vllm.detok_plugin")

_api = _framework.chat_api()
_Parser: Any = _api.Parser
_ToolParser: Any = _api.ToolParser

#: ``DeltaMessage(**fields)``: the model's own validation (its validators, vLLM's
#: ``__log_extra_fields__`` included), called as pydantic's ``model_validate`` calls it,
#: without ``BaseModel.__init__``'s Python frame: the same object, a fifth cheaper
#: (docs/benchmarks.md, "vLLM's chat layer").
new_delta = _api.DeltaMessage.__pydantic_validator__.validate_python


def request_tags(parser: Any, request: Any) -> TagSet | None:
    """The parser's tags live in this request: reasoning tags with a reasoning parser, tool
    tags with a tool parser and a request whose tools are not switched off."""
    tags = parser.tags
    reasoning = parser.reasoning_parser is not None and tags.reasoning_open is not None
    tools = (
        parser.tool_parser is not None
        and tags.tool_open is not None
        and bool(getattr(request, "tools", None))
        and getattr(request, "tool_choice", None) != "none"
    )
    return live_tags(tags, reasoning, tools)


def chat_stream(parser: Any, request: Any, prompt: Sequence[int], *, streaming: bool) -> ChatStream:
    """One request's :class:`ChatStream`, from vLLM's parser and request."""
    tokenizer = parser.model_tokenizer
    stop = getattr(request, "stop", None)
    return ChatStream(
        tokenizer,
        request_tags(parser, request),
        prompt_ids=prompt,
        skip_special_tokens=bool(getattr(request, "skip_special_tokens", True)),
        spaces_between_special_tokens=getattr(request, "spaces_between_special_tokens", True),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        include_stop_str_in_output=bool(getattr(request, "include_stop_str_in_output", False)),
        min_tokens=getattr(request, "min_tokens", 0) or 0,
        # The detokenizer plugin cuts stops outside reasoning; vLLM's stock one anywhere.
        stop_in_reasoning=not detokenizer_is_ours(),
        # The callbacks hold the parts of the parser they read, not the parser, which holds
        # this stream: no reference cycle, so a finished request is freed when vLLM drops
        # it, not by a later pass of the garbage collector.
        end_ids=functools.partial(_end_ids, tokenizer, request, parser._model_config),
        tools=functools.partial(_tool_dicts, request),
        new_call_id=functools.partial(new_call_id, call_counter(parser)),
        include_reasoning=getattr(request, "include_reasoning", True),
        streaming=streaming,
        stream_arguments=streams_arguments(request),
        log=logger,
    )


def streams_arguments(request: Any) -> bool:
    """Whether the request asked for tool-call names and arguments as they form
    (``vllm_xargs``' :data:`STREAM_ARGUMENTS_KEY` set to true; vLLM's request model keeps a
    JSON ``true`` there as ``1``), not once each call is finished."""
    xargs = getattr(request, "vllm_xargs", None)
    return isinstance(xargs, dict) and xargs.get(STREAM_ARGUMENTS_KEY) in (True, 1, "true")


def _end_ids(tokenizer: Any, request: Any, model_config: Any) -> frozenset[int]:
    """The ids that end a request without text: its stop token ids, the tokenizer's EOS and
    the ids the engine stops on by the model's generation config (:func:`generation_stop_ids`),
    read at the finish only."""
    stop = getattr(request, "stop_token_ids", None)
    ends: frozenset[int] = _tokenizer_eos(tokenizer) | generation_stop_ids(model_config)
    return ends.union(stop) if stop else ends


def _kept(memo: dict[int, tuple[Any, frozenset[int]]], obj: Any, read: Callable[[Any], frozenset[int]]) -> frozenset[int]:
    """``read(obj)``, kept per object in ``memo`` (by identity, the object kept alive with
    its entry; a server has one or two, so at most 8 before they start again)."""
    got = memo.get(id(obj))
    if got is not None and got[0] is obj:
        return got[1]
    ids = read(obj)
    if len(memo) >= 8:
        memo.clear()
    memo[id(obj)] = (obj, ids)
    return ids


#: Per tokenizer: its EOS id as a set (a Hugging Face tokenizer's ``eos_token_id`` is a
#: property that looks the token up).
_EOS: dict[int, tuple[Any, frozenset[int]]] = {}


def _tokenizer_eos(tokenizer: Any) -> frozenset[int]:
    return _kept(_EOS, tokenizer, _read_eos)


def _read_eos(tokenizer: Any) -> frozenset[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return frozenset([eos] if isinstance(eos, int) else [])


#: Per model config: its generation config's EOS ids.
_GENERATION_EOS: dict[int, tuple[Any, frozenset[int]]] = {}


def generation_stop_ids(model_config: Any) -> frozenset[int]:
    """The ids the engine stops on beside the tokenizer's EOS: the model's generation config's
    ``eos_token_id`` (an int or a list), which vLLM adds to every request's stop token ids
    (``SamplingParams.update_from_generation_config``) and never renders as text. Gemma 4
    stops on ``<|tool_response>`` after a call, Llama 3 on ``<|eom_id|>``."""
    return frozenset() if model_config is None else _kept(_GENERATION_EOS, model_config, _read_generation_eos)


def _read_generation_eos(model_config: Any) -> frozenset[int]:
    try:
        fields = model_config.try_get_generation_config() or {}
    except Exception:  # no generation config to read: the tokenizer's EOS stands alone
        fields = {}
    eos = fields.get("eos_token_id") if isinstance(fields, dict) else None
    return frozenset([eos] if isinstance(eos, int) else [i for i in eos or () if isinstance(i, int)])


def _tool_dicts(request: Any) -> list[dict[str, Any]] | None:
    """The request's tools as plain dicts (vLLM keeps them as pydantic models)."""
    tools = getattr(request, "tools", None)
    if not tools:
        return None
    return [t.model_dump() if hasattr(t, "model_dump") else dict(t) for t in tools]


# --- the unified parser -------------------------------------------------------------


def tokenizer_reasoning_tags(tokenizer: Any, open_tag: str | None, close_tag: str | None) -> tuple[str | None, str | None]:
    """The reasoning tags a parser over ``open_tag``/``close_tag`` reads on ``tokenizer``:
    Magistral's are the ones its tokenizer has (``<think>`` as text on Tekken v11, as vLLM's
    own mistral parser reads it: ``mistral.reasoning_tags``); any other preset's as given."""
    if open_tag == mistral.THINK[0] and tokenizer is not None:
        return mistral.reasoning_tags(tokenizer.get_vocab())
    return open_tag, close_tag


class DetokChatParser(_Parser):  # type: ignore[misc]
    """One request's reasoning, content and tool-call deltas from the core's channels.

    ``tags`` (a class attribute, set by :func:`parser_class`) are the markers; which of
    them are live in a request depends on the server (a reasoning parser named, auto tool
    choice on) and the request (``tools``, ``tool_choice``): tool tags the request does
    not use are content, as vLLM's own parsers leave them.
    """

    tags: TagSet = TagSet()
    always_adjust_request = True

    def __init__(self, tokenizer: Any, tools: Any = None, *args: Any, model_config: Any = None, **kwargs: Any) -> None:
        super().__init__(tokenizer, tools, *args, model_config=model_config, **kwargs)
        think, end = tokenizer_reasoning_tags(tokenizer, self.tags.reasoning_open, self.tags.reasoning_close)
        if think != self.tags.reasoning_open:
            self.tags = dataclasses.replace(self.tags, reasoning_open=think, reasoning_close=end)
        self._model_config = model_config
        self._prompt: list[int] | None = None
        self._chat: Any = None  # ChatStream or HarmonyChannels, built at the first step
        self._failed = False  # the channels raised: the rest of the reply is content

    def is_reasoning_end(self, input_ids: list[int]) -> bool:
        rp = self._reasoning_parser
        return True if rp is None else rp.is_reasoning_end(input_ids)

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        rp = self._reasoning_parser
        return 0 if rp is None else rp.count_reasoning_tokens(token_ids)

    def set_prompt_token_ids(self, prompt_token_ids: Sequence[int]) -> None:
        self._prompt = list(prompt_token_ids)

    def adjust_request(self, request: Any) -> Any:
        """vLLM's own adjustments, then, where the request has stop strings, the tags live in
        it for the detokenizer: with them it cuts stop strings outside reasoning and tool
        bodies only, as this parser's own stream does (``TaggedServingStream``)."""
        if self._reasoning_parser is not None:
            request = self._reasoning_parser.adjust_request(request)
        tags = self.tags
        if self._tool_parser is not None:
            request = self._tool_parser.adjust_request(request)
            fmt = families.tool_format(tags.tool_format)
            if fmt.keeps_special_tokens and request.tools and request.tool_choice != "none":
                request.skip_special_tokens = False
        # Only stop strings read the tags there: a request without them is left as it is.
        xargs = tag_xargs(request_tags(self, request)) if getattr(request, "stop", None) else None
        if xargs:
            request.vllm_xargs = {**(request.vllm_xargs or {}), **xargs}
        return request

    def parse_delta(
        self,
        delta_text: str,
        delta_token_ids: list[int],
        request: Any,
        prompt_token_ids: list[int] | None = None,
        *,
        finished: bool,
    ) -> Any:
        """One step: the ids vLLM passes go through the core; ``delta_text`` is not read
        (it is the same ids' text, cut the same way) unless the channels raised.

        Should they raise (a bug), nothing reaches vLLM's serving loop: the error is logged
        and, from that step on, each step's ``delta_text`` (the detokenizer's text, tags
        included) is sent as content. What the parser held back when it failed (a partial
        tag, tool-call arguments not yet sent) is not sent; nothing sent is taken back."""
        if not self._failed:
            try:
                if self._chat is None:
                    prompt = prompt_token_ids if prompt_token_ids is not None else self._prompt
                    self._chat = self._channels(request, prompt or (), streaming=True)
                fields = self._chat.message(delta_token_ids, finished)
                return new_delta(fields) if fields else None
            except Exception as exc:
                self._failed = True
                _log_failure(request, exc, "the rest of this reply is the detokenizer's text, as content")
        return _api.DeltaMessage(content=delta_text) if delta_text else None

    def parse(
        self,
        model_output: str,
        request: Any,
        enable_auto_tools: bool = False,
        model_output_token_ids: Sequence[int] = (),
    ) -> tuple[str | None, str | None, list[Any] | None]:
        """A whole output (non-streaming): the same channels, from the ids. Should they
        raise (a bug), the error is logged and the whole output is the content."""
        if not model_output_token_ids:
            return None, model_output or None, None
        try:
            return self._parse(request, model_output_token_ids)
        except Exception as exc:
            _log_failure(request, exc, "this reply is the detokenizer's text, as content")
            return None, model_output or None, None

    def _parse(
        self, request: Any, model_output_token_ids: Sequence[int]
    ) -> tuple[str | None, str | None, list[Any] | None]:
        chat = self._channels(request, self._prompt or (), streaming=False)
        out = chat.step(list(model_output_token_ids), True)
        reasoning = "".join(out.reasoning) or None
        content = "".join(out.content) or None
        calls = [_api.FunctionCall(name=name, arguments=args) for name, args in chat.complete]
        return reasoning, content, calls or None

    def _channels(self, request: Any, prompt: Sequence[int], *, streaming: bool) -> Any:
        return chat_stream(self, request, prompt, streaming=streaming)


class DetokHarmonyParser(DetokChatParser):
    """gpt-oss (``detok_gpt_oss``): harmony messages read by id (``harmony``). Not a tag
    preset of the core: harmony's headers are a grammar, not a pair of tags."""

    tags = TagSet("gpt_oss")

    def adjust_request(self, request: Any) -> Any:
        """vLLM's own harmony adjustment first: a structured-output constraint (a JSON
        schema, a regex) applies to the ``final`` message only, not to the analysis
        before it (``vllm.parser.harmony._adjust_output_format``, as ``HarmonyParser``
        calls it); then each half's own."""
        request = _framework.adjust_harmony_output_format(request)
        if self._reasoning_parser is not None:
            request = self._reasoning_parser.adjust_request(request)
        if self._tool_parser is not None:
            request = self._tool_parser.adjust_request(request)
        return request

    def _parse(
        self, request: Any, model_output_token_ids: Sequence[int]
    ) -> tuple[str | None, str | None, list[Any] | None]:
        """A whole output: bodies joined by newlines, as vLLM's harmony parser joins them."""
        chat = HarmonyChannels(self, request, self._prompt or (), streaming=False)
        chat.step(list(model_output_token_ids), True)
        reasoning, content = chat.joined()
        calls = [_api.FunctionCall(name=name, arguments=args) for name, args in chat.complete]
        return reasoning, content, calls or None

    def _channels(self, request: Any, prompt: Sequence[int], *, streaming: bool) -> Any:
        return HarmonyChannels(self, request, prompt, streaming=streaming, stream_arguments=streams_arguments(request))


def _log_failure(request: Any, exc: Exception, what_follows: str) -> None:
    logger.error(
        "detok-plugin: chat request %s: the parser raised %r; %s (please report this with the traceback)",
        getattr(request, "request_id", None),
        exc,
        what_follows,
        exc_info=exc,
    )


class DetokToolParser(_ToolParser):  # type: ignore[misc]
    """The tool-parser half of a detok name. It does no parsing itself (the unified
    :class:`DetokChatParser` does); ``supports_required_and_named = False`` keeps vLLM from
    forcing its JSON tool format for ``tool_choice="required"`` or a named tool: the model
    writes its own format and the tags find it."""

    supports_required_and_named = False
