"""Channels: where released text goes once the boundary lets it leave.

A stream is in one mode at a time: content, reasoning (between the reasoning tags) or a
tool-call body (between the tool tags, or from the open tag to the end). Released text
goes to that mode's channel:

* content to ``Delta.text``;
* reasoning to ``Delta.reasoning`` (``reasoning="separate"``), nowhere (``"strip"``), or
  with its tags to ``Delta.text`` (``"inline"``);
* a tool body to ``Delta.tool_calls`` as ``ToolCall(index, text)`` as it forms, and at its
  close tag (or the end of the stream, for families without one) one
  ``ToolCall(complete=True)`` with the parsed name and arguments, or ``error``: a malformed
  body is reported, never dropped.
  With ``tools="inline"``, the tool tags and bodies go to ``Delta.text`` instead and no
  ``ToolCall`` is built: stops still skip the bodies (for a stream whose text a tool
  parser downstream reads, as vLLM's detokenizer's is).

Every piece also goes to the lossless log (``DetokenizerState.log()``). A tag switches the
mode; each mode has its own automaton (``StreamConfig.matchers``), so a stop does not apply
inside reasoning (unless ``stop_in_reasoning``) or inside a tool body.

This module is one part of :class:`~detok_plugin.DetokenizerState` (a slotless base class).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._delta import CONTENT, ONE_EMPTY, REASONING, TAG, TEXT_DELTAS, TOOL, Delta, Out, reasoning_delta, text_delta, tool_delta
from ._tags import ToolCall
from .families import parse_tool_body, tool_format

if TYPE_CHECKING:
    from ._decoders import StreamDecoder
    from ._matcher import Matcher
    from ._options import Pattern, StreamConfig

__all__: list[str] = []

DROPPED = -1  # a channel number: text that goes nowhere (reasoning="strip")


class Router:
    """The channels of one stream (see the module docstring)."""

    if not TYPE_CHECKING:  # slotless at run time; mypy reads the declarations below
        __slots__ = ()

    # Declared in DetokenizerState's slots.
    _cfg: StreamConfig
    _mode: int
    _ac: Matcher | None
    _ac_state: int
    _pending: str
    _tool_index: int
    _tool_body: list[str]
    _tool_bare: bool
    _at_start: bool
    _done: bool
    _skip_chars: int
    _early: str
    _keep_log: bool
    _max_tokens: int | None
    _dec: StreamDecoder

    if TYPE_CHECKING:  # the state's log

        def _log(self, kind: int, text: str) -> None: ...

    def _channel(self) -> int:
        """Where text released in the current mode goes: ``CONTENT`` (``Delta.text``),
        ``REASONING`` (``Delta.reasoning``), ``TOOL`` (the tool body), or ``DROPPED``
        (reasoning with ``reasoning="strip"``)."""
        mode = self._mode
        if mode == REASONING:
            reasoning = self._cfg.reasoning
            return REASONING if reasoning == "separate" else CONTENT if reasoning == "inline" else DROPPED
        if mode == TOOL and self._cfg.tools == "inline":
            return CONTENT
        return mode

    def _emit(self, text: str, out: Out) -> None:
        """Send released text to the current mode's channel."""
        if not text:
            return
        self._log(self._mode, text)
        channel = self._channel()
        if channel == CONTENT:
            out.text.append(text)
            if self._mode == TOOL:  # tools="inline": the body is kept for marker_is_text
                self._tool_body.append(text)
            elif self._at_start and not text.isspace():
                self._at_start = False
        elif channel == REASONING:
            out.reasoning.append(text)
        elif channel == TOOL:
            self._tool_body.append(text)
            out.tools.append(ToolCall(self._tool_index, text))

    def _emit_one(self, text: str) -> Delta:
        """``_emit`` of one id's released text, as that push's Delta (no ``Out``)."""
        self._log(self._mode, text)
        channel = self._channel()
        if channel == CONTENT:
            if self._mode == TOOL:  # tools="inline": the body is kept for marker_is_text
                self._tool_body.append(text)
            elif self._at_start and text and not text.isspace():
                self._at_start = False
            return TEXT_DELTAS.get(text) or text_delta(text)
        if channel == REASONING:
            return reasoning_delta(text)
        if channel == TOOL:
            self._tool_body.append(text)
            return tool_delta(ToolCall(self._tool_index, text))
        return ONE_EMPTY

    def _switch(self, pattern: Pattern, out: Out) -> None:
        """A complete tag: log its text and change mode; but a tool close tag inside a value
        of the body (``_marker_is_text``) is text of the body, and a bare opener where it
        may not open a body (``TagSet.bare_at_start``) is text."""
        if pattern.kind == "t_close" and self._marker_is_text():
            self._emit(pattern.text, out)
            return
        if pattern.kind == "t_bare":
            self._open_bare(pattern, out)
            return
        self._tag_text(pattern, out)
        if pattern.kind == "r_open":
            self._set_mode(REASONING)
        elif pattern.kind == "r_close":  # a stray close in content is dropped from content
            self._set_mode(CONTENT)
        elif pattern.kind == "t_open":
            self._open_tool(bare=False)
        elif pattern.kind == "t_close":
            self._end_tool(out)
            self._set_mode(CONTENT)

    def _open_tool(self, *, bare: bool) -> None:
        self._tool_index += 1
        self._tool_body = []
        self._tool_bare = bare
        self._at_start = False
        self._set_mode(TOOL)

    def _open_bare(self, pattern: Pattern, out: Out) -> None:
        """A bare opener (``TagSet.tool_bare``): it opens a body and is its first text
        (where it opens none, the boundary scans on over it as text)."""
        if self._bare_opens():
            self._log(TAG, "")
            self._open_tool(bare=True)
        self._emit(pattern.text, out)

    def _bare_opens(self, lead: str = "") -> bool:
        """A bare opener opens a body here: unless the tag set allows it only at the start
        of the reply and text came before (``lead``: the text before it not sent yet)."""
        return not self._cfg.tags.bare_at_start or (self._at_start and not lead.strip())  # type: ignore[union-attr]

    def _marker_is_text(self) -> bool:
        """The one boundary rule for markers in a tool body: the format's
        ``marker_is_text`` over the body so far (inside a JSON string or an XML value, a
        marker is text). Asked only when a close tag completes, so it costs nothing per id."""
        if self._mode != TOOL:
            return False
        tags = self._cfg.tags
        assert tags is not None
        return tool_format(tags.tool_format).marker_is_text("".join(self._tool_body))

    def _id_tag(self, pattern: Pattern, out: Out) -> None:
        """A tag token that skip_special_tokens removes from the text: act on its id where
        its text would act, as a tag of the mode's patterns (``StreamConfig.patterns``);
        elsewhere it is nothing, as in the decode (a reasoning tag's id inside a tool body,
        a tool close tag's id where no body is open). A close tag inside a value is the
        value's text, as ``_switch`` says."""
        if all(p.kind != pattern.kind for p in self._cfg.patterns[self._mode]):
            return
        if pattern.kind == "t_close" and self._marker_is_text():
            self._emit(self._pending, out)
            self._pending, self._ac_state = "", 0
            if self._channel() == TOOL:  # the decode drops it; a separate body keeps its text
                self._emit(pattern.text, out)
            return
        # Text held so far cannot join with a tag that has no text: release it.
        self._emit(self._pending, out)
        self._pending = ""
        self._switch(pattern._replace(text=""), out)

    def _mode_at_rest(self) -> int:
        """The current mode while the stream is at rest, else ``DROPPED``: for a serving
        wrapper of a stream with tags (``TaggedServingStream``, ``ChatStream``), as
        ``_boundary_at_rest`` is for ``ServingStream``.

        At rest: live, nothing of the prompt left to skip, the decoder idle (``quick[i]`` is
        ``feed_one(i)``, which then changes nothing), no pattern partly matched, nothing
        that showed by ``min_tokens`` still held, no log and no ``max_tokens``. Then an id
        in the vocabulary that is no stop id and no id tag, whose quick text holds no first
        character of the mode's patterns (``cfg.matchers[mode].first``), takes steps
        (1)-(5) as: appended to ``token_ids``, its text released whole to the mode's
        channel (``_channel``), nothing else changed. A wrapper may do exactly that
        without the call (in a tool body, the text also goes to ``_rest_tool_text``), and
        must ask again after any call.
        """
        if self._done or self._skip_chars or self._ac_state or self._early or self._keep_log or self._max_tokens is not None:
            return DROPPED
        if self._at_start:  # whether a bare body may open is read from the text, in the core
            return DROPPED
        return self._mode if self._dec.idle else DROPPED

    def _rest_tool_text(self, text: str) -> int:
        """A wrapper's shortcut id in a tool body (``_mode_at_rest``): its text joins the
        body the stream parses at the close tag; returns the call's index, as the
        ``ToolCall(index, text)`` the call would have released."""
        self._tool_body.append(text)
        return self._tool_index

    def _close_channels(self, out: Out) -> None:
        """At the end of the stream: a tool body still open is reported unterminated."""
        if self._mode == TOOL:
            self._end_tool(out, unterminated=True)
            self._set_mode(CONTENT)

    def _tag_text(self, pattern: Pattern, out: Out) -> None:
        self._log(TAG, pattern.text)
        cfg = self._cfg
        if pattern.text and (
            (cfg.reasoning == "inline" and pattern.kind in ("r_open", "r_close"))
            or (cfg.tools == "inline" and pattern.kind in ("t_open", "t_close"))
        ):
            out.text.append(pattern.text)

    def _set_mode(self, mode: int) -> None:
        self._mode = mode
        self._ac = self._cfg.matchers[mode]
        self._ac_state = 0

    def _end_tool(self, out: Out, *, unterminated: bool = False) -> None:
        """A tool body ended: one complete ToolCall per call in it, or one with ``error``."""
        tags = self._cfg.tags
        assert tags is not None
        body = "".join(self._tool_body)
        self._tool_body = []
        if self._cfg.tools == "inline":  # the body went out as text: nothing to parse
            return
        first = self._tool_index
        if unterminated and tags.tool_close is not None:
            out.tools.append(ToolCall(first, complete=True, error=f"stream ended before {tags.tool_close}", unterminated=True))
            return
        try:
            calls = parse_tool_body(body.strip(), tags.tool_format)
        except (ValueError, TypeError) as exc:
            out.tools.append(ToolCall(first, complete=True, error=f"malformed tool call: {exc}"))
            return
        for k, (name, args) in enumerate(calls):
            out.tools.append(ToolCall(first + k, name=name, arguments=args, complete=True))
        self._tool_index = first + len(calls) - 1
