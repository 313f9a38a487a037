"""DeepSeek V3.2 and V4: DSML tool calls, ``invoke`` blocks of ``parameter`` values.

::

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">東京</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

V3.2 writes the same body in a ``<｜DSML｜function_calls>`` wrapper (preset ``deepseek_v32``),
V4 in ``<｜DSML｜tool_calls>`` (``deepseek_v4``); V4.1 spells every tag with a space after
``｜DSML｜`` and wraps them in ``<｜DSML｜ calls>`` (``deepseek_v41.py``, the same grammar).
DeepSeek's encoders (vLLM's ``tokenizers/deepseek_v*_encoding.py``) write a value as is when
``string="true"``, and as JSON otherwise. The grammar, as vLLM 0.33's ``deepseek_v4`` parser
reads it:

1. A value runs to its ``</｜DSML｜parameter>``, whatever it holds: a marker written inside a
   value (``<｜DSML｜invoke name="x">``, the wrapper's close tag) is text of the value
   (the format's ``marker_is_text``).
2. ``string="true"``: the value is the text, kept exactly (blanks and newlines included).
   Any other ``string`` (or none): the text read as JSON, or kept as text where it is not
   JSON (``NaN`` and ``Infinity`` are not).
3. Between tags only blanks; anything else, a value whose close tag never comes, a key
   given twice or a body with no ``invoke`` is malformed (``ValueError``), as DeepSeek's
   own reference parser asserts.

The presets' opening tags begin with the two newlines DeepSeek's encoders write before every
calls block (``content + "\\n\\n" + block``, after text, after ``</think>`` and at the
reply's start alike): they are the block's markup, not the reply's text, as DeepSeek's
reference parser strips them. A block opened without them (SGLang's tests record one) opens
by its wrapper tag alone (the preset's ``bare_open``), and the body then begins with it.
An ``invoke`` may close itself (``<｜DSML｜invoke name="f"/>``: no parameters), as SGLang
reports V4 writing for a tool without arguments (DeepSeek's reference parser refuses it).

``｜DSML｜`` is one token in DeepSeek V4's vocabulary (id 128825, not special: it stays in
the text with ``skip_special_tokens``). Not read, as vLLM reads them: the opening
misspellings ``<｜DSML｜toolcalls>``/``<｜DSML｜tool>`` and an ``invoke`` without its wrapper.

>>> body = '<｜DSML｜invoke name="f">\\n<｜DSML｜parameter name="n" string="false">3</｜DSML｜parameter>\\n</｜DSML｜invoke>'
>>> FAMILY.format.parse(body, None)
[('f', '{"n": 3}')]
>>> r = FAMILY.format.reader(None)
>>> r.feed('<｜DSML｜invoke name="f">\\n<｜DSML｜parameter name="s" string="true">東')
[(0, 'f', ''), (0, None, '{"s": "東')]
>>> r.feed('京</｜DSML｜parameter>\\n</｜DSML｜invoke>')
[(0, None, '京"}')]
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from ._format import Event, Family, Preset, ToolFormat, Tools

__all__ = [
    "BLOCK_LEAD",
    "DSML",
    "FAMILY",
    "DsmlBodyReader",
    "Grammar",
    "dsml_format",
    "dsml_preset",
    "grammar",
    "in_value",
    "parse_dsml",
    "value_of",
]

DSML = "｜DSML｜"

#: What DeepSeek's encoders write between a reply's text and its calls block (``content +
#: "\n\n" + block``): the block's, so the presets' opening tags begin with it.
BLOCK_LEAD = "\n\n"

_BLANK = re.compile(r"\s*")


class Grammar(NamedTuple):
    """One spelling of DSML's tags: ``space`` goes between ``｜DSML｜`` and each tag's word."""

    wrappers: tuple[str, ...]  # the calls block's opening tags (a body may begin with one)
    invoke: re.Pattern[str]  # an invoke's opening tag: the function's name in group 1, "/" in 2
    invoke_head: str  # the fixed start of that tag
    invoke_close: str
    param: re.Pattern[str]  # a parameter's opening tag: its key in group 1, ``string`` in group 2
    param_head: str
    param_close: str


def grammar(space: str, wrappers: tuple[str, ...]) -> Grammar:
    """The tags of the DSML spelled with ``space`` (``""``: V3.2 and V4; ``" "``: V4.1),
    in a calls block opened by one of ``wrappers``."""
    invoke, param = f"<{DSML}{space}invoke", f"<{DSML}{space}parameter"
    return Grammar(
        wrappers,
        re.compile(re.escape(invoke) + r'\s+name="([^"]*)"\s*(/?)>'),
        invoke,
        f"</{DSML}{space}invoke>",
        re.compile(re.escape(param) + r'\s+name="([^"]*)"(?:\s+string="([^"]*)")?\s*>'),
        param,
        f"</{DSML}{space}parameter>",
    )


def value_of(text: str, string: str | None) -> Any:
    """A parameter's value (rule 2): the text itself when ``string="true"``, else its JSON."""
    if string == "true":
        return text
    try:
        return json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):  # not JSON, or nested past what the decoder reads
        return text


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_dsml(g: Grammar, body: str) -> list[tuple[str, str]]:
    """A finished body's calls (rules 1-3): ``[(name, arguments_json), ...]``."""
    calls = []
    pos = _BLANK.match(body).end()  # type: ignore[union-attr]  # \s* always matches
    wrapper = next((w for w in g.wrappers if body.startswith(w, pos)), "")
    pos = _BLANK.match(body, pos + len(wrapper)).end()  # type: ignore[union-attr]
    while pos < len(body):
        m = g.invoke.match(body, pos)
        if m is None or not m.group(1):
            raise ValueError(f'expected {g.invoke_head} name="..."> at {pos}, not {body[pos : pos + 30]!r}')
        params, pos = ({}, m.end()) if m.group(2) else _params(g, body, m.end())
        calls.append((m.group(1), json.dumps(params, ensure_ascii=False)))
        pos = _BLANK.match(body, pos).end()  # type: ignore[union-attr]
    if not calls:
        raise ValueError(f"no {g.invoke_head} in the body")
    return calls


def _params(g: Grammar, body: str, pos: int) -> tuple[dict[str, Any], int]:
    """One invoke's parameters from ``pos``, and where its close tag ends."""
    params: dict[str, Any] = {}
    while True:
        pos = _BLANK.match(body, pos).end()  # type: ignore[union-attr]
        if body.startswith(g.invoke_close, pos):
            return params, pos + len(g.invoke_close)
        m = g.param.match(body, pos)
        if m is None:
            raise ValueError(f"expected {g.param_head} or {g.invoke_close} at {pos}, not {body[pos : pos + 30]!r}")
        end = body.find(g.param_close, m.end())
        if end < 0:
            raise ValueError(f"parameter {m.group(1)!r} has no {g.param_close}")
        if m.group(1) in params:
            raise ValueError(f"parameter {m.group(1)!r} given twice")
        params[m.group(1)] = value_of(body[m.end() : end], m.group(2))
        pos = end + len(g.param_close)


def in_value(g: Grammar, body: str) -> bool:
    """Whether the text right after ``body`` (a body's text so far) is inside a parameter
    value (rule 1): a marker there is text of the value."""
    pos = 0
    while (m := g.param.search(body, pos)) is not None:
        end = body.find(g.param_close, m.end())
        if end < 0:
            return True
        pos = end + len(g.param_close)
    return False


class _Value:
    """The parameter value being read: its ``string`` attribute, and a typed value's text
    so far (a string value streams, and keeps none)."""

    __slots__ = ("string", "pieces")

    def __init__(self, string: str | None) -> None:
        self.string = string
        self.pieces: list[str] = []


class DsmlBodyReader:
    """One DSML body as it streams (``BodyReader``): a call's name once its ``invoke`` tag
    is complete, its arguments JSON as its parameters come. A ``string="true"`` value
    streams as it forms (all but a tail that may still become its close tag); any other
    value goes whole at its close tag, read as the parse reads it. Text that breaks rule 3
    stops the reading; the parse at the close reports the body.

    ``_buf`` holds only text not yet read: blanks are dropped, a tag still forming is
    kept from its ``<``, a value's text leaves as it is read (a typed one to its pieces).
    """

    __slots__ = ("grammar", "calls", "done", "_args", "_buf", "_keys", "_value", "_wrapped", "_dead")

    def __init__(self, g: Grammar) -> None:
        self.grammar = g
        self.calls = 0
        self.done: list[bool] = []
        self._args: list[list[str]] = []  # each call's arguments sent so far, in pieces
        self._buf = ""
        self._keys: set[str] = set()  # the open call's keys so far
        self._value: _Value | None = None
        self._wrapped = False  # the body's opening wrapper tag was read (or cannot come)
        self._dead = False

    @property
    def args(self) -> list[str]:
        return ["".join(parts) for parts in self._args]

    def feed(self, text: str) -> list[Event]:
        if self._dead:
            return []
        self._buf += text
        events: list[Event] = []
        while not self._dead and (self._read_value(self._value, events) if self._value else self._read_tag(events)):
            pass
        return events

    def _read_tag(self, events: list[Event]) -> bool:
        """The next tag: the wrapper at the body's start, an ``invoke`` between calls; a
        parameter or the invoke's close in one."""
        buf, g = self._buf, self.grammar
        at = _BLANK.match(buf).end()  # type: ignore[union-attr]
        self._buf = buf = buf[at:]
        if not buf:
            return False
        if self.calls and not self.done[-1]:
            return self._in_call(buf, events)
        m = g.invoke.match(buf)
        if m is not None:
            self._buf, self._wrapped = buf[m.end() :], True
            self._open_call(m.group(1), events)
            if m.group(2) and not self._dead:  # self-closing: no parameters
                self._end_call(events)
            return not self._dead
        heads: tuple[str, ...] = (g.invoke_head,)
        if not self._wrapped:
            wrapper = next((w for w in g.wrappers if buf.startswith(w)), None)
            if wrapper is not None:
                self._buf, self._wrapped = buf[len(wrapper) :], True
                return True
            heads += g.wrappers
        self._dead = not any(_may_become(buf, head) for head in heads)
        return False

    def _in_call(self, buf: str, events: list[Event]) -> bool:
        """Inside an invoke: a parameter, or the invoke's close tag."""
        g = self.grammar
        if buf.startswith(g.invoke_close):
            self._buf = buf[len(g.invoke_close) :]
            self._end_call(events)
            return True
        m = g.param.match(buf)
        if m is not None:
            self._buf = buf[m.end() :]
            self._open_value(m.group(1), m.group(2), events)
            return not self._dead
        self._dead = not (_may_become(buf, g.param_head) or _may_become(buf, g.invoke_close))
        return False

    def _open_call(self, name: str, events: list[Event]) -> None:
        if not name:
            self._dead = True
            return
        events.append((self.calls, name, ""))
        self.calls += 1
        self._args.append([])
        self.done.append(False)
        self._keys = set()

    def _end_call(self, events: list[Event]) -> None:
        self._send("}" if self._keys else "{}", events)
        self.done[-1] = True

    def _open_value(self, key: str, string: str | None, events: list[Event]) -> None:
        if key in self._keys:
            self._dead = True  # rule 3: the parse rejects the body
            return
        self._send(("{" if not self._keys else ", ") + json.dumps(key, ensure_ascii=False) + ": ", events)
        self._keys.add(key)
        self._value = _Value(string)
        if string == "true":
            self._send('"', events)

    def _read_value(self, value: _Value, events: list[Event]) -> bool:
        buf, close = self._buf, self.grammar.param_close
        end = buf.find(close)
        if end < 0:
            # Keep a tail that may still become the close tag (its only '<' is its first).
            lt = buf.rfind("<", max(0, len(buf) - len(close) + 1))
            cut = lt if lt >= 0 and close.startswith(buf[lt:]) else len(buf)
            if value.string == "true":
                self._send(json.dumps(buf[:cut], ensure_ascii=False)[1:-1], events)
            else:
                value.pieces.append(buf[:cut])
            self._buf = buf[cut:]
            return False
        if value.string == "true":
            self._send(json.dumps(buf[:end], ensure_ascii=False)[1:-1] + '"', events)
        else:
            text = "".join(value.pieces) + buf[:end]
            self._send(json.dumps(value_of(text, value.string), ensure_ascii=False), events)
        self._value = None
        self._buf = buf[end + len(close) :]
        return True

    def _send(self, piece: str, events: list[Event]) -> None:
        """A piece of the open call's arguments; one event per call and feed."""
        if not piece:
            return
        self._args[-1].append(piece)
        k = self.calls - 1
        if events and events[-1][0] == k and events[-1][1] is None:
            events[-1] = (k, None, events[-1][2] + piece)
        else:
            events.append((k, None, piece))


#: A tag still forming past this length is not read as it streams (its names would be
#: searched again on every piece): the parse at the close decides the body.
_TAG_MAX = 1024


def _may_become(text: str, head: str) -> bool:
    """Whether ``text`` (from a ``<``) may still grow into a tag that starts with ``head``:
    a prefix of ``head``, or ``head`` and attributes with no ``>`` outside quotes yet."""
    if len(text) <= len(head):
        return head.startswith(text)
    if not text.startswith(head) or head.startswith("</") or len(text) > _TAG_MAX:
        return False
    unquoted = re.sub(r'"[^"]*"', "", text[len(head) :]).split('"')[0]
    return ">" not in unquoted


def dsml_format(name: str, g: Grammar) -> ToolFormat:
    """The tool format of the DSML spelled as ``g``."""

    def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
        return parse_dsml(g, body)

    def marker_is_text(body: str) -> bool:
        return in_value(g, body)

    return ToolFormat(name, parse, lambda tools: DsmlBodyReader(g), marker_is_text=marker_is_text, call_close=g.invoke_close)


def dsml_preset(name: str, wrapper: str) -> Preset:
    """A DSML preset: the calls block opens with the encoders' two newlines and ``wrapper``
    (the newlines are markup), or with ``wrapper`` alone (then the body begins with it)."""
    close = wrapper.replace("<", "</", 1)
    return Preset(name, "<think>", "</think>", BLOCK_LEAD + wrapper, close, bare_open=wrapper)


_V4, _V32 = f"<{DSML}tool_calls>", f"<{DSML}function_calls>"

FAMILY = Family(
    dsml_format("deepseek_v4", grammar("", (_V4, _V32))),
    (dsml_preset("deepseek_v4", _V4), dsml_preset("deepseek_v32", _V32)),
)
