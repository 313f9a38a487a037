"""XML-style tool calls (Qwen3-Coder, GLM-4.5) read as they stream into OpenAI deltas.

The sibling of :class:`~detok_plugin.integrations._tool_stream.BodyReader` for the formats
whose arguments are tagged text (``detok_plugin._xml_calls``). :class:`XmlBodyReader` reads
one tool-call body piece by piece and returns what may be sent so far: the call's name once
its tag is complete, then its ``arguments`` JSON as the parameters arrive::

    <function=get_weather>         -> name "get_weather"
    <parameter=city>\\n東京           -> '{"city": "東京'  (a string value streams as it forms)
    \\n</parameter>                  -> '"'
    <parameter=days>\\n3\\n</parameter> -> ', "days": 3'   (a typed value goes at its close tag)
    </function>                    -> '}'

Rules, so that what was sent is always a prefix of the parse at the close
(``parse_tool_body(body, fmt, tools=...)``, ``json.dumps(..., ensure_ascii=False)``):

1. A value streams as it forms only if the request's schema makes it a string (the
   property's types are exactly ``string``, or the schema does not name it, or the request
   has no schema for the function); any other value is typed and sent whole at its close.
2. Text that may still become a closing tag, and a newline that may be the last one of a
   Qwen3 value (which the parse trims), are held until the next piece decides.
3. A layout this reader does not follow (a key given twice, a JSON body) stops the
   streaming; the caller sends the rest from the parse at the close.

>>> r = XmlBodyReader("qwen3_xml", None)
>>> r.feed("<function=get_weather>\\n<parameter=city>\\n東")
[(0, 'get_weather', ''), (0, None, '{"city": "東')]
>>> r.feed("京\\n</parameter>\\n</function>")
[(0, None, '京"}')]
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from detok_plugin._xml_calls import coerce_value, properties_of, schema_types, trim_newlines

__all__ = ["XmlBodyReader"]

Event = tuple[int, "str | None", str]

_Q_FUNCTION = re.compile(r"<function=([^>]*)>")
_Q_PARAM = re.compile(r"<\s*parameter\s*=\s*([^>]*)>")
_Q_FUNC_END = re.compile(r"</function>|(?=<function=)")
_Q_VALUE_END = re.compile(r"<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=)|(?=</function>)|(?=<function=)")
_G_KEY = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>", re.DOTALL)
_G_VALUE_END = re.compile(r"</arg_value>")
_HOLD_LT = 64  # a '<' this close to the end may still open a closing tag


class XmlBodyReader:
    """One XML tool-call body; ``feed(text)`` returns the events that text makes safe to
    send. ``calls``, ``args[k]`` and ``done[k]`` as in ``BodyReader``."""

    __slots__ = ("fmt", "buf", "pos", "calls", "args", "done", "_tools", "_props", "_keys", "_value", "_dead")

    def __init__(self, fmt: Literal["qwen3_xml", "glm45"], tools: Sequence[Mapping[str, Any]] | None) -> None:
        self.fmt = fmt
        self.buf = ""
        self.pos = 0
        self.calls = 0
        self.args: list[str] = []
        self.done: list[bool] = []
        self._tools = tools
        self._props: Mapping[str, Any] = {}
        self._keys: list[str] = []  # the current call's keys so far
        self._value: _Value | None = None  # the parameter value being read
        self._dead = False

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        events: list[Event] = []
        while not self._dead:
            before = self._mark()
            if self._value is not None:
                self._read_value(events)
            elif self.calls and not self.done[-1]:
                self._between_params(events)
            else:
                self._head(events)
            if self._mark() == before:
                break
        return events

    def _mark(self) -> tuple[int, int, int, bool]:
        """Where the reader stands: unchanged after a step means it waits for more text."""
        return self.pos, self.calls, len(self.args[-1]) if self.args else -1, self._value is None

    # --- a call's name ----------------------------------------------------------------

    def _head(self, events: list[Event]) -> None:
        if self.fmt == "glm45":
            if self.calls:
                return  # one call per GLM body
            at = self.buf.find("<arg_key>")
            if at < 0:
                return
            name = self.buf[:at].strip()
            self.pos = at
        else:
            if self.calls == 0 and self.buf.lstrip().startswith("{"):
                self._dead = True  # a JSON body: sent whole at the close
                return
            m = _Q_FUNCTION.search(self.buf, self.pos)
            if m is None:
                return
            name = m.group(1).strip()
            self.pos = m.end()
        if not name or "<" in name:
            self._dead = True
            return
        events.append((self.calls, name, ""))
        self.calls += 1
        self.args.append("")
        self.done.append(False)
        self._props = properties_of(self._tools, name)
        self._keys = []

    # --- between parameters -------------------------------------------------------------

    def _between_params(self, events: list[Event]) -> None:
        buf, pos = self.buf, self.pos
        key_re = _G_KEY if self.fmt == "glm45" else _Q_PARAM
        key = key_re.search(buf, pos)
        end = _Q_FUNC_END.search(buf, pos) if self.fmt == "qwen3_xml" else None
        if end is not None and (key is None or end.start() < key.start()):
            self._send(("}" if self._keys else "{}"), events)
            self.done[-1] = True
            self.pos = end.end()
            return
        if key is None:
            return
        name = key.group(1).strip() if self.fmt == "glm45" else key.group(1)
        if name in self._keys:
            self._dead = True  # the parse keeps the first place and the last value
            return
        prop = self._props.get(name)
        types = schema_types(prop) if isinstance(prop, Mapping) else {"string"}
        self._send(("{" if not self._keys else ", ") + json.dumps(name, ensure_ascii=False) + ": ", events)
        self._keys.append(name)
        self._value = _Value(key.end(), types if types != {"string"} else None)
        if self._value.types is None:
            self._send('"', events)
        self.pos = key.end()

    # --- one value ------------------------------------------------------------------------

    def _read_value(self, events: list[Event]) -> None:
        value = self._value
        assert value is not None
        buf = self.buf
        end_re = _G_VALUE_END if self.fmt == "glm45" else _Q_VALUE_END
        end = end_re.search(buf, value.start)
        if end is None:
            if value.types is None:
                self._stream(buf[value.start : _safe_end(buf, value.start)], events)
            return
        raw = buf[value.start : end.start()]
        text = raw if self.fmt == "glm45" else trim_newlines(raw)
        if value.types is None:
            rest = text[value.sent :]
            self._send(json.dumps(rest, ensure_ascii=False)[1:-1] + '"', events)
        else:
            self._send(json.dumps(coerce_value(text, value.types), ensure_ascii=False), events)
        self._value = None
        self.pos = end.end()

    def _stream(self, raw: str, events: list[Event]) -> None:
        """Send the part of an open string value that the parse will keep."""
        value = self._value
        assert value is not None
        if self.fmt == "qwen3_xml":
            raw = raw[1:] if raw.startswith("\n") else raw  # the leading newline is markup
            raw = raw[:-1] if raw.endswith("\n") else raw  # may be the trailing one
        if len(raw) > value.sent:
            self._send(json.dumps(raw[value.sent :], ensure_ascii=False)[1:-1], events)
            value.sent = len(raw)

    def _send(self, piece: str, events: list[Event]) -> None:
        if piece:
            self.args[-1] += piece
            k = self.calls - 1
            if events and events[-1][0] == k and events[-1][1] is None:
                events[-1] = (k, None, events[-1][2] + piece)  # one event per call and feed
            else:
                events.append((k, None, piece))


class _Value:
    """A parameter value being read: where it starts in the buffer, its schema types
    (None: a string, streamed), and how many of its characters were sent."""

    __slots__ = ("start", "types", "sent")

    def __init__(self, start: int, types: set[str] | None) -> None:
        self.start, self.types, self.sent = start, types, 0


def _safe_end(buf: str, start: int) -> int:
    """Where the text that cannot become a closing tag ends: before a '<' near the end."""
    lt = buf.rfind("<", max(start, len(buf) - _HOLD_LT))
    return len(buf) if lt < 0 or ">" in buf[lt:] else lt
