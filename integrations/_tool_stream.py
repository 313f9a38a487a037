"""Tool-call arguments as they form: the body text the core streams, read into OpenAI deltas.

The core (``DetokenizerState`` with tags) says where a tool-call body starts and ends, and
at the end parses it (``ToolCall(complete=True)`` with ``name`` and ``arguments``, or
``error``). OpenAI's streaming API wants more: the call's name as soon as it is known,
then its ``arguments`` JSON in pieces as the model writes them. :class:`BodyReader` reads
one body's text, piece by piece, and says what may be sent so far::

    {"name": "get_weather", "arguments": {"city": "東京"}}
    ^ name known here ───────┘            ^ from here on, every character of the value
                                            is sent as it arrives, up to its last brace

Rules, so that what was sent is never wrong:

1. Only text that is certainly part of the arguments value is sent: the value must be a
   JSON object or array (its end is its matching bracket, found by counting brackets
   outside strings); a string or scalar value, a name that is not the first key, or any
   other layout is sent whole at the end, from the core's parse.
2. Nothing here decides whether the body is valid: the core's parse at the end does. A
   body that turns out malformed has had at most its name and a prefix of its arguments
   sent; the caller then reports the raw text (see ``integrations/vllm_chat.py``).

Formats: ``hermes`` (one object, ``arguments``), ``llama3`` (one object, ``parameters``),
``mistral`` (a list of objects before tokenizer v11; from v11 on ``NAME[ARGS]`` then the JSON,
once per call, the layout read from the body's first character as the core's parse reads
it: ``detok_plugin._tags``), ``deepseek`` (``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``
then a fenced JSON block, once per call), ``deepseek_v31`` (``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>``
then the JSON, once per call), ``kimi_k2`` (``<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>``
then the JSON, once per call). The XML formats have their own reader (``_xml_stream``).

>>> r = BodyReader("hermes")
>>> r.feed('{"name": "get_weather", "arg')
[(0, 'get_weather', '')]
>>> r.feed('uments": {"city": "東')
[(0, None, '{"city": "東')]
>>> r.feed('京"}}')
[(0, None, '京"}')]
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

from detok_plugin.integrations._xml_stream import XmlBodyReader

from detok_plugin._tags import MISTRAL_CALLS, MISTRAL_V11_HEAD, is_mistral_v11, kimi_name

__all__ = ["BodyReader", "Event", "reader_for"]

#: One thing to send: (call number within the body, the name when it is first known,
#: a piece of the arguments).
Event = tuple[int, "str | None", str]

_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,')
_KEY = re.compile(r'\s*"(?:arguments|parameters)"\s*:\s*')
_NEXT = re.compile(r"\s*\}\s*(,)?\s*")
_DS_CALL = "<｜tool▁call▁begin｜>"
_DS_SEP = "<｜tool▁sep｜>"
_DS_END = "<｜tool▁call▁end｜>"
_DS_FENCE = re.compile(r"```(?:json)?\n")
_DS_CLOSERS = ("\n```", _DS_END)
_KIMI_CALL = "<|tool_call_begin|>"
_KIMI_ARGS = "<|tool_call_argument_begin|>"
_KIMI_END = "<|tool_call_end|>"
_JsonFormat = Literal["hermes", "llama3", "mistral", "deepseek", "deepseek_v31", "kimi_k2"]
#: What the reader streams: a format, or ``mistral_v11`` once a ``mistral`` body shows that layout.
_Layout = Literal["hermes", "llama3", "mistral", "mistral_v11", "deepseek", "deepseek_v31", "kimi_k2"]
#: Formats whose arguments run raw between markers, and what ends them.
_RAW_CLOSERS = {"deepseek": _DS_CLOSERS, "deepseek_v31": (_DS_END,), "kimi_k2": (_KIMI_END,)}


def reader_for(fmt: str, tools: Sequence[Mapping[str, Any]] | None) -> BodyReader | XmlBodyReader:
    """The reader for a tool format: the XML ones need the request's tools to type values."""
    if fmt in ("qwen3_xml", "glm45"):
        return XmlBodyReader(cast(Literal["qwen3_xml", "glm45"], fmt), tools)
    return BodyReader(cast(_JsonFormat, fmt))


class BodyReader:
    """One tool-call body, fed as the core streams it; ``feed(text)`` returns the events
    that text makes safe to send. ``calls`` is how many calls have had their name sent;
    ``args[k]`` what was sent of call k's arguments, ``done[k]`` whether all of it. The
    arguments are kept in pieces, joined when ``args`` is read (a long argument grown by
    concatenation would copy what it holds on every token)."""

    __slots__ = ("fmt", "buf", "pos", "calls", "_args", "done", "_depth", "_in_str", "_esc", "_open", "_key", "_dead")

    def __init__(self, fmt: _JsonFormat) -> None:
        self.fmt: _Layout = fmt
        self.buf = ""
        self.pos = 0  # scanned up to here
        self.calls = 0
        self._args: list[list[str]] = []  # each call's arguments sent so far, in pieces
        self.done: list[bool] = []
        self._depth = 0  # bracket depth inside the current arguments value
        self._in_str = False
        self._esc = False
        self._open = False  # inside a call's arguments value
        self._key = False  # a name was sent; its arguments key is still to come
        self._dead = False  # a layout this reader does not stream: the end sends it

    @property
    def args(self) -> list[str]:
        """Each call's arguments sent so far."""
        return ["".join(parts) for parts in self._args]

    def feed(self, text: str) -> list[Event]:
        if self._dead:
            return []  # nothing more streams: the body is sent whole at its close
        if self._depth:
            # Inside an arguments value, all read so far (a scan stops early only at the
            # value's last bracket, which ends it): the common piece is sent whole.
            _, depth, in_str, esc, closed = _scan_piece(text, self._depth, self._in_str, self._esc)
            if not closed:
                self._depth, self._in_str, self._esc = depth, in_str, esc
                self.buf, self.pos = "", 0
                events: list[Event] = []
                self._send(text, events)
                return events
        if self.pos:
            # What is before pos is read and never looked at again (every scan starts at
            # pos): drop it, so the buffer holds only what a head or closer may still need
            # and a long body costs O(its length), not O(length^2).
            self.buf, self.pos = self.buf[self.pos :] + text, 0
        else:
            self.buf += text
        events = []
        while not self._dead:
            before = (self.pos, self.calls, self._open)
            if self._key:
                self._args_key()
            elif self._open:
                self._scan_args(events)
                if self._open:  # all that arrived is sent, or held for a raw closer
                    break
            elif self.fmt == "deepseek":
                self._deepseek_head(events)
            elif self.fmt == "deepseek_v31":
                self._deepseek_v31_head(events)
            elif self.fmt == "kimi_k2":
                self._kimi_head(events)
            elif self.fmt == "mistral_v11":
                self._mistral_v11_head(events)
            else:
                self._json_head(events)
            if (self.pos, self.calls, self._open) == before:
                break
        return events

    # --- JSON formats ----------------------------------------------------------------

    def _json_head(self, events: list[Event]) -> None:
        buf, pos = self.buf, self.pos
        if self.calls == 0 and self.fmt == "mistral":
            layout = _mistral_layout(buf[pos:])
            if layout == "v11":
                self.fmt = "mistral_v11"
                self._mistral_v11_head(events)
            if layout != "json":
                return  # read as v11 from now on, or the layout is not known yet
            m = re.compile(r"\s*\[").match(buf, pos)
            if m is None:
                self._dead = bool(buf[pos:].strip())
                return
            pos = m.end()
        elif self.calls > 0:
            if self.fmt != "mistral" or not self.done[-1]:
                return
            m = _NEXT.match(buf, pos)
            if m is None or m.end() == len(buf):
                return  # more may come
            if m.group(1) is None:  # "}" then the end of the list
                return
            pos = m.end()
        m = _NAME.match(buf, pos)
        if m is None:
            # Not yet, or not this layout: give up once the text cannot become it.
            if not _may_become_head(buf[pos:]):
                self._dead = True
            return
        self.pos = m.end()
        self._start_call(m.group(1), events)

    def _start_call(self, raw_name: str, events: list[Event]) -> None:
        try:
            import json

            name = json.loads(f'"{raw_name}"')
        except ValueError:
            self._dead = True
            return
        self._new_call(name, events)
        self._key = True

    def _new_call(self, name: str, events: list[Event]) -> None:
        """A call's name is known: send it, and read its arguments next (from their key in
        the JSON formats, at once in the others)."""
        events.append((self.calls, name, ""))
        self.calls += 1
        self._args.append([])
        self.done.append(False)
        self._depth = 0

    def _args_key(self) -> None:
        m = _KEY.match(self.buf, self.pos)
        if m is None:
            if len(self.buf) - self.pos > 64:
                self._dead = True  # another key first: the end sends the arguments
            return
        self.pos = m.end()
        self._key = False
        self._open = True

    def _scan_args(self, events: list[Event]) -> None:
        """Send the arguments value up to what arrived; close it at its last bracket."""
        if self.fmt in _RAW_CLOSERS:
            self._deepseek_args(events)
            return
        buf, pos, start = self.buf, self.pos, self.pos
        if self._depth == 0:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            self.pos = start = pos
            if pos == len(buf):
                return
            # A v11 value is an object: a "[" there may be the next call's [TOOL_CALLS].
            if buf[pos] not in ("{" if self.fmt == "mistral_v11" else "{["):
                self._dead = True  # a string or scalar: sent whole at the end
                return
        pos, self._depth, self._in_str, self._esc, closed = _scan_value(buf, pos, self._depth, self._in_str, self._esc)
        if closed:
            self._open = False
            self.done[-1] = True
        self.pos = pos
        self._send(buf[start:pos], events)

    def _send(self, piece: str, events: list[Event]) -> None:
        if piece:
            self._args[-1].append(piece)
            events.append((self.calls - 1, None, piece))

    # --- DeepSeek ----------------------------------------------------------------------

    def _deepseek_head(self, events: list[Event]) -> None:
        buf = self.buf
        at = self._find_call(_DS_CALL)
        if at < 0:
            return
        sep = buf.find(_DS_SEP, at)
        if sep < 0:
            return
        line = buf.find("\n", sep)
        if line < 0:
            return
        fence = _DS_FENCE.match(buf, line + 1)
        if fence is None:
            if len(buf) - line - 1 < 8 and "```json\n".startswith(buf[line + 1 :] or "`"):
                return  # the fence may still be forming
            self.pos = line + 1
        else:
            self.pos = fence.end()
        self._new_call(buf[sep + len(_DS_SEP) : line].strip(), events)
        self._open = True

    def _find_call(self, marker: str) -> int:
        """Where ``marker`` (a call's opening) starts at or after ``pos``, or -1; then text
        that cannot hold its start is read (only a possible prefix of it stays)."""
        at = self.buf.find(marker, self.pos)
        if at < 0:
            self.pos = max(self.pos, len(self.buf) - len(marker) + 1)
        return at

    def _deepseek_v31_head(self, events: list[Event]) -> None:
        """V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>`` then the JSON arguments."""
        buf = self.buf
        at = self._find_call(_DS_CALL)
        sep = buf.find(_DS_SEP, at) if at >= 0 else -1
        if sep < 0:
            return
        self.pos = sep + len(_DS_SEP)
        self._new_call(buf[at + len(_DS_CALL) : sep].strip(), events)
        self._open = True

    def _kimi_head(self, events: list[Event]) -> None:
        """Kimi K2: ``<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>`` then the JSON."""
        buf = self.buf
        at = self._find_call(_KIMI_CALL)
        sep = buf.find(_KIMI_ARGS, at) if at >= 0 else -1
        if sep < 0:
            return
        try:
            name = kimi_name(buf[at + len(_KIMI_CALL) : sep])
        except ValueError:
            self._dead = True  # the parse at the close reports it
            return
        self.pos = sep + len(_KIMI_ARGS)
        self._new_call(name, events)
        self._open = True

    def _mistral_v11_head(self, events: list[Event]) -> None:
        """Mistral v11+: ``NAME[ARGS]`` (after a ``[TOOL_CALLS]`` for a call after the first)
        then the JSON; the name is known once ``[ARGS]`` (or the brace) follows it."""
        buf = self.buf
        m = MISTRAL_V11_HEAD.match(buf, self.pos)
        if m is None:
            if not _may_become_head(buf[self.pos :]):
                self._dead = True
            return
        self.pos = m.end()
        self._new_call(m.group(1), events)
        self._open = True

    def _deepseek_args(self, events: list[Event]) -> None:
        """The arguments of a raw format, sent as they come up to the format's closer."""
        buf, pos = self.buf, self.pos
        closers = _RAW_CLOSERS[self.fmt]
        ends = [i for i in (buf.find(c, pos) for c in closers) if i >= 0]
        if ends:
            end = min(ends)
            self._send(buf[pos:end], events)
            self.pos = end
            self._open = False
            self.done[-1] = True
            return
        # Hold a suffix that may become a closer.
        hold = max((k for c in closers for k in range(1, len(c)) if buf.endswith(c[:k])), default=0)
        end = len(buf) - hold
        if end > pos:
            self._send(buf[pos:end], events)
            self.pos = end


def _scan_value(buf: str, pos: int, depth: int, in_str: bool, esc: bool) -> tuple[int, int, bool, bool, bool]:
    """Scan a JSON object or array from ``pos`` (brackets counted outside strings) up to
    its last bracket or the end of ``buf``: (position, depth, in_str, esc, closed)."""
    while pos < len(buf):
        c = buf[pos]
        pos += 1
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return pos, depth, in_str, esc, True
    return pos, depth, in_str, esc, False


#: ``_scan_piece``'s memo: a piece's scan depends on its text and the scan's state only, so
#: it is shared by every reader; bounded, started again when full.
_SCANS: dict[tuple[str, int, bool, bool], tuple[int, int, bool, bool, bool]] = {}
_SCANS_MAX = 16384


def _scan_piece(text: str, depth: int, in_str: bool, esc: bool) -> tuple[int, int, bool, bool, bool]:
    """``_scan_value(text, 0, depth, in_str, esc)``, remembered."""
    key = (text, depth, in_str, esc)
    scan = _SCANS.get(key)
    if scan is None:
        if len(_SCANS) >= _SCANS_MAX:
            _SCANS.clear()
        scan = _SCANS[key] = _scan_value(text, 0, depth, in_str, esc)
    return scan


def _mistral_layout(text: str) -> Literal["json", "v11", "unknown"]:
    """A Mistral body's layout from its start (the core's rule, ``is_mistral_v11``), or
    ``unknown`` while the start may still become ``[TOOL_CALLS]``."""
    head = text.lstrip()
    if not head or (len(head) < len(MISTRAL_CALLS) and MISTRAL_CALLS.startswith(head)):
        return "unknown"
    return "v11" if is_mistral_v11(head) else "json"


def _may_become_head(text: str) -> bool:
    """Whether the head may still be forming: a name-first head is short, so 256
    characters without one mean another layout (sent whole at the end)."""
    return len(text) < 256
