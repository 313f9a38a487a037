"""Tool-call arguments as they form, for the formats whose arguments are JSON.

The core says where a tool-call body starts and ends and parses it at the end.
OpenAI's streaming API wants more: the call's name as soon as it is known, then its
``arguments`` JSON in pieces as the model writes them. :class:`JsonBodyReader` reads one
body's text, piece by piece, and says what may be sent so far::

    {"name": "get_weather", "arguments": {"city": "東京"}}
    ^ name known here ───────┘            ^ from here on, every character of the value
                                            is sent as it arrives, up to its last brace

What differs between formats is the *head* (where a call's name is) and how its arguments
end; a family module gives both as a :class:`Dialect`. Rules, so that what was sent is never
wrong:

1. Only text that is certainly part of the arguments value is sent: the value must be a
   JSON object or array (its end is its matching bracket, found by counting brackets
   outside strings), or, in a format whose arguments run raw up to a closing marker, the
   text before that marker; a string or scalar value, a name that is not the first key, or
   any other layout is sent whole at the end, from the family's parse.
2. Nothing here decides whether the body is valid: the parse at the end does. A body that
   turns out malformed has had at most its name and a prefix of its arguments sent.

>>> from detok_plugin.families import tool_format
>>> r = tool_format("hermes").reader(None)
>>> r.feed('{"name": "get_weather", "arg')
[(0, 'get_weather', '')]
>>> r.feed('uments": {"city": "東')
[(0, None, '{"city": "東')]
>>> r.feed('京"}}')
[(0, None, '京"}')]
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import NamedTuple

from ._format import Event

__all__ = ["Dialect", "JsonBodyReader", "may_become_head", "object_head", "one_object_head"]

_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,')
_KEY = re.compile(r'\s*"(?:arguments|parameters)"\s*:\s*')


class Dialect(NamedTuple):
    """What one format's reader does differently.

    ``head(reader, events)`` reads a call's head from ``reader.pos`` when no call is open:
    it moves ``pos`` past what it read and calls :meth:`JsonBodyReader.keyed_call` (the
    arguments follow their JSON key) or :meth:`JsonBodyReader.raw_call` (they follow at
    once), or :meth:`JsonBodyReader.give_up`, or waits for more text. ``closers``: the
    markers that end raw arguments; empty, the arguments are one JSON value. ``opens``: the
    characters a JSON value may open with and still be streamed.
    """

    head: Callable[[JsonBodyReader, list[Event]], None]
    closers: tuple[str, ...] = ()
    opens: str = "{["


class JsonBodyReader:
    """One tool-call body of a JSON-arguments format (see the module).

    The arguments are kept in pieces, joined when ``args`` is read (a long argument grown by
    concatenation would copy what it holds on every token). ``buf`` holds the text still
    needed and ``pos`` where reading resumes in it; a dialect's head reads both.
    """

    __slots__ = ("dialect", "buf", "pos", "calls", "_args", "done", "_depth", "_in_str", "_esc", "_open", "_key", "_dead")

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect  # a head may switch it (Mistral's layouts)
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
            else:
                self.dialect.head(self, events)
            if (self.pos, self.calls, self._open) == before:
                break
        return events

    # --- what a dialect's head calls --------------------------------------------------

    def keyed_call(self, raw_name: str, events: list[Event]) -> None:
        """A JSON head's name (still JSON-escaped) is known: its arguments follow their key."""
        try:
            name = json.loads(f'"{raw_name}"')
        except ValueError:
            self._dead = True
            return
        self._new_call(name, events)
        self._key = True

    def raw_call(self, name: str, events: list[Event]) -> None:
        """A call's name is known and its arguments start at ``pos``."""
        self._new_call(name, events)
        self._open = True
        self._in_str = self._esc = False

    def give_up(self) -> None:
        """Not a layout this reader streams: the parse at the close sends the body whole."""
        self._dead = True

    def find_call(self, marker: str) -> int:
        """Where ``marker`` (a call's opening) starts at or after ``pos``, or -1; then text
        that cannot hold its start is read (only a possible prefix of it stays)."""
        at = self.buf.find(marker, self.pos)
        if at < 0:
            self.pos = max(self.pos, len(self.buf) - len(marker) + 1)
        return at

    # --- the arguments ------------------------------------------------------------------

    def _new_call(self, name: str, events: list[Event]) -> None:
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
        if self.dialect.closers:
            self._raw_args(events)
            return
        buf, pos, start = self.buf, self.pos, self.pos
        if self._depth == 0:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            self.pos = start = pos
            if pos == len(buf):
                return
            if buf[pos] not in self.dialect.opens:
                self._dead = True  # a string or scalar: sent whole at the end
                return
        pos, self._depth, self._in_str, self._esc, closed = _scan_value(buf, pos, self._depth, self._in_str, self._esc)
        if closed:
            self._open = False
            self.done[-1] = True
        self.pos = pos
        self._send(buf[start:pos], events)

    def _raw_args(self, events: list[Event]) -> None:
        """Raw arguments, sent as they come up to the format's closer; a closer inside a
        JSON string of the arguments is text of it (``ToolFormat.marker_is_text``)."""
        buf, pos = self.buf, self.pos
        closers = self.dialect.closers
        at = pos
        while ends := [i for i in (buf.find(c, at) for c in closers) if i >= 0]:
            end = min(ends)
            if not _quote_state(buf, pos, end, self._in_str, self._esc)[0]:
                self._send(buf[pos:end], events)
                self.pos = end
                self._open = False
                self.done[-1] = True
                return
            at = end + 1
        # Hold a suffix that may become a closer.
        hold = max((k for c in closers for k in range(1, len(c)) if buf.endswith(c[:k])), default=0)
        end = len(buf) - hold
        if end > pos:
            self._in_str, self._esc = _quote_state(buf, pos, end, self._in_str, self._esc)
            self._send(buf[pos:end], events)
            self.pos = end

    def _send(self, piece: str, events: list[Event]) -> None:
        if piece:
            self._args[-1].append(piece)
            events.append((self.calls - 1, None, piece))


def object_head(reader: JsonBodyReader, pos: int, events: list[Event]) -> None:
    """A ``{"name": ..., "arguments"|"parameters": ...}`` head at ``pos``: the name is sent
    once its string ends; a text that cannot become such a head gives up."""
    m = _NAME.match(reader.buf, pos)
    if m is None:
        # Not yet, or not this layout: give up once the text cannot become it.
        if not may_become_head(reader.buf[pos:]):
            reader.give_up()
        return
    reader.pos = m.end()
    reader.keyed_call(m.group(1), events)


def one_object_head(reader: JsonBodyReader, events: list[Event]) -> None:
    """The head of a body that is one JSON object (Hermes, Llama 3)."""
    if not reader.calls:
        object_head(reader, reader.pos, events)


def may_become_head(text: str) -> bool:
    """Whether a head may still be forming: a name-first head is short, so 256 characters
    without one mean another layout (sent whole at the end)."""
    return len(text) < 256


def _quote_state(buf: str, start: int, end: int, in_str: bool, esc: bool) -> tuple[bool, bool]:
    """Whether a JSON string is open at ``end`` (and an escape pending), from the state at ``start``."""
    for c in buf[start:end]:
        if esc:
            esc = False
        elif c == "\\":
            esc = in_str
        elif c == '"':
            in_str = not in_str
    return in_str, esc


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
#: it is shared by every reader; bounded, started again when full. Each entry is written
#: whole by one assignment, so readers in other threads see an entry or none.
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
