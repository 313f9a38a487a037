"""Kimi K3: tool calls as XTML elements in the ``tools`` channel, each value typed by its tag.

::

    <|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" type="string"<|sep|>東京<|close|>argument<|sep|><|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>

``<|open|>``, ``<|close|>`` and ``<|sep|>`` are special tokens (a request with tools keeps
special tokens in its text). A body is the ``tools`` channel: ``call`` elements whose
``tool`` attribute names the function, holding ``argument`` elements. A value of
``type="string"`` is its raw text; any other type is JSON (number, boolean, null, object,
array), kept as text where it does not read as JSON (as vLLM 0.33's ``kimi_k3`` parser
keeps it). Attribute values escape ``&`` and ``"`` (``&amp;``, ``&quot;``). An empty
channel is no call. The reader sends a call's name at its ``<|open|>call ...<|sep|>``, each
argument whole at its ``<|close|>argument<|sep|>`` (a string's end cannot be told before its
close marker: its text is raw), and the call's ``}`` at ``<|close|>call<|sep|>``.

Reasoning is the ``think`` channel (``<|open|>think<|sep|>`` ... ``<|close|>think<|sep|>``),
opened by the generation prompt when thinking is on.

Limits, both the format's and this preset's:

1. The reply's text is a ``response`` channel, ``<|open|>response<|sep|>`` ...
   ``<|close|>response<|sep|>``, and the message ends ``<|close|>message<|sep|>``. A preset
   names reasoning and tool markers only, so these framing markers are not yet taken out
   of the content: the core needs markers that a reply drops (see docs/vllm.md).
2. A string value's text is raw, so a value that holds ``<|close|>argument<|sep|>`` as
   ordinary tokens reads as the argument's end: only the token ids tell the control
   tokens from the text (CanIToolCall's ``k3-control-marker-text-in-value``).

Written from CanIToolCall 0.1.1's Kimi K3 fixtures and vLLM 0.33's
``vllm/tool_parsers/kimi_k3_tool_parser.py``; tested without Kimi K3's tokenizer, which no
PyPI package ships (``tests/families/test_kimi_k3.py``).

>>> parse('<|open|>call tool="f" index="1"<|sep|><|open|>argument key="n" type="number"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>')
[('f', '{"n": 3}')]
"""

from __future__ import annotations

import json
import re

from ._format import Event, Family, Preset, ToolFormat, Tools

__all__ = ["FAMILY", "KimiK3BodyReader", "in_open_argument", "parse"]

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
_ARG_CLOSE = CLOSE + "argument" + SEP
_CALL_CLOSE = CLOSE + "call" + SEP
_ATTRS = r"((?:(?!<\|sep\|>)[^<])*)"
_CALL_OPEN = re.compile(r"<\|open\|>\s*call\s+" + _ATTRS + r"<\|sep\|>")
_ARG_OPEN = re.compile(r"<\|open\|>\s*argument\s+" + _ATTRS + r"<\|sep\|>")
_ATTR = re.compile(r'(\w+)="([^"]*)"')
_BLANK = " \t\r\n"


def attributes(text: str) -> dict[str, str]:
    """An element's attributes, their ``&quot;`` and ``&amp;`` undone (in that order, the
    reverse of the template's escaping).

    >>> attributes('key="q&amp;a" type="string"')
    {'key': 'q&a', 'type': 'string'}
    """
    return {k: v.replace("&quot;", '"').replace("&amp;", "&") for k, v in _ATTR.findall(text)}


def _value_json(raw: str, kind: str) -> str:
    """A value's JSON by its ``type`` attribute: a string as written, any other type as
    JSON where it reads as JSON, else as its text."""
    if kind != "string":
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False)
        except ValueError:
            pass
    return json.dumps(raw, ensure_ascii=False)


class KimiK3BodyReader:
    """One ``tools`` channel as it streams (``BodyReader``; see the module for what goes
    when). ``error`` says why the reader stopped, if it did: the parse raises with it."""

    __slots__ = ("calls", "done", "error", "names", "_args", "_buf", "_scan", "_arg", "_kept", "_keys")

    def __init__(self) -> None:
        self.calls = 0
        self.done: list[bool] = []
        self.error: str | None = None
        self.names: list[str] = []
        self._args: list[list[str]] = []
        self._buf = ""  # the text not yet read
        self._scan = 0  # no marker starts in _buf before this
        self._arg: tuple[str, str] | None = None  # the open argument's key and type
        self._kept: list[str] = []  # the open argument's text trimmed from _buf
        self._keys = 0  # the open call's arguments so far

    @property
    def args(self) -> list[str]:
        return ["".join(parts) for parts in self._args]

    @property
    def idle(self) -> bool:
        """No call or argument is open and only blanks wait: the body may end here."""
        return self._arg is None and (not self.calls or self.done[-1]) and not self._buf.strip(_BLANK)

    def feed(self, text: str) -> list[Event]:
        if self.error is not None:
            return []  # the parse at the close reports it
        self._buf += text
        events: list[Event] = []
        while self.error is None and self._step(events):
            pass
        return events

    def _step(self, events: list[Event]) -> bool:
        if self._arg is not None:
            return self._value(self._arg, events)
        if self.calls and not self.done[-1]:
            return self._in_call(events)
        return self._head(events)

    def _head(self, events: list[Event]) -> bool:
        m = _CALL_OPEN.search(self._buf, self._scan)
        if m is None:
            return self._wait_for_markup()
        name = attributes(m.group(1)).get("tool", "")
        if not name or self._buf[: m.start()].strip(_BLANK):
            self.error = f"not a Kimi K3 call: {self._buf[: m.end()][:60]!r}"
            return False
        events.append((self.calls, name, ""))
        self.names.append(name)
        self.calls += 1
        self._args.append([])
        self.done.append(False)
        self._keys = 0
        self._cut(m.end())
        return True

    def _in_call(self, events: list[Event]) -> bool:
        buf = self._buf
        m = _ARG_OPEN.search(buf, self._scan)
        end = buf.find(_CALL_CLOSE, self._scan)
        if end >= 0 and (m is None or end < m.start()):
            if buf[:end].strip(_BLANK):
                self.error = f"text in a call: {buf[:end][:60]!r}"
                return False
            self._send("}" if self._keys else "{}", events)
            self.done[-1] = True
            self._cut(end + len(_CALL_CLOSE))
            return True
        if m is None:
            return self._wait_for_markup()
        attrs = attributes(m.group(1))
        if "key" not in attrs or buf[: m.start()].strip(_BLANK):
            self.error = f"not a Kimi K3 argument: {buf[: m.end()][:60]!r}"
            return False
        self._arg = (attrs["key"], attrs.get("type", "string"))
        self._cut(m.end())
        return True

    def _value(self, arg: tuple[str, str], events: list[Event]) -> bool:
        buf = self._buf
        end = buf.find(_ARG_CLOSE, self._scan)
        if end < 0:  # keep what may begin the close marker; the rest is the value's
            keep = len(buf) - max(len(_ARG_CLOSE) - 1, 0)
            if keep > 0:
                self._kept.append(buf[:keep])
                self._buf = buf[keep:]
            self._scan = 0
            return False
        raw = "".join(self._kept) + buf[:end]
        self._kept = []
        key, kind = arg
        self._send(
            ("{" if not self._keys else ", ") + json.dumps(key, ensure_ascii=False) + ": " + _value_json(raw, kind), events
        )
        self._keys += 1
        self._arg = None
        self._cut(end + len(_ARG_CLOSE))
        return True

    def _wait_for_markup(self) -> bool:
        """No complete tag yet: the next search starts where one may still be forming (the
        last ``<|open|>`` or ``<|close|>``, or a start of one at the end)."""
        buf, scan = self._buf, self._scan
        at = max(buf.rfind(OPEN, scan), buf.rfind(CLOSE, scan))
        if at < 0:
            lt = buf.rfind("<", scan)
            at = lt if lt >= 0 and (OPEN.startswith(buf[lt:]) or CLOSE.startswith(buf[lt:])) else len(buf)
        self._scan = at
        return False

    def _cut(self, at: int) -> None:
        self._buf = self._buf[at:]
        self._scan = 0

    def _send(self, piece: str, events: list[Event]) -> None:
        self._args[-1].append(piece)
        events.append((self.calls - 1, None, piece))


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    """Every call of a ``tools`` channel (none for an empty one); ``ValueError`` for a
    channel that is not calls, or a call or argument left open."""
    reader = KimiK3BodyReader()
    reader.feed(body)
    if reader.error is not None:
        raise ValueError(reader.error)
    if not reader.idle:
        raise ValueError("a Kimi K3 call or argument left open, or text after the last call")
    return list(zip(reader.names, reader.args))


def in_open_argument(body: str) -> bool:
    """Whether the end of ``body`` (the channel's text so far) is inside an argument's
    value, where a marker is the value's text (``ToolFormat.marker_is_text``).

    >>> in_open_argument('<|open|>call tool="w" index="1"<|sep|><|open|>argument key="t" type="string"<|sep|>end with ')
    True
    """
    return body.rfind(OPEN + "argument") > body.rfind(_ARG_CLOSE)


FAMILY = Family(
    ToolFormat("kimi_k3", parse, lambda tools: KimiK3BodyReader(), keeps_special_tokens=True, marker_is_text=in_open_argument),
    (Preset("kimi_k3", OPEN + "think" + SEP, CLOSE + "think" + SEP, OPEN + "tools" + SEP, CLOSE + "tools" + SEP),),
)
