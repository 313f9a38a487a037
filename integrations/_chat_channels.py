"""One chat request's channels: the core's stream with tags, read into OpenAI deltas.

:class:`Channels` holds the request's :class:`detok_plugin.DetokenizerState` (tags live in
this request, its stop options) and turns each ``Delta`` into the pieces of vLLM's
``DeltaMessage``: ``reasoning``, ``content`` and ``tool_calls``, whose names and arguments
:class:`~detok_plugin.integrations._tool_stream.BodyReader` reads from the tool channel's
text as it streams. Used by ``vllm_chat.DetokChatParser`` (one per request and choice).

The stop rule follows the detokenizer in this process: when it is the plugin's, it cuts
stop strings outside reasoning (``_reasoning_stream``) and so does this stream; when it is
vLLM's stock one, stops cut anywhere, and so here too (``stop_in_reasoning=True``).
"""

from __future__ import annotations

import functools
import logging
import random
import string
from collections.abc import Sequence
from typing import Any, NamedTuple

from detok_plugin.integrations._reasoning_stream import RestTexts
from detok_plugin.integrations._tool_stream import BodyReader, Event, reader_for
from detok_plugin.integrations._xml_stream import XmlBodyReader
from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.renderers.chat_utils import make_tool_call_id

from detok_plugin import DetokenizerState, TagSet, TokenIdError, parse_tool_body
from detok_plugin._delta import CONTENT, REASONING, TOOL

__all__ = ["Channels", "Parts", "live_tags", "new_delta"]

logger = logging.getLogger("vllm.detok_plugin")

#: ``DeltaMessage(**fields)``: the model's own validation (its validators, vLLM's
#: ``__log_extra_fields__`` included), called as pydantic's ``model_validate`` calls it,
#: without ``BaseModel.__init__``'s Python frame: the same object, a fifth cheaper
#: (docs/benchmarks.md, "vLLM's chat layer", session 18).
new_delta = DeltaMessage.__pydantic_validator__.validate_python


class Parts:
    """One delta's pieces; tool-call pieces of one call merge into one DeltaToolCall.

    Tool calls are kept as the dicts vLLM's ``DeltaToolCall`` is validated from, with the
    fields vLLM's own parsers set (``hermes``): a call's first delta sets ``id``, ``type``,
    ``index`` and the function's ``name``; a later one ``index`` and the function's
    ``arguments``. vLLM streams each chunk with ``exclude_unset``, so a client sees the same
    JSON. ``DeltaMessage`` builds the models in one validation, a third cheaper than
    building each model first."""

    __slots__ = ("reasoning", "content", "tools")

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}

    def tool(self, index: int, *, id: str | None = None, name: str | None = None, args: str = "") -> None:
        call = self.tools.get(index)
        if call is None:
            call = self.tools[index] = {"index": index, "function": {}}
            if name is not None:
                call.update(id=id, type="function")
                call["function"]["name"] = name
        if args:
            fn = call["function"]
            fn["arguments"] = fn.get("arguments", "") + args

    def message(self, request: Any) -> DeltaMessage | None:
        fields: dict[str, Any] = {}
        if self.reasoning and getattr(request, "include_reasoning", True):
            fields["reasoning"] = "".join(self.reasoning)
        if self.content:
            fields["content"] = "".join(self.content)
        if self.tools:
            fields["tool_calls"] = list(self.tools.values())
        return new_delta(fields) if fields else None


class Channels:
    """The core's stream for one request, and the tool calls read from its tool channel."""

    def __init__(self, parser: Any, request: Any, prompt: Sequence[int], *, streaming: bool = True) -> None:
        tags = live_tags(parser, request)
        self.tags: TagSet = tags if tags is not None else TagSet()  # no tags: no tool calls come
        self.parser = parser
        self.streaming = streaming
        skip = bool(getattr(request, "skip_special_tokens", True))
        self.state = DetokenizerState.from_tokenizer(
            parser.model_tokenizer,
            prompt_ids=prompt,
            skip_special_tokens=skip,
            spaces_between_special_tokens=getattr(request, "spaces_between_special_tokens", True),
            stop=_stops(request),
            stop_token_ids=(),
            eos_token_ids=(),
            include_stop_str_in_output=bool(getattr(request, "include_stop_str_in_output", False)),
            min_tokens=getattr(request, "min_tokens", 0) or 0,
            tags=tags,
            reasoning="separate",
            stop_in_reasoning=not _detokenizer_is_ours(),
            keep_log=False,
        )
        self.request = request
        self.include_stop = bool(getattr(request, "include_stop_str_in_output", False))
        self.sent = 0  # tool calls whose header went out
        self.base = 0  # OpenAI index of the current body's first call
        self.body: list[str] = []
        self.typed: list[tuple[str, str]] | None = None  # the current body's calls, typed by the schema
        self.reader: BodyReader | XmlBodyReader | None = None
        self.body_index = -1  # the core's index of the current body's first call
        self.body_open = False
        self.complete: list[tuple[str, str]] = []
        # The common id's shortcut (RestTexts): while the stream is at rest in content or
        # reasoning, an id whose text leaves whole is one lookup and one DeltaMessage.
        self._rests = RestTexts.of(parser.model_tokenizer, self.state, skip) if streaming else None
        self._slow = self._rests.slow_ids if self._rests is not None else frozenset()
        self._ids = self.state.token_ids
        self._rest: dict[int, str | None] | None = None
        self._channel = CONTENT  # where the shortcut's text goes: CONTENT, REASONING or TOOL
        self._caught_up()

    def message(self, ids: Sequence[int], finished: bool, request: Any) -> DeltaMessage | None:
        """``step(ids, finished).message(request)``; a live step of one id that the stream
        takes at rest is the lookup alone (``RestTexts``: what the core would do), and any
        other live step of one id is ``_one``."""
        rest = self._rest
        if finished or len(ids) != 1 or (tid := ids[0]).__class__ is not int:
            return self.step(ids, finished).message(request)
        if rest is not None:
            text = rest.get(tid)
            if text is None and tid not in rest:  # an id not seen at rest in this mode yet
                text = self._rests.learn(self.state._mode, tid)  # type: ignore[union-attr]  # noqa: SLF001
            if text is not None and tid not in self._slow:
                self._ids.append(tid)
                if not text:
                    return None
                channel = self._channel
                if channel == CONTENT:
                    return new_delta({"content": text})
                if channel == REASONING:
                    return new_delta({"reasoning": text}) if getattr(request, "include_reasoning", True) else None
                return self._rest_tool(text, request)
        return self._one(ids, request)

    def _one(self, ids: Sequence[int], request: Any) -> DeltaMessage | None:
        """A live step of one id off the shortcut: what the core released; content alone
        (or nothing, as for most pieces of a split character) is one DeltaMessage."""
        if self.state.finished:
            return None
        delta = self._push(ids)
        if not (delta.reasoning or delta.tool_calls):
            self._caught_up()
            return new_delta({"content": delta.text}) if delta.text else None
        parts = Parts()
        self._take(delta, parts, at_end=False)
        self._caught_up()
        return parts.message(request)

    def _rest_tool(self, text: str, request: Any) -> DeltaMessage | None:
        """A shortcut id's text in a tool body (streaming): most often a piece of one
        call's arguments, one DeltaToolCall."""
        index = self.state._rest_tool_text(text)  # noqa: SLF001
        if not self.body_open:
            self._open_body(index)
        self.body.append(text)
        events = self.reader.feed(text)  # type: ignore[union-attr]  # an open body has its reader
        if len(events) == 1 and events[0][1] is None:
            k, _, args = events[0]
            return new_delta({"tool_calls": [{"index": self.base + k, "function": {"arguments": args}}]})
        parts = Parts()
        self._send(events, parts)
        return parts.message(request)

    def step(self, ids: Sequence[int], finished: bool) -> Parts:
        parts = Parts()
        if finished and ids and not self.include_stop and ids[-1] in _stop_ids(self.parser.model_tokenizer, self.request):
            ids = ids[:-1]  # the stop token or EOS that ended it: no text, as the detokenizer
        if ids and not self.state.finished:
            self._take(self._push(ids), parts, at_end=False)
        if finished and not self.state.finished:
            self._take(self.state.finish(), parts, at_end=True)
        self._caught_up()
        return parts

    def _caught_up(self) -> None:
        """After a call into the core: whether the shortcut applies now (at rest in a mode
        whose text goes to content, reasoning or a tool body), and where its text goes."""
        self._rest = None
        if self._rests is None:
            return
        state = self.state
        mode = state._mode_at_rest()  # noqa: SLF001
        if mode < 0:
            return
        channel = state._channel()  # noqa: SLF001
        if channel in (CONTENT, REASONING, TOOL):
            self._rest = self._rests.by_mode[mode]
            self._channel = channel

    def _push(self, ids: Sequence[int]) -> Any:
        try:
            return self.state.push(ids[0] if len(ids) == 1 else list(ids))
        except TokenIdError:
            pass
        # An id the tokenizer does not know (a padded vocabulary): skipped, as the decode does.
        text: list[str] = []
        reasoning: list[str] = []
        calls: list[Any] = []
        for tid in ids:
            if self.state.finished:
                break
            try:
                d = self.state.push(tid)
            except TokenIdError as exc:
                logger.warning("detok-plugin: %s; the chat parser skips it", exc)
                continue
            text.append(d.text)
            reasoning.append(d.reasoning)
            calls.extend(d.tool_calls)
        return _Merged("".join(text), "".join(reasoning), tuple(calls))

    def _take(self, delta: Any, parts: Parts, *, at_end: bool) -> None:
        if delta.reasoning:
            parts.reasoning.append(delta.reasoning)
        if delta.text:
            parts.content.append(delta.text)
        closed = False
        for call in delta.tool_calls:
            if call.complete:
                self._complete(call, parts, at_end)
                closed = True
            elif call.text:
                if closed:  # a body closed in this delta, and the next one began
                    self.body_open = closed = False
                self._body_text(call.index, call.text, parts)
        if closed:
            self.body_open = False

    def _body_text(self, index: int, text: str, parts: Parts) -> None:
        if not self.body_open:
            self._open_body(index)
        self.body.append(text)
        assert self.reader is not None
        if not self.streaming:
            return
        self._send(self.reader.feed(text), parts)

    def _send(self, events: list[Event], parts: Parts) -> None:
        """A body reader's events as the delta's tool-call pieces."""
        for k, name, args in events:
            if name is not None:
                parts.tool(self.base + k, id=self._new_id(name), name=name)
                self.sent += 1
            if args:
                parts.tool(self.base + k, args=args)

    def _open_body(self, index: int) -> None:
        self.body_index = index
        self.body_open = True
        self.base = self.sent
        self.body = []
        self.typed = None
        self.reader = reader_for(self.tags.tool_format, self.tools)

    def _complete(self, call: Any, parts: Parts, at_end: bool) -> None:
        if not self.body_open:
            self._open_body(call.index)  # a body with no text, closed at once
        reader = self.reader
        assert reader is not None
        if call.error is not None:
            tags = self.tags
            closed = "" if at_end and tags.tool_close is not None else (tags.tool_close or "")
            raw = (tags.tool_open or "") + "".join(self.body) + closed
            logger.warning("detok-plugin: %s; sent as content", call.error)
            parts.content.append(raw)
            return
        k = call.index - self.body_index  # which call of this body
        call = self._typed(call, k)
        self.complete.append((call.name, call.arguments))
        if not self.streaming:
            return
        if k >= reader.calls:  # its name never went out: all of it now
            parts.tool(self.base + k, id=self._new_id(call.name), name=call.name, args=call.arguments)
            self.sent = max(self.sent, self.base + k + 1)
        elif not reader.done[k]:
            sent = reader.args[k]
            if call.arguments.startswith(sent):
                parts.tool(self.base + k, args=call.arguments[len(sent) :])
            else:  # a string value streamed raw: cannot happen by BodyReader's rule 1
                logger.warning("detok-plugin: tool call %d's arguments streamed as %r, parsed as %r", k, sent, call.arguments)

    def _typed(self, call: Any, k: int) -> Any:
        """The call with its values typed by the request's schema (XML formats): the core
        parsed the body without the request, so every value there is a string."""
        if self.tags.tool_format not in _SCHEMA_TYPED:
            return call
        if self.typed is None:
            self.typed = parse_tool_body("".join(self.body).strip(), self.tags.tool_format, tools=self.tools)
        name, arguments = self.typed[k]
        return _Call(name, arguments)

    @functools.cached_property
    def tools(self) -> list[dict[str, Any]] | None:
        """The request's tools as plain dicts where the format types values by their schema
        (XML formats), else None: made once, when a body first needs them (a request's
        schemas may be large, and most formats never read them)."""
        return _tool_dicts(self.request) if self.tags.tool_format in _SCHEMA_TYPED else None

    def _new_id(self, name: str) -> str:
        state = self.parser._stream_state  # noqa: SLF001 (the Parser base's own state)
        if self.tags.tool_format == "mistral":
            tool_id = mistral_tool_id()
        else:
            tool_id = make_tool_call_id(id_type=state.tool_call_id_type, func_name=name, idx=state.history_tool_call_cnt)
        state.history_tool_call_cnt += 1
        return tool_id  # type: ignore[no-any-return]


def mistral_tool_id() -> str:
    """A Mistral tool call id: 9 random letters and digits, as vLLM's ``mistral`` parser
    makes them (``MistralToolCall``); Mistral's chat templates refuse any other id when the
    conversation comes back with the call in it."""
    return "".join(random.choices(_ALPHANUMERIC, k=9))


_ALPHANUMERIC = string.ascii_letters + string.digits


_SCHEMA_TYPED = ("qwen3_xml", "glm45")


class _Call(NamedTuple):
    """A complete call's name and arguments, typed by the request's schema."""

    name: str
    arguments: str


def _tool_dicts(request: Any) -> list[dict[str, Any]] | None:
    """The request's tools as plain dicts (vLLM keeps them as pydantic models)."""
    tools = getattr(request, "tools", None)
    if not tools:
        return None
    return [t.model_dump() if hasattr(t, "model_dump") else dict(t) for t in tools]


class _Merged:
    """A Delta's three channels, for ids pushed one by one."""

    __slots__ = ("text", "reasoning", "tool_calls")

    def __init__(self, text: str, reasoning: str, tool_calls: tuple[Any, ...]) -> None:
        self.text, self.reasoning, self.tool_calls = text, reasoning, tool_calls


def live_tags(parser: Any, request: Any) -> TagSet | None:
    """The tags live in this request: reasoning tags with a reasoning parser, tool tags
    with a tool parser and a request whose tools are not switched off."""
    tags = parser.tags
    reasoning = parser.reasoning_parser is not None and tags.reasoning_open is not None
    tools = (
        parser.tool_parser is not None
        and tags.tool_open is not None
        and bool(getattr(request, "tools", None))
        and getattr(request, "tool_choice", None) != "none"
    )
    return _live(tags, reasoning, tools)


@functools.cache
def _live(tags: TagSet, reasoning: bool, tools: bool) -> TagSet | None:
    """``tags`` with the halves not live left out (one TagSet per combination)."""
    if not reasoning and not tools:
        return None
    return TagSet(
        tags.name,
        tags.reasoning_open if reasoning else None,
        tags.reasoning_close if reasoning else None,
        tags.tool_open if tools else None,
        tags.tool_close if tools else None,
        tags.tool_format,
    )


def _stops(request: Any) -> tuple[str, ...]:
    stop = getattr(request, "stop", None)
    return (stop,) if isinstance(stop, str) else tuple(stop or ())


def _stop_ids(tokenizer: Any, request: Any) -> frozenset[int]:
    """The ids that end a request without text: its stop token ids and the tokenizer's EOS
    (read at the finish only: a Hugging Face tokenizer's ``eos_token_id`` costs about a
    microsecond)."""
    ids = set(getattr(request, "stop_token_ids", None) or ())
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    return frozenset(ids)


def _detokenizer_is_ours() -> bool:
    """Whether this process's vLLM detokenizer is the plugin's (which reads the tags)."""
    from detok_plugin.integrations.vllm import is_registered

    return bool(is_registered())
