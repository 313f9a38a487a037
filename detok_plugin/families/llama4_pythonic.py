"""Llama 4: a Python list of calls with keyword arguments, the whole reply.

::

    [get_weather(city="San Francisco", days=3), get_time(tz='東京')]

Meta's prompt format for Llama 4 asks for this list as the reply; the model may wrap it in
``<|python_start|>``/``<|python_end|>`` (special tokens, recognised by id where the text
drops them). Without the wrapper, a reply whose first non-blank character is ``[`` opens the
body (``bare_open``); a ``[`` after other text is text. The rules, as vLLM 0.33's
``llama4_pythonic`` parser reads the list (``vllm/tool_parsers/utils.py``):

1. The body is one list literal of calls; ``name(...)`` or a dotted ``a.b(...)``; a trailing
   ``<|python_end|>`` is the wrapper's. An empty list, anything after the list, a
   positional or ``**`` argument, a keyword given twice is malformed (vLLM drops positional
   arguments; a call without them is not the call the model wrote).
2. Values are Python literals read as JSON: strings, numbers, ``True``/``False``/``None``
   (and JSON's ``true``/``false``/``null``), lists, tuples and sets (as lists), dicts, a
   signed number, an f-string without placeholders. Anything else, and ``inf``, is malformed.
3. A raw newline, carriage return or NUL inside a string literal is that character (models
   write them; Python's parser refuses them).

>>> parse("[get_weather(city='LA', metric=\\"C\\"), ping()]")
[('get_weather', '{"city": "LA", "metric": "C"}'), ('ping', '{}')]
>>> r = FAMILY.format.reader(None)
>>> r.feed("[get_weather(city='L")
[(0, 'get_weather', '')]
>>> r.feed("A')]")
[(0, None, '{"city": "LA"}')]
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from ._format import Event, Family, Preset, ToolFormat, Tools

__all__ = ["FAMILY", "PYTHON_END", "PYTHON_START", "PythonicBodyReader", "call_json", "escape_controls", "parse"]

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"

_JSON_NAMES = {"true": True, "false": False, "null": None}
_CONTROLS = {"\n": "\\n", "\r": "\\r", "\x00": "\\x00"}


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    """A finished body's calls (rules 1-3): ``[(name, arguments_json), ...]``."""
    text = body.strip().removesuffix(PYTHON_END).rstrip()
    if not text.startswith("["):
        raise ValueError("a Llama 4 tool-call body is a list of calls: [f(a=1), ...]")
    tree = _expression(text)
    if not isinstance(tree, ast.List) or not tree.elts:
        raise ValueError("a Llama 4 tool-call body is a non-empty list of calls")
    return [_call(node) for node in tree.elts]


def call_json(text: str) -> tuple[str, str]:
    """One call's text (``name(...)``) as ``(name, arguments_json)``."""
    return _call(_expression(text))


def escape_controls(text: str) -> str:
    """``text`` with each raw newline, carriage return and NUL inside a string literal
    written as its escape (rule 3); the rest as it is."""
    if not any(c in text for c in _CONTROLS):
        return text
    out: list[str] = []
    quote, esc = "", False
    for c in text:
        if quote and not esc and c in _CONTROLS:
            out.append(_CONTROLS[c])
            continue
        out.append(c)
        quote, esc = _string_state(c, quote, esc)
    return "".join(out)


def _string_state(c: str, quote: str, esc: bool) -> tuple[str, bool]:
    """Whether the text after ``c`` is inside a string literal (its quote) and escaped."""
    if not quote:
        return (c, False) if c in "'\"" else ("", False)
    if esc:
        return quote, False
    if c == "\\":
        return quote, True
    return ("" if c == quote else quote), False


def _expression(text: str) -> ast.expr:
    try:
        return ast.parse(escape_controls(text), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not a Python expression: {exc}") from None


def _call(node: ast.expr) -> tuple[str, str]:
    if not isinstance(node, ast.Call):
        raise ValueError("each item of the list must be a call: name(key=value, ...)")
    if node.args:
        raise ValueError("a tool call takes keyword arguments only")
    args = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError("a tool call takes no **arguments")
        if kw.arg in args:
            raise ValueError(f"keyword argument {kw.arg!r} repeated")  # Python's compiler refuses it too
        args[kw.arg] = _literal(kw.value)
    try:
        return _name(node.func), json.dumps(args, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tool call arguments that are not JSON: {exc}") from None


def _name(func: ast.expr) -> str:
    """``name`` or a dotted ``a.b.name``."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        raise ValueError("a tool call's function must be a name")
    parts.append(func.id)
    return ".".join(reversed(parts))


def _literal(node: ast.expr) -> Any:
    """A value (rule 2) as the JSON value it stands for."""
    read = _LITERALS.get(type(node))
    value = read(node) if read is not None else _NOT
    if value is _NOT:
        raise ValueError(f"a tool call argument must be a literal, not {ast.dump(node)[:60]}")
    return value


_NOT = object()  # what a reader below returns for a node of its type that is no literal


def _constant(node: Any) -> Any:
    return node.value if node.value is None or isinstance(node.value, (str, int, float)) else _NOT


def _dict(node: Any) -> Any:
    if not all(isinstance(k, ast.Constant) and not isinstance(k.value, bytes) for k in node.keys):
        return _NOT  # a ** unpacking, or a key that is no literal
    return {k.value: _literal(v) for k, v in zip(node.keys, node.values)}


def _items(node: Any) -> Any:
    return [_literal(v) for v in node.elts]


def _json_name(node: Any) -> Any:
    return _JSON_NAMES.get(node.id, _NOT)


def _signed(node: Any) -> Any:
    if not isinstance(node.op, (ast.USub, ast.UAdd)):
        return _NOT
    value = _literal(node.operand)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return _NOT
    return -value if isinstance(node.op, ast.USub) else value


def _fstring(node: Any) -> Any:
    if not all(isinstance(v, ast.Constant) for v in node.values):
        return _NOT  # placeholders
    return "".join(str(v.value) for v in node.values)


_LITERALS: dict[type[ast.expr], Any] = {
    ast.Constant: _constant, ast.Dict: _dict, ast.List: _items, ast.Tuple: _items, ast.Set: _items,
    ast.Name: _json_name, ast.UnaryOp: _signed, ast.JoinedStr: _fstring,
}  # fmt: skip


# --- the reader ----------------------------------------------------------------------------

_START, _ITEM, _NAME, _ARGS, _AFTER, _END = range(6)
_PLAIN = re.compile(r"[^'\"\\()\[\]{}]+")  # text of a call that changes no bracket or string
_IN_STRING = {q: re.compile(rf"[^{q}\\]+") for q in "'\""}


class PythonicBodyReader:
    """One Llama 4 body as it streams (``BodyReader``): a call's name at its ``(``, its
    arguments JSON whole at its ``)`` (read as the parse reads it: a Python literal is
    JSON only once complete). Brackets are counted outside string literals, so a ``)`` or
    ``]`` inside a string is text. A layout rule 1 refuses stops the reading; the parse at
    the body's end reports it. Each character is looked at once; a call's text is kept in
    pieces until its ``)``.
    """

    __slots__ = ("calls", "done", "_args", "_phase", "_depth", "_quote", "_esc", "_name", "_call", "_dead")

    def __init__(self) -> None:
        self.calls = 0
        self.done: list[bool] = []
        self._args: list[str] = []
        self._phase = _START
        self._depth = 0  # brackets open inside the current call's parentheses
        self._quote, self._esc = "", False
        self._name: list[str] = []  # the name being read
        self._call: list[str] = []  # the current call's text, from its name
        self._dead = False

    @property
    def args(self) -> list[str]:
        return list(self._args)

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        pos = 0
        while pos < len(text) and not self._dead:
            if self._phase == _ARGS:
                pos = self._read_args(text, pos, events)
            elif self._phase == _NAME:
                pos = self._read_name(text, pos, events)
            elif self._phase == _END:
                break  # the parse judges what follows the list
            else:
                pos = self._read_between(text[pos], pos)
        return events

    def _read_between(self, c: str, pos: int) -> int:
        """One character before the list, between its items or after a call."""
        phase = self._phase
        if c.isspace():
            return pos + 1
        if phase == _START and c == "[":
            self._phase = _ITEM
        elif phase in (_ITEM, _AFTER) and c == "]" and self.calls:
            self._phase = _END
        elif phase == _AFTER and c == ",":
            self._phase = _ITEM
        elif phase == _ITEM and (c.isidentifier() or c.isdigit()):
            self._phase = _NAME
            return pos  # the name's first character
        else:
            self._dead = True  # the parse refuses this layout
        return pos + 1

    def _read_name(self, text: str, pos: int, events: list[Event]) -> int:
        paren = text.find("(", pos)
        if paren < 0:
            self._name.append(text[pos:])
            return len(text)
        self._name.append(text[pos:paren])
        name = "".join(self._name).strip()
        self._name = []
        if not all(part.isidentifier() for part in name.split(".")):
            self._dead = True
            return len(text)
        events.append((self.calls, name, ""))
        self.calls += 1
        self._args.append("")
        self.done.append(False)
        self._call = [name, "("]
        self._phase, self._depth = _ARGS, 0
        return paren + 1

    def _read_args(self, text: str, pos: int, events: list[Event]) -> int:
        """A call's text up to its ``)``: then its arguments go out whole."""
        i, n = pos, len(text)
        depth, quote, esc = self._depth, self._quote, self._esc
        while i < n:
            if not esc:  # a run that changes nothing: skipped in one match
                m = (_IN_STRING[quote] if quote else _PLAIN).match(text, i)
                if m is not None:
                    i = m.end()
                    continue
            c = text[i]
            i += 1
            if quote:
                quote, esc = _string_state(c, quote, esc)
            elif c in "'\"":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
                if depth < 0:  # the call's own ')'
                    self._call.append(text[pos:i])
                    self._close_call(events)
                    return i
        self._call.append(text[pos:])
        self._depth, self._quote, self._esc = depth, quote, esc
        return n

    def _close_call(self, events: list[Event]) -> None:
        self._phase, self._depth, self._quote, self._esc = _AFTER, 0, "", False
        try:
            _, args = call_json("".join(self._call))
        except ValueError:
            self._dead = True  # the parse refuses the body
            return
        self._call = []
        self._args[-1] = args
        self.done[-1] = True
        events.append((self.calls - 1, None, args))


FAMILY = Family(
    ToolFormat("llama4_pythonic", parse, lambda tools: PythonicBodyReader()),
    (Preset("llama4_pythonic", None, None, PYTHON_START, None, bare_open="[", bare_at_start=True),),
)
