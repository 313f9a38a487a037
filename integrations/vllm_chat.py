"""vLLM's chat API: reasoning, content and tool calls from the core's channels.

``--reasoning-parser detok_qwen3 --tool-call-parser detok_qwen3 --enable-auto-tool-choice``
(or ``detok_hermes``, ``detok_deepseek_r1``, ``detok_deepseek_v31``, ``detok_qwen3_coder``,
``detok_glm45``, ``detok_kimi_k2``, ``detok_magistral``, ``detok_gpt_oss``; tool calls only:
``detok_mistral``, ``detok_llama3``) makes vLLM's chat layer split each request's output with one
:class:`detok_plugin.DetokenizerState` with tags, fed the token ids vLLM passes:

1. a tag spread over any number of tokens or steps never leaks into ``content`` and
   switches channel in the step of its last token (one boundary for tags and stops);
2. a tool call's name is sent as soon as it is known and its ``arguments`` as they form
   (``_tool_stream.BodyReader``); a malformed body is reported as ``content`` (its raw
   text, tags included), never dropped;
3. stop strings are cut where the detokenizer cuts them: with the detokenizer plugin on,
   only outside reasoning (vllm-project/vllm#53066, ``_reasoning_stream``); without it,
   anywhere, as stock vLLM's detokenizer does;
4. nothing the channels raise reaches vLLM's serving loop (which would end the reply with an
   error event): the failure is logged and the rest of the reply is the detokenizer's text,
   as content (``DetokChatParser.parse_delta``).

The common id costs a lookup, not a call into the core: while the stream is at rest in a
mode, an id whose text holds no first character of that mode's tags or stops is what the
core would release whole (``_reasoning_stream.RestTexts``, in ``_chat_channels.Channels.message``).

How it plugs in. vLLM 0.32/0.33 compose one unified ``vllm.parser.Parser`` per server from
the two names (``ParserManager._compose_parser``), with no registry for unified parsers.
:func:`register_chat_parsers` therefore (a) registers per preset a reasoning parser and a
tool parser under ``detok_<preset>`` in vLLM's own managers, so the names pass vLLM's
argument checks and the engine core's structured-output gate finds a real reasoning
parser (vLLM's ``BaseThinkingReasoningParser`` over the preset's tags), and (b) wraps
``_compose_parser`` so that names beginning with ``detok`` give :class:`DetokChatParser`;
every other name goes to vLLM's own composition, unchanged.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Sequence
from typing import Any

from detok_plugin.integrations._reasoning_stream import REASONING_TAGS_KEY, TOOL_TAGS_KEY

from detok_plugin import TagSet

try:
    from vllm.entrypoints.generate.base.protocol import DeltaMessage, FunctionCall
    from vllm.parser.abstract_parser import Parser
    from vllm.parser.parser_manager import ParserManager
    from vllm.reasoning.abs_reasoning_parsers import ReasoningParserManager
    from vllm.reasoning.basic_parsers import BaseThinkingReasoningParser
    from vllm.reasoning.gptoss_reasoning_parser import GptOssReasoningParser
    from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(f"detok_plugin.integrations.vllm_chat needs vLLM 0.32 or 0.33: pip install detok-plugin[vllm] ({exc})") from exc

from detok_plugin.integrations._chat_channels import Channels, live_tags
from detok_plugin.integrations._harmony import HarmonyChannels

__all__ = ["HARMONY", "PREFIX", "DetokChatParser", "DetokHarmonyParser", "chat_problems", "parser_class", "register_chat_parsers"]

logger = logging.getLogger("vllm.detok_plugin")

#: Every parser name this module registers begins with it.
PREFIX = "detok_"

#: gpt-oss's parser name: harmony, read by ``_harmony.HarmonyChannels`` (not a core preset).
HARMONY = PREFIX + "gpt_oss"

#: Tool formats whose body markers are special tokens of the family's tokenizer (Kimi K2's
#: ``<|tool_call_begin|>`` ..., Mistral's ``[TOOL_CALLS]`` and v11's ``[ARGS]``): a request
#: with tools keeps special tokens in its text, as vLLM's own ``kimi_k2`` and ``mistral``
#: parsers set it (``mistral`` for any Hugging Face tokenizer), or the body would lose its
#: markers and the reply's text would differ from what vLLM's parser reads.
KEEP_SPECIAL_TOKENS = frozenset({"kimi_k2", "mistral"})


# --- the unified parser -------------------------------------------------------------


class DetokChatParser(Parser):
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
        self._prompt: list[int] | None = None
        self._chat: Channels | None = None
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
        """vLLM's own adjustments, then the tags live in this request for the detokenizer:
        with them it cuts stop strings outside reasoning and tool bodies only, as this
        parser's own stream does (``_reasoning_stream``)."""
        if self._reasoning_parser is not None:
            request = self._reasoning_parser.adjust_request(request)
        tags = self.tags
        if self._tool_parser is not None:
            request = self._tool_parser.adjust_request(request)
            if tags.tool_format in KEEP_SPECIAL_TOKENS and request.tools and request.tool_choice != "none":
                request.skip_special_tokens = False
        live = live_tags(self, request)
        xargs: dict[str, list[str]] = {}
        if live is not None and live.reasoning_open and live.reasoning_close:
            xargs[REASONING_TAGS_KEY] = [live.reasoning_open, live.reasoning_close]
        if live is not None and live.tool_open:
            xargs[TOOL_TAGS_KEY] = [live.tool_open, live.tool_close or ""]
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
    ) -> DeltaMessage | None:
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
                message: DeltaMessage | None = self._chat.message(delta_token_ids, finished, request)
                return message
            except Exception as exc:
                self._failed = True
                _log_failure(request, exc, "the rest of this reply is the detokenizer's text, as content")
        return DeltaMessage(content=delta_text) if delta_text else None

    def parse(
        self,
        model_output: str,
        request: Any,
        enable_auto_tools: bool = False,
        model_output_token_ids: Sequence[int] = (),
    ) -> tuple[str | None, str | None, list[FunctionCall] | None]:
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
    ) -> tuple[str | None, str | None, list[FunctionCall] | None]:
        chat = self._channels(request, self._prompt or (), streaming=False)
        out = chat.step(list(model_output_token_ids), True)
        reasoning = "".join(out.reasoning) or None
        content = "".join(out.content) or None
        calls = [FunctionCall(name=name, arguments=args) for name, args in chat.complete]
        return reasoning, content, calls or None

    def _channels(self, request: Any, prompt: Sequence[int], *, streaming: bool) -> Any:
        return Channels(self, request, prompt, streaming=streaming)


class DetokHarmonyParser(DetokChatParser):
    """gpt-oss (``detok_gpt_oss``): harmony messages read by id (``_harmony``). Not a tag
    preset of the core: harmony's headers are a grammar, not a pair of tags."""

    tags = TagSet("gpt_oss")

    def adjust_request(self, request: Any) -> Any:
        """vLLM's own harmony adjustment first: a structured-output constraint (a JSON
        schema, a regex) applies to the ``final`` message only, not to the analysis
        before it (``vllm.parser.harmony._adjust_output_format``, as ``HarmonyParser``
        calls it); then each half's own."""
        from vllm.parser.harmony import _adjust_output_format

        request = _adjust_output_format(request)
        if self._reasoning_parser is not None:
            request = self._reasoning_parser.adjust_request(request)
        if self._tool_parser is not None:
            request = self._tool_parser.adjust_request(request)
        return request

    def _parse(
        self, request: Any, model_output_token_ids: Sequence[int]
    ) -> tuple[str | None, str | None, list[FunctionCall] | None]:
        """A whole output: bodies joined by newlines, as vLLM's harmony parser joins them."""
        chat = HarmonyChannels(self, request, self._prompt or (), streaming=False)
        chat.step(list(model_output_token_ids), True)
        reasoning, content = chat.joined()
        calls = [FunctionCall(name=name, arguments=args) for name, args in chat.complete]
        return reasoning, content, calls or None

    def _channels(self, request: Any, prompt: Sequence[int], *, streaming: bool) -> Any:
        return HarmonyChannels(self, request, prompt, streaming=streaming)


def _log_failure(request: Any, exc: Exception, what_follows: str) -> None:
    logger.error(
        "detok-plugin: chat request %s: the parser raised %r; %s (please report this with the traceback)",
        getattr(request, "request_id", None),
        exc,
        what_follows,
        exc_info=exc,
    )


# --- parser classes per preset, and registration ----------------------------------------


@functools.cache
def _reasoning_class(open_tag: str, close_tag: str) -> type[BaseThinkingReasoningParser]:
    """vLLM's own thinking-token reasoning parser over these tags: what vLLM's engine core
    asks (``is_reasoning_end``) to gate structured outputs."""
    return type(
        "DetokReasoningParser",
        (BaseThinkingReasoningParser,),
        {"start_token": open_tag, "end_token": close_tag, "__module__": __name__},
    )


class DetokToolParser(ToolParser):
    """The tool-parser half of a detok name. It does no parsing itself (the unified
    :class:`DetokChatParser` does); ``supports_required_and_named = False`` keeps vLLM from
    forcing its JSON tool format for ``tool_choice="required"`` or a named tool: the model
    writes its own format and the tags find it."""

    supports_required_and_named = False


@functools.cache
def parser_class(tags: TagSet, reasoning: bool, tools: bool) -> type[DetokChatParser]:
    """The unified parser for ``tags``, with a reasoning half and/or a tool half."""
    return type(
        f"DetokChatParser_{tags.name}",
        (DetokChatParser,),
        {
            "tags": tags,
            "reasoning_parser_cls": _reasoning_class(tags.reasoning_open, tags.reasoning_close)
            if reasoning and tags.reasoning_open and tags.reasoning_close
            else None,
            "tool_parser_cls": DetokToolParser if tools else None,
            "__module__": __name__,
        },
    )


def _preset(name: str | None) -> TagSet | None:
    if not name or not name.startswith(PREFIX):
        return None
    return TagSet.preset(name[len(PREFIX) :])


def _compose(cls: Any, bound: inspect.BoundArguments) -> Any:
    """ParserManager._compose_parser for detok names; None if neither name is ours."""
    args = bound.arguments
    r_name, t_name = args.get("reasoning_parser_name"), args.get("tool_parser_name")
    if HARMONY in (r_name, t_name):
        return _harmony_compose(r_name, t_name, bool(args.get("enable_auto_tools")))
    r_tags, t_tags = _preset(r_name), _preset(t_name)
    if r_tags is None and t_tags is None:
        return None
    if (r_name and r_tags is None) or (t_name and t_tags is None):
        raise TypeError(
            f"--reasoning-parser {r_name} and --tool-call-parser {t_name}: a detok parser pairs only "
            f"with another detok parser (e.g. --reasoning-parser detok_qwen3 --tool-call-parser detok_qwen3)"
        )
    tools = bool(args.get("enable_auto_tools")) and t_tags is not None
    reasoning = r_tags is not None
    if not tools and not reasoning:
        return None
    r, t = r_tags or t_tags, t_tags or r_tags
    assert r is not None and t is not None
    tags = TagSet(
        r.name if r == t else f"{r.name}+{t.name}",
        r.reasoning_open, r.reasoning_close, t.tool_open, t.tool_close, t.tool_format,
    )
    return parser_class(tags, reasoning, tools)


def _harmony_compose(r_name: str | None, t_name: str | None, auto_tools: bool) -> type[DetokChatParser] | None:
    for name in (r_name, t_name):
        if name and name != HARMONY:
            raise TypeError(f"{HARMONY} pairs only with itself (--reasoning-parser {HARMONY} --tool-call-parser {HARMONY})")
    return _harmony_class(r_name == HARMONY, auto_tools and t_name == HARMONY)


@functools.cache
def _harmony_class(reasoning: bool, tools: bool) -> type[DetokChatParser]:
    """The harmony parser with vLLM's own ``GptOssReasoningParser`` as its reasoning half
    (what the engine core asks), and/or the tool half."""
    return type(
        "DetokHarmonyParser_gpt_oss",
        (DetokHarmonyParser,),
        {
            "reasoning_parser_cls": GptOssReasoningParser if reasoning else None,
            "tool_parser_cls": DetokToolParser if tools else None,
            "__module__": __name__,
        },
    )


class _ComposeHookState:
    """vLLM's ``ParserManager._compose_parser`` while ours wraps it (one per process).
    Instance attributes on purpose: a ``classmethod`` stored on a class would bind."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stock: Any = None


_ComposeHook = _ComposeHookState()


def _wrapped_compose(cls: Any, *args: Any, **kwargs: Any) -> Any:
    stock = _ComposeHook.stock.__func__
    bound = inspect.signature(stock).bind(cls, *args, **kwargs)
    ours = _compose(cls, bound)
    return ours if ours is not None else stock(cls, *args, **kwargs)


def chat_problems() -> list[str]:
    """How the installed vLLM differs from what the chat parsers need; [] if nothing."""
    problems = []
    compose = ParserManager.__dict__.get("_compose_parser")
    if not isinstance(compose, classmethod):
        problems.append("vllm.parser.ParserManager._compose_parser is not a classmethod")
    elif compose.__func__ is not _wrapped_compose:
        params = list(inspect.signature(compose.__func__).parameters)
        for name in ("tool_parser_name", "reasoning_parser_name", "enable_auto_tools"):
            if name not in params:
                problems.append(f"ParserManager._compose_parser takes no {name}")
    wanted = ("parse_delta", "parse", "is_reasoning_end", "adjust_request", "set_prompt_token_ids")
    problems += [f"vllm.parser.Parser has no {m}" for m in wanted if not hasattr(Parser, m)]
    return problems


def register_chat_parsers() -> bool:
    """Register ``detok_<preset>`` parsers and wrap ``_compose_parser``; safe to repeat.
    Returns False (and logs why) when the installed vLLM does not fit."""
    problems = chat_problems()
    if problems:
        logger.error("detok-plugin: chat parsers NOT registered: %s", "; ".join(problems))
        return False
    for name in TagSet.presets():
        tags = TagSet.preset(name)
        if tags.tool_open:
            ToolParserManager.register_module(PREFIX + name, force=True, module=DetokToolParser)
        if tags.reasoning_open and tags.reasoning_close:
            cls = _reasoning_class(tags.reasoning_open, tags.reasoning_close)
            ReasoningParserManager.register_module(PREFIX + name, force=True, module=cls)
    ToolParserManager.register_module(HARMONY, force=True, module=DetokToolParser)
    ReasoningParserManager.register_module(HARMONY, force=True, module=GptOssReasoningParser)
    with _ComposeHook.lock:
        current = ParserManager.__dict__["_compose_parser"]
        if current.__func__ is not _wrapped_compose:
            _ComposeHook.stock = current
            setattr(ParserManager, "_compose_parser", classmethod(_wrapped_compose))  # noqa: B010
    return True


def unregister_chat_parsers() -> None:
    """Put vLLM's ``_compose_parser`` back (the registered names stay, inert)."""
    with _ComposeHook.lock:
        if _ComposeHook.stock is not None:
            setattr(ParserManager, "_compose_parser", _ComposeHook.stock)  # noqa: B010
            _ComposeHook.stock = None
