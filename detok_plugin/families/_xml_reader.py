"""XML-style tool calls (Qwen3-Coder, GLM-4.5) read as they stream into OpenAI deltas.

The sibling of :class:`~detok_plugin.families._json_reader.JsonBodyReader` for the formats
whose arguments are tagged text; what differs between them (tags, where the name is, whether
a value's newlines are markup) is the :class:`XmlDialect` their family module gives. :class:`XmlBodyReader` reads
one tool-call body piece by piece and returns what may be sent so far: the call's name once
its tag is complete, then its ``arguments`` JSON as the parameters arrive::

    <function=get_weather>         -> name "get_weather"
    <parameter=city>\\n東京           -> '{"city": "東京'  (a string value streams as it forms)
    \\n</parameter>                  -> '"'
    <parameter=days>\\n3\\n</parameter> -> ', "days": 3'   (a typed value goes at its close tag)
    </function>                    -> '}'

Rules, so that what was sent is always a prefix of the parse at the close
(the family's ``parse(body, tools)``, ``json.dumps(..., ensure_ascii=False)``):

1. A value streams as it forms only if the request's schema makes it a string (the
   property's types are exactly ``string``, or the schema does not name it, or the request
   has no schema for the function); any other value is typed and sent whole at its close.
2. Text that may still become a closing tag (a tag whose end is not yet certain too:
   Qwen3's ``</parameter>`` written inline ends a value only where markup follows it), and
   a string value's trailing blanks, are held until the next piece decides: the blanks may be the last of a Qwen3 value (whose
   last newline the parse trims) or of a body that ends inside its value (the parse keeps
   such a value to the body's end, and the body is stripped at its close).
3. A layout this reader does not follow (a key given twice, a JSON body) stops the
   streaming; the caller sends the rest from the parse at the close.

>>> from detok_plugin.families import tool_format
>>> r = tool_format("qwen3_xml").reader(None)
>>> r.feed("<function=get_weather>\\n<parameter=city>\\n東")
[(0, 'get_weather', ''), (0, None, '{"city": "東')]
>>> r.feed("京\\n</parameter>\\n</function>")
[(0, None, '京"}')]

Cost: ``feed(text)`` is O(len(text)) amortized plus the events it returns, however long the
body, a value, or the text before a call or between parameters. A search that finds no tag
resumes next time at the first place whose text may still grow into one (``_find``), not at
the step's start; the reader keeps only the text still needed (``_trim``: a string value's
unsent end and its last ``_HOLD_LT`` characters; a typed value, GLM's name, or a string
value's held blanks, in pieces joined at their end; each blank is looked at once, ``_Value.seen``);
a call's arguments are kept in pieces, joined when ``args`` is read.
A tag still open at the end of a piece (``<function=`` and a name with no ``>`` yet, or
an inline ``</parameter>`` and the blanks after it) is searched again from its ``<``: that
costs its own length per feed, as long as it stays open.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from itertools import groupby
from typing import Any, NamedTuple

from ._format import Event, Tools
from ._xml_values import coerce_value, properties_of, schema_types, trim_newlines

__all__ = ["Search", "XmlBodyReader", "XmlDialect", "chars", "tail"]


class Search(NamedTuple):
    """A tag to find, and the end of a text that may still grow into one (``_tail``)."""

    tag: re.Pattern[str]
    tail: re.Pattern[str]


def tail(*tags: Sequence[str]) -> re.Pattern[str]:
    """A text's end that is the start of one of ``tags``, each a sequence of regex atoms
    (one character, or a starred class), as far as the text goes."""

    def started(atoms: Sequence[str]) -> str:
        return atoms[0] + "".join("(?:" + a for a in atoms[1:]) + ")?" * (len(atoms) - 1)

    return re.compile("(?:" + "|".join(started(t) for t in tags) + r")\Z", re.DOTALL)


def chars(tag: str) -> list[str]:
    return [re.escape(c) for c in tag]


class XmlDialect(NamedTuple):
    """What one XML format's reader does differently.

    ``head(reader)`` finds the next call's name when no call is open: ``(name, end)`` with
    ``end`` where its parameters start, or None to wait (it may call ``reader.give_up()``).
    ``key``: a parameter's opening (its name in group 1); ``call_end``: what ends a call
    besides its last parameter (None: the body's end does); ``value_end``: what ends a value.
    ``strip_keys``: a key's blanks are not part of it. ``newline_markup``: a value's one
    leading and one trailing newline are the template's, not the value's. ``name_first``:
    the body's first call's name is the text before its first tag (kept while it forms).
    """

    head: Callable[[XmlBodyReader], tuple[str, int] | None]
    key: Search
    call_end: Search | None
    value_end: Search
    strip_keys: bool
    newline_markup: bool
    name_first: bool


_HOLD_LT = 64  # a '<' this close to the end may still open a closing tag
_TRIM_AT = 1024  # drop text no longer needed once there is this much (a copy per 1024 characters)


class XmlBodyReader:
    """One XML tool-call body; ``feed(text)`` returns the events that text makes safe to
    send. ``calls``, ``args[k]`` and ``done[k]`` as in ``BodyReader``."""

    __slots__ = (
        "dialect", "calls", "done", "_buf", "_pos", "_scanned", "_kept", "_args",
        "_tools", "_props", "_keys", "_value", "_opening", "_dead",
    )  # fmt: skip

    def __init__(self, dialect: XmlDialect, tools: Tools) -> None:
        self.dialect = dialect
        self.calls = 0
        self.done: list[bool] = []
        self._buf = ""  # the text still needed (``_trim``)
        self._pos = 0  # where the pending step's text starts in _buf (0 once trimmed past)
        self._scanned = 0  # where its search resumes: no tag can start before
        self._kept: list[str] = []  # its text trimmed from _buf that it still needs
        self._args: list[list[str]] = []  # each call's arguments sent so far, in pieces
        self._tools = tools
        self._props: Mapping[str, Any] = {}
        self._keys: set[str] = set()  # the current call's keys so far
        self._value: _Value | None = None  # the parameter value being read
        self._opening: str | None = None  # the body's first non-blank character, once seen
        self._dead = False

    @property
    def args(self) -> list[str]:
        """Each call's ``arguments`` sent so far; joined on each read (read it at a close)."""
        return ["".join(parts) for parts in self._args]

    def feed(self, text: str) -> list[Event]:
        if self._dead:
            return []  # the caller sends the rest from the parse at the close
        if self._opening is None:
            self._opening = text.lstrip()[:1] or None
        self._buf += text  # short: _trim keeps only what is still needed
        events: list[Event] = []
        while not self._dead and self._step(events):
            pass
        self._trim()
        return events if len(events) < 2 else _merged(events)

    def _step(self, events: list[Event]) -> bool:
        """Read what the buffer allows of one step; False when it waits for more text."""
        if self._value is not None:
            return self._read_value(self._value, events)
        if self.calls and not self.done[-1]:
            return self._between_params(events)
        return self._head(events)

    def find(self, *searches: Search) -> list[re.Match[str] | None]:
        """Each search's first tag from where the last ones stopped. When none is found, the
        next feed resumes at the first place whose text to the end may still grow into one."""
        buf, start = self._buf, self._scanned
        found = [s.tag.search(buf, start) for s in searches]
        if not any(found):
            no_lt = buf.find("<", start) < 0  # every tag starts with '<'
            self._scanned = len(buf) if no_lt else min(_tail_start(s, buf, start) for s in searches)
        return found

    def _move(self, to: int) -> None:
        """The next step starts at ``to`` (a search from there, nothing kept)."""
        self._pos = self._scanned = to
        self._kept = []

    def _trim(self) -> None:
        """Drop the text before what the pending step still needs: where its search resumes,
        and for a string value its unsent text and last _HOLD_LT characters (``_safe_end``).
        A typed value and a name-first head are read whole at their end: their text goes to _kept."""
        value, cut = self._value, self._scanned
        streaming = value if value is not None and value.types is None else None
        if streaming is not None:  # its held blanks (sent to seen) go to its own pieces
            cut = min(cut, max(streaming.sent, streaming.seen), len(self._buf) - _HOLD_LT)
        if cut < _TRIM_AT:
            return  # not yet worth a copy
        cut -= 1  # the character before stays: a tag at a line start looks back at it
        if (value is not None and streaming is None) or (self.dialect.name_first and not self.calls):
            self._kept.append(self._buf[self._pos : cut])
        if streaming is not None and cut > streaming.sent:
            streaming.blanks.append(self._buf[streaming.sent : cut])
            streaming.sent = cut
        self._buf = self._buf[cut:]
        # Past the step's start, _pos is 0: _safe_end's window (the last _HOLD_LT characters,
        # which a cut always leaves) then starts inside _buf, as it did in the whole text.
        self._pos = max(self._pos - cut, 0)
        self._scanned -= cut
        if streaming is not None:
            streaming.sent -= cut
            streaming.seen = max(streaming.seen - cut, 0)

    # --- a call's name ----------------------------------------------------------------

    def step_text(self, end: int) -> str:
        """The pending step's text up to ``end`` in the buffer, what was trimmed of it included."""
        return "".join(self._kept) + self._buf[self._pos : end]

    @property
    def opening(self) -> str | None:
        """The body's first non-blank character, once seen."""
        return self._opening

    def give_up(self) -> None:
        """A layout this reader does not follow: the parse at the close sends the rest."""
        self._dead = True

    def _head(self, events: list[Event]) -> bool:
        head = self.dialect.head(self)
        if head is None:
            return False
        name, end = head
        if not name or "<" in name:
            self._dead = True
            return False
        events.append((self.calls, name, ""))
        self.calls += 1
        self._args.append([])
        self.done.append(False)
        self._props = properties_of(self._tools, name)
        self._keys = set()
        self._move(end)
        return True

    # --- between parameters -------------------------------------------------------------

    def _between_params(self, events: list[Event]) -> bool:
        dialect = self.dialect
        if dialect.call_end is None:
            [key], end = self.find(dialect.key), None
        else:
            key, end = self.find(dialect.key, dialect.call_end)
        if end is not None and (key is None or end.start() < key.start()):
            self._send(("}" if self._keys else "{}"), events)
            self.done[-1] = True
            self._move(end.end())
            return True
        if key is None:
            return False
        name = key.group(1).strip() if dialect.strip_keys else key.group(1)
        if name in self._keys:
            self._dead = True  # the parse keeps the first place and the last value
            return False
        self._open_value(name, key.end(), events)
        return True

    def _open_value(self, name: str, at: int, events: list[Event]) -> None:
        prop = self._props.get(name)
        types = schema_types(prop) if isinstance(prop, Mapping) else {"string"}
        self._send(("{" if not self._keys else ", ") + json.dumps(name, ensure_ascii=False) + ": ", events)
        self._keys.add(name)
        self._move(at)
        self._value = _Value(types if types != {"string"} else None, at, fresh=self.dialect.newline_markup)
        if self._value.types is None:
            self._send('"', events)

    # --- one value ------------------------------------------------------------------------

    def _read_value(self, value: _Value, events: list[Event]) -> bool:
        buf, pos = self._buf, self._pos
        if value.fresh and len(buf) > pos:
            value.fresh = False
            value.sent += buf[pos] == "\n"  # a value's leading newline is markup
        [end] = self.find(self.dialect.value_end)
        if end is None:
            if value.types is None:  # not past where the end tag may still form (find's resume)
                self._stream(value, min(_safe_end(buf, pos), self._scanned), events)
            return False
        if value.types is None:
            rest = value.held() + buf[value.sent : end.start()]
            if self.dialect.newline_markup and rest.endswith("\n"):
                rest = rest[:-1]  # the parse trims the last newline
            self._send(json.dumps(rest, ensure_ascii=False)[1:-1] + '"', events)
        else:
            raw = "".join(self._kept) + buf[pos : end.start()]
            text = trim_newlines(raw) if self.dialect.newline_markup else raw
            self._send(json.dumps(coerce_value(text, value.types), ensure_ascii=False), events)
        self._value = None
        self._move(end.end())
        return True

    def _stream(self, value: _Value, end: int, events: list[Event]) -> None:
        """Send an open string value's text to ``end`` that the parse will keep: all but its
        trailing blanks (which may be the last newline of a Qwen3 value, or the end of a body
        whose close strips them). Only the text not looked at before is scanned for blanks."""
        start = max(value.sent, value.seen)
        kept = len(self._buf[start:end].rstrip())
        value.seen = max(end, start)
        if kept:
            piece = value.held() + self._buf[value.sent : start + kept]
            self._send(json.dumps(piece, ensure_ascii=False)[1:-1], events)
            value.sent = start + kept

    def _send(self, piece: str, events: list[Event]) -> None:
        if piece:
            self._args[-1].append(piece)
            events.append((self.calls - 1, None, piece))


class _Value:
    """A parameter value being read: its schema types (None: a string, streamed), where
    its unsent text starts in the buffer, whether its first character is still to come (a
    value whose newlines are markup drops a leading one), and for a string its held blanks:
    those trimmed from the buffer (``blanks``, before ``sent``) and where the text not yet
    looked at starts (``seen``; from ``sent`` to there, all blank)."""

    __slots__ = ("types", "sent", "fresh", "seen", "blanks")

    def __init__(self, types: set[str] | None, sent: int, *, fresh: bool) -> None:
        self.types, self.sent, self.fresh = types, sent, fresh
        self.seen = sent
        self.blanks: list[str] = []

    def held(self) -> str:
        """The held blanks trimmed from the buffer, taken: they go out with what follows them."""
        text = "".join(self.blanks)
        self.blanks = []
        return text


def _safe_end(buf: str, start: int) -> int:
    """Where the text that cannot become a closing tag ends: before a '<' near the end."""
    lt = buf.rfind("<", max(start, len(buf) - _HOLD_LT))
    return len(buf) if lt < 0 or ">" in buf[lt:] else lt


def _tail_start(search: Search, buf: str, start: int) -> int:
    """The first place from ``start`` whose text to the end may still grow into ``search``'s tag."""
    tail = search.tail.search(buf, start)
    return len(buf) if tail is None else tail.start()


def _merged(events: list[Event]) -> list[Event]:
    """One ``arguments`` event per call and feed: each run of pieces joined once."""
    out: list[Event] = []
    for (k, is_args), run in groupby(events, key=lambda e: (e[0], e[1] is None)):
        if is_args:
            out.append((k, None, "".join(e[2] for e in run)))
        else:
            out.extend(run)
    return out
