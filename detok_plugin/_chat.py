"""``ChatStream``: one chat reply's reasoning, content and tool calls, as OpenAI deltas.

:class:`ChatStream` holds the request's :class:`DetokenizerState` (its live tags, its stop
options, ``reasoning="separate"``) and turns each ``Delta`` into the fields of an OpenAI
chat delta: ``reasoning``, ``content`` and ``tool_calls``, whose names and arguments the
family's body reader (``detok_plugin.families``) reads from the tool channel's text as it
streams. It imports no framework: a server wraps the fields in its own message type (vLLM's
``DeltaMessage``, ``integrations/vllm/chat.py``).

Tool calls are the dicts OpenAI's ``tool_calls`` delta items are, with the fields vLLM's own
parsers set (``hermes``): a call's first delta sets ``id``, ``type``, ``index`` and the
function's ``name``; a later one ``index`` and the function's ``arguments``.

A call goes to the client only once the model has finished it: at its body's close tag, or
at the end of the reply for a format whose body runs to the end (then the whole body must
parse). A client may run a call it receives, so a call the model never finished (the reply
cut by ``max_tokens`` inside it) is never sent, streamed or not: its body is dropped (logged),
and the calls finished before it stay. A body that closed but does not parse is sent as
content (its raw text, tags included, before the content that followed its close tag).
``stream_arguments=True`` sends each call's name and its ``arguments`` as they form instead
(the family's body reader), as vLLM's own parsers do; the risk is the client's: a call cut
short has then had its name and part of its arguments sent, and is not taken back.
Where a parser reads the reply (live tags), whitespace at the edges of a reasoning or content
segment is the template's markup, not text (``detok_plugin._edges``): leading whitespace is
dropped, trailing whitespace waits for the segment's next character (then it leaves with it)
or markup or the end (then it is dropped). A tool call is no edge of content: the content on
both sides of it joins, so whitespace before a last call or between calls is dropped, and
whitespace between text, a call and more text is kept.

The common id costs a lookup, not a call into the core: while the stream is at rest in a
mode, an id whose text holds no first character of that mode's tags or stops is what the
core would release whole (:class:`~detok_plugin._tagged.RestTexts`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import families
from ._chat_parts import Call, ChatParts, Fields, push_skipping_unknown
from ._delta import CONTENT, REASONING, TOOL
from ._edges import Edge
from ._errors import TokenIdError
from ._state import DetokenizerState
from ._tagged import RestTexts
from ._tags import TagSet, live_tags

__all__ = ["ChatParts", "ChatStream", "Fields", "live_tags"]

logger = logging.getLogger("detok_plugin")


class ChatStream:
    """One chat reply: the core's stream with the request's live tags, and the tool calls
    read from its tool channel.

    ``message(ids, finished)`` takes one step's ids and returns its delta's :data:`Fields`
    (None when the step sends nothing); ``step(ids, finished)`` returns the step's
    :class:`ChatParts`, and after the last step ``complete`` lists every call's ``(name,
    arguments)`` (for a reply returned whole). The request's parts:

    * ``tags``: the live tags (:func:`live_tags`), or None (then no channel but content);
    * the content options: ``prompt_ids``, the skip flags, ``stop``,
      ``include_stop_str_in_output``, ``min_tokens``, and ``stop_in_reasoning`` (whether a
      stop string inside reasoning ends the reply, as a detokenizer that knows no tags does);
    * ``end_ids()``: the ids that end a reply without text (stop token ids, EOS), read at the
      finish only; ``tools()``: the request's tool schemas as dicts, read only by a format
      typed by schema, when a body first needs them; ``new_call_id(name, fmt)``: a new
      tool-call id; ``include_reasoning``; ``streaming`` (False: a reply returned whole, no
      tool-call deltas).
    """

    def __init__(
        self,
        tokenizer: Any,
        tags: TagSet | None,
        *,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        stop: Iterable[str] = (),
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
        stop_in_reasoning: bool = False,
        end_ids: Callable[[], frozenset[int]] = frozenset,
        tools: Callable[[], list[dict[str, Any]] | None] = lambda: None,
        new_call_id: Callable[[str, families.ToolFormat], str],
        include_reasoning: bool = True,
        streaming: bool = True,
        stream_arguments: bool = False,
        log: logging.Logger = logger,
    ) -> None:
        self.tags: TagSet = tags if tags is not None else TagSet()  # no tags: no tool calls come
        self.format = families.tool_format(self.tags.tool_format)
        self.streaming = streaming
        self.stream_arguments = streaming and stream_arguments
        self.state = DetokenizerState.from_tokenizer(
            tokenizer,
            prompt_ids=prompt_ids,
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
            stop=tuple(stop),
            stop_token_ids=(),
            eos_token_ids=(),
            include_stop_str_in_output=include_stop_str_in_output,
            min_tokens=min_tokens,
            tags=tags,
            reasoning="separate",
            stop_in_reasoning=stop_in_reasoning,
            keep_log=False,
        )
        self.include_stop = include_stop_str_in_output
        self.include_reasoning = include_reasoning
        self._end_ids = end_ids
        self._tools = tools
        self._new_call_id = new_call_id
        self._log = log
        self.sent = 0  # tool calls whose header went out
        self.base = 0  # OpenAI index of the current body's first call
        self.body: list[str] = []
        self.typed: list[tuple[str, str]] | None = None  # the current body's calls, typed by the schema
        self.reader: families.BodyReader | None = None
        self.body_index = -1  # the core's index of the current body's first call
        self.body_open = False
        self.complete: list[tuple[str, str]] = []
        # The segment edges (``_edges``): content's and reasoning's, where tags are live.
        self._edges = (Edge(), Edge()) if tags is not None else None
        self._edge: Edge | None = None  # the shortcut channel's edge
        # The common id's shortcut (RestTexts): while the stream is at rest in content or
        # reasoning, an id whose text leaves whole is one lookup and one delta.
        self._rests = RestTexts.of(tokenizer, self.state, skip_special_tokens)
        self._slow = self._rests.slow_ids if self._rests is not None else frozenset()
        self._ids = self.state.token_ids
        self._rest: dict[int, str | None] | None = None
        self._channel = CONTENT  # where the shortcut's text goes: CONTENT, REASONING or TOOL
        self._caught_up()

    def message(self, ids: Sequence[int], finished: bool) -> Fields | None:
        """``step(ids, finished).fields()``; a live step of one id that the stream
        takes at rest is the lookup alone (``RestTexts``: what the core would do), and any
        other live step of one id is ``_one``."""
        rest = self._rest
        if finished or len(ids) != 1 or (tid := ids[0]).__class__ is not int:
            return self.step(ids, finished).fields(self.include_reasoning)
        if rest is not None:
            text = rest.get(tid)
            if text is None and tid not in rest:  # an id not seen at rest in this mode yet
                text = self._rests.learn(self.state._mode, tid)  # type: ignore[union-attr]
            if text is not None and tid not in self._slow:
                self._ids.append(tid)
                if not text:
                    return None
                channel = self._channel
                if channel == TOOL:
                    return self._rest_tool(text)
                edge = self._edge
                if edge is not None and not edge.passes(text):
                    return self._at_edge(edge, channel, text)
                if channel == CONTENT:
                    return {"content": text}
                return {"reasoning": text} if self.include_reasoning else None
        return self._one(ids)

    def _at_edge(self, edge: Edge, channel: int, text: str) -> Fields | None:
        """A shortcut id's text where its segment's edge applies (``_edges``)."""
        text = edge.take(text)
        if not text:
            return None
        if channel == CONTENT:
            return {"content": text}
        return {"reasoning": text} if self.include_reasoning else None

    def _one(self, ids: Sequence[int]) -> Fields | None:
        """A live step of one id off the shortcut: what the core released; content alone
        (or nothing, as for most pieces of a split character) is one field."""
        state = self.state
        if state.finished:
            return None
        before = state._mode
        delta = self._push(ids)
        if not (delta.reasoning or delta.tool_calls) and before == CONTENT == state._mode:
            text = delta.text
            if text and self._edges is not None:
                text = self._edges[CONTENT].take(text)
            self._caught_up()
            return {"content": text} if text else None
        parts = ChatParts()
        self._take(delta, parts, at_end=False, before=before)
        self._caught_up()
        return parts.fields(self.include_reasoning)

    def _rest_tool(self, text: str) -> Fields | None:
        """A shortcut id's text in a tool body (streaming): most often a piece of one
        call's arguments, one tool-call dict."""
        index = self.state._rest_tool_text(text)
        if not self.body_open:
            self._open_body(index)
        self.body.append(text)
        if not self.stream_arguments:
            return None  # the call goes out when the model has finished it
        events = self.reader.feed(text)  # type: ignore[union-attr]  # an open body has its reader
        if len(events) == 1 and events[0][1] is None:
            k, _, args = events[0]
            return {"tool_calls": [{"index": self.base + k, "function": {"arguments": args}}]}
        parts = ChatParts()
        self._send(events, parts)
        return parts.fields(self.include_reasoning)

    def step(self, ids: Sequence[int], finished: bool) -> ChatParts:
        parts = ChatParts()
        if finished and ids and not self.include_stop and ids[-1] in self._end_ids():
            ids = ids[:-1]  # the stop token or EOS that ended it: no text, as the detokenizer
        i, n = 0, len(ids)
        while i < n:  # one by one: the content after a body's close stays after its raw text
            i = self._rest_run(ids, i, parts)  # taken at rest, as by ``message``: no call into the core
            if i == n or self.state.finished:
                break
            before = self.state._mode
            self._take(self._push((ids[i],)), parts, at_end=False, before=before)
            self._caught_up()
            i += 1
        if finished and not self.state.finished:
            self._take(self.state.finish(), parts, at_end=True, before=self.state._mode)
        if finished and self._edges is not None:
            for edge in self._edges:  # the reply's end: what was held was an edge
                edge.end()
        self._caught_up()
        return parts

    def _rest_run(self, ids: Sequence[int], start: int, parts: ChatParts) -> int:
        """The ids of a step from ``start`` on that the stream takes at rest (``RestTexts``):
        taken by lookups, their text into ``parts`` as the core would release it; returns
        where the first id that needs the core stands (``start``: none taken)."""
        rest = self._rest
        if rest is None:
            return start
        slow, mode, learn = self._slow, self.state._mode, self._rests.learn  # type: ignore[union-attr]
        texts: list[str] = []
        i, n = start, len(ids)
        while i < n:
            tid = ids[i]
            if tid.__class__ is not int:  # not a bool, numpy or torch scalar
                break
            text = rest.get(tid)
            if text is None and tid not in rest:  # an id not seen at rest in this mode yet
                text = learn(mode, tid)
            if text is None or tid in slow:
                break
            texts.append(text)
            i += 1
        if i > start:
            self._ids.extend(ids[start:i])
            self._rest_texts(texts, parts)
        return i

    def _rest_texts(self, texts: list[str], parts: ChatParts) -> None:
        """The texts of ids taken at rest, into their channel: joined, since the channel's
        text (and its edge, ``Edge.take``) is the same in one piece, except a tool body whose
        arguments stream, whose reader sees the pieces as they came."""
        channel = self._channel
        if channel == TOOL and self.stream_arguments:
            for text in texts:
                if text:
                    self._body_text(self.state._rest_tool_text(text), text, parts)
            return
        text = "".join(texts)
        if not text:
            return
        if channel == TOOL:
            self._body_text(self.state._rest_tool_text(text), text, parts)
        elif channel == CONTENT:
            self._text(CONTENT, text, parts.content)
        else:
            self._text(REASONING, text, parts.reasoning)

    def _caught_up(self) -> None:
        """After a call into the core: whether the shortcut applies now (at rest in a mode
        whose text goes to content, reasoning or a tool body), and where its text goes."""
        self._rest = None
        if self._rests is None:
            return
        state = self.state
        mode = state._mode_at_rest()
        if mode < 0:
            return
        channel = state._channel()
        if channel in (CONTENT, REASONING, TOOL):
            self._rest = self._rests.by_mode[mode]
            self._channel = channel
            if self._edges is not None and channel != TOOL:
                self._edge = self._edges[channel]

    def _push(self, ids: Sequence[int]) -> Any:
        try:
            return self.state.push(ids[0] if len(ids) == 1 else list(ids))
        except TokenIdError:  # an id the tokenizer does not know (a padded vocabulary)
            return push_skipping_unknown(self.state, ids, self._log)

    def _take(self, delta: Any, parts: ChatParts, *, at_end: bool, before: int) -> None:
        """One id's (or the finish's) delta into ``parts``; ``before``: the mode the stream
        was in before it. An id that came while a tool body was open (``text_last``): its
        content followed the body's close tag and goes after a malformed body's raw text
        (one delta does not say where its text stood)."""
        text_last = before == TOOL
        if delta.reasoning:
            self._text(REASONING, delta.reasoning, parts.reasoning)
        if delta.text and not text_last:
            self._text(CONTENT, delta.text, parts.content)
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
        if delta.text and text_last:
            self._text(CONTENT, delta.text, parts.content)
        if self._edges is not None:
            self._segments(self.state._mode)

    def _segments(self, mode: int) -> None:
        """After an id: a segment the stream left ended at markup, so what it held was its
        trailing edge. Reasoning ends at its close tag (or a call, ``tool_ends_reasoning``);
        content ends where reasoning opens, not at a call: a call goes out of band, and the
        content on both sides of it joins (whitespace between them is text between them)."""
        content, reasoning = self._edges  # type: ignore[misc]
        if mode == REASONING:
            content.end()
        else:
            reasoning.end()

    def _text(self, channel: int, text: str, into: list[str]) -> None:
        """Content or reasoning text (``channel``), less its segment's edges (``_edges``)
        where tags are live, onto that channel's pieces."""
        if self._edges is not None:
            text = self._edges[channel].take(text)
            if not text:
                return
        into.append(text)

    def _body_text(self, index: int, text: str, parts: ChatParts) -> None:
        if not self.body_open:
            self._open_body(index)
        self.body.append(text)
        assert self.reader is not None
        if not self.stream_arguments:
            return  # the call goes out when the model has finished it
        self._send(self.reader.feed(text), parts)

    def _send(self, events: list[families.Event], parts: ChatParts) -> None:
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
        self.reader = self.format.reader(self.tools)

    def _complete(self, call: Any, parts: ChatParts, at_end: bool) -> None:
        if not self.body_open:
            self._open_body(call.index)  # a body with no text, closed at once
        reader = self.reader
        assert reader is not None
        if call.error is not None:
            if call.unterminated or not "".join(self.body).strip():  # unfinished, or no call in it
                self._log.warning("detok-plugin: %s; the unfinished or empty tool call is dropped", call.error)
                for k, (name, arguments) in enumerate(self._finished_calls()):
                    self._deliver(k, Call(name, arguments), parts)
                return
            tags = self.tags
            opener = "" if self.state._tool_bare else (tags.tool_open or "")  # a bare body holds its opener
            raw = opener + "".join(self.body) + (tags.tool_close or "")
            self._log.warning("detok-plugin: %s; sent as content", call.error)
            if self._edges is not None:  # the body was text of the content segment
                raw = self._edges[CONTENT].take(raw)
            parts.content.append(raw)
            return
        k = call.index - self.body_index  # which call of this body
        self._deliver(k, self._typed(call, k), parts)

    def _finished_calls(self) -> list[tuple[str, str]]:
        """The calls of a body the stream ended inside that the model finished: the body up
        to its last call's close marker (``ToolFormat.call_close``) outside a value, parsed."""
        close = self.format.call_close
        body = "".join(self.body)
        at = body.rfind(close) if close else -1
        while at >= 0 and self.format.marker_is_text(body[:at]):
            at = body.rfind(close, 0, at)  # type: ignore[arg-type]
        if at < 0:
            return []
        try:
            return self.format.parse(body[: at + len(close)].strip(), self.tools)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            return []

    def _deliver(self, k: int, call: Any, parts: ChatParts) -> None:
        """Call ``k`` of the body is finished: kept, and sent (what of it is still unsent)."""
        reader = self.reader
        assert reader is not None
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
            else:  # a string value streamed raw: cannot happen by the readers' rule 1
                self._log.warning("detok-plugin: tool call %d's arguments streamed as %r, parsed as %r", k, sent, call.arguments)

    def _typed(self, call: Any, k: int) -> Any:
        """The call with its values typed by the request's schema (XML formats): the core
        parsed the body without the request, so every value there is a string."""
        if not self.format.typed_by_schema:
            return call
        if self.typed is None:
            self.typed = self.format.parse("".join(self.body).strip(), self.tools)
        name, arguments = self.typed[k]
        return Call(name, arguments)

    @functools.cached_property
    def tools(self) -> list[dict[str, Any]] | None:
        """The request's tools as plain dicts where the format types values by their schema
        (XML formats), else None: made once, when a body first needs them (a request's
        schemas may be large, and most formats never read them)."""
        return self._tools() if self.format.typed_by_schema else None

    def _new_id(self, name: str) -> str:
        return self._new_call_id(name, self.format)
