"""Gemma 4: ``call:NAME{...}`` in Gemma's own object notation, one call per ``<|tool_call>``.

::

    <|channel>thought
    The user wants the weather.<channel|><|tool_call>call:get_weather{city:<|"|>東京<|"|>,days:3,opts:{hot:true,tags:[<|"|>a<|"|>]}}<tool_call|>

The arguments are not JSON: keys are bare (``key with space:1`` is one key), a string is
written raw between ``<|"|>`` tokens (quotes, braces, newlines and marker text inside it are
its text), and every other value is bare: a number as Python prints it (``1e-05``),
``true``, ``false``, ``null``, or a ``{...}`` object or ``[...]`` list of the same. So the
values are typed by the text itself, not by the request's schemas. :class:`Notation` turns
the notation into JSON as it streams (a string as it forms, a bare value at the character
that ends it); the parse is the same conversion of the whole body, and refuses a body whose
object never closes, or that has anything but blanks after it.

Reasoning is the ``thought`` channel: ``<|channel>thought\\n`` ... ``<channel|>``. With
thinking off the prompt ends with an empty channel (``<|channel>thought\\n<channel|>``) and
the reply is content. The markers (``<|tool_call>``, ``<|"|>``, ``<|channel>``, ...) are
special tokens: a request with tools keeps special tokens in its text.

Written from CanIToolCall 0.1.1's Gemma 4 fixtures and format notes and vLLM 0.33's
``vllm/parser/gemma4.py``. No PyPI package ships Gemma 4's tokenizer; the tests run the
recorded texts, and the recorded ids on the test zoo's stand-in (Gemma 3's vocabulary with
Gemma 4's markers at their ids, which decodes every fixture's ids exactly;
``tests/families/test_gemma4.py``).

>>> parse('call:get_weather{city:<|"|>Paris, "FR"<|"|>,days:3,hot:true}')
[('get_weather', '{"city": "Paris, \\\\"FR\\\\"", "days": 3, "hot": true}')]
"""

from __future__ import annotations

import json
import re

from ._format import Event, Family, Preset, ToolFormat, Tools

__all__ = ["FAMILY", "Gemma4BodyReader", "Notation", "in_string", "parse"]

QUOTE = '<|"|>'
_PREFIX = "call:"
_CLOSERS = {"{": "}", "[": "]"}
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?\Z")
_LITERALS = frozenset({"true", "false", "null"})
_BLANK = " \t\r\n"

# Notation.mode: where the conversion stands.
_OPEN, _KEY, _VALUE, _STRING, _BARE, _AFTER, _END = range(7)


class Notation:
    """Gemma 4's object notation after a call's opening ``{``, to JSON as it streams.

    ``feed(text)`` returns the JSON that text completes (the caller sent the ``{``). It
    holds only what may still change: a key until its ``:``, a bare value until the
    character that ends it, and a string's last characters while they may still be the
    start of ``<|"|>``; a string's other characters go out as they come. ``mode`` is
    ``_END`` once the object closed; ``error`` says what broke the notation, if anything.
    """

    __slots__ = ("mode", "error", "_stack", "_buf", "_comma", "_seen")

    def __init__(self) -> None:
        self.mode = _OPEN
        self.error: str | None = None
        self._stack = ["{"]
        self._buf = ""  # the text not yet converted
        self._comma = False  # a ',' came: the next item sends ", " first
        self._seen = 0  # of a held key or bare value, the characters already searched

    @property
    def closed(self) -> bool:
        return self.mode == _END and self.error is None

    def feed(self, text: str) -> str:
        buf = self._buf + text
        out: list[str] = []
        i = 0
        while i < len(buf) and self.error is None:
            j = self._step(buf, i, out)
            if j < 0:
                break  # waits for more text from i
            i = j
        self._buf = buf[i:]
        return "".join(out)

    def _step(self, buf: str, i: int, out: list[str]) -> int:
        """Convert what ``buf`` holds from ``i`` in the current mode; the next index, or -1
        to wait for more text (nothing before ``i`` is needed again)."""
        mode = self.mode
        if mode == _STRING:
            return self._string(buf, i, out)
        if mode in (_KEY, _BARE):
            return self._key(buf, i, out) if mode == _KEY else self._bare(buf, i, out)
        while i < len(buf) and buf[i] in _BLANK:
            i += 1
        if i == len(buf):
            return i
        if mode == _VALUE:
            return self._value(buf, i, out)
        if mode == _AFTER:
            return self._after(buf[i], i, out)
        if mode == _OPEN:
            return self._open(buf[i], i, out)
        self.error = "text after the arguments object"
        return i

    def _open(self, c: str, i: int, out: list[str]) -> int:
        """A container's start, or after a ',': its closer, or an item's start."""
        top = self._stack[-1]
        if c == _CLOSERS[top]:
            self._close(out)
            return i + 1
        if self._comma:
            out.append(", ")
            self._comma = False
        self.mode = _KEY if top == "{" else _VALUE
        return i

    def _key(self, buf: str, i: int, out: list[str]) -> int:
        """A bare key up to its ``:``, or a key between ``<|"|>`` delimiters (which may hold
        a ``:``) and the ``:`` after it."""
        if buf.startswith(QUOTE, i):
            close = buf.find(QUOTE, i + len(QUOTE))
            if close < 0:
                return -1
            after = close + len(QUOTE)
        elif len(buf) - i < len(QUOTE) and QUOTE.startswith(buf[i:]):
            return -1  # may still become a quoted key
        else:
            after = i
        colon = buf.find(":", max(after, i + self._seen))
        if colon < 0:
            self._seen = len(buf) - i
            return -1
        self._seen = 0
        key = buf[i + len(QUOTE) : after - len(QUOTE)] if after > i else buf[i:colon].strip()
        if buf[after:colon].strip(_BLANK) if after > i else (not key or any(c in key for c in "{}[],<")):
            self.error = f"not a key: {buf[i:colon]!r}"
            return i
        out.append(json.dumps(key, ensure_ascii=False) + ": ")
        self.mode = _VALUE
        return colon + 1

    def _value(self, buf: str, i: int, out: list[str]) -> int:
        c = buf[i]
        if c in _CLOSERS:
            self._stack.append(c)
            out.append(c)
            self.mode = _OPEN
            return i + 1
        if c == QUOTE[0]:
            if buf.startswith(QUOTE, i):
                out.append('"')
                self.mode = _STRING
                return i + len(QUOTE)
            if QUOTE.startswith(buf[i:]):
                return -1  # may still become <|"|>
        self.mode = _BARE
        return i

    def _string(self, buf: str, i: int, out: list[str]) -> int:
        end = buf.find(QUOTE, i)
        if end >= 0:
            out.append(json.dumps(buf[i:end], ensure_ascii=False)[1:-1] + '"')
            self.mode = _AFTER
            return end + len(QUOTE)
        safe = len(buf) - _quote_start(buf, i)
        if safe > i:
            out.append(json.dumps(buf[i:safe], ensure_ascii=False)[1:-1])
        return -1 if safe == i else safe

    def _bare(self, buf: str, i: int, out: list[str]) -> int:
        end = _bare_end(buf, i + self._seen)
        if end < 0:
            self._seen = len(buf) - i
            return -1
        self._seen = 0
        raw = buf[i:end].strip()
        if not raw:
            self.error = "a key with no value"
            return i
        out.append(raw if raw in _LITERALS or _NUMBER.match(raw) else json.dumps(raw, ensure_ascii=False))
        self.mode = _AFTER
        return end

    def _after(self, c: str, i: int, out: list[str]) -> int:
        if c == ",":
            self._comma = True
            self.mode = _OPEN
            return i + 1
        if c == _CLOSERS[self._stack[-1]]:
            self._close(out)
            return i + 1
        self.error = f"{c!r} after a value"
        return i

    def _close(self, out: list[str]) -> None:
        out.append(_CLOSERS[self._stack.pop()])
        self._comma = False
        self.mode = _AFTER if self._stack else _END


def _quote_start(buf: str, start: int) -> int:
    """How many of ``buf``'s last characters (from ``start``) may begin ``<|"|>``."""
    for n in range(min(len(QUOTE) - 1, len(buf) - start), 0, -1):
        if buf.endswith(QUOTE[:n]):
            return n
    return 0


def _bare_end(buf: str, start: int) -> int:
    """Where the bare value from ``start`` ends (its ``,``, ``}`` or ``]``), or -1."""
    ends = [at for at in (buf.find(c, start) for c in ",}]") if at >= 0]
    return min(ends) if ends else -1


def in_string(body: str) -> bool:
    """Whether the end of ``body`` (a body's text so far) is inside a ``<|"|>`` string: a
    marker there is its text (``ToolFormat.marker_is_text``). Outside a string the notation
    has no other quoting, so an odd count of delimiters is the whole rule.

    >>> in_string('call:echo{text:<|"|>close calls with ')
    True
    """
    return body.count(QUOTE) % 2 == 1


def _name(head: str) -> str:
    """``call:NAME`` (blanks around it allowed), or ``:NAME`` (some checkpoints leave out
    ``call``; vLLM 0.33 reads it too), to NAME; ``ValueError`` for anything else."""
    head = head.strip()
    prefix = _PREFIX if head.startswith(_PREFIX) else ":"
    name = head[len(prefix) :].strip()
    if not head.startswith(prefix) or not name or any(c in name for c in "<>{}:" + _BLANK):
        raise ValueError(f"a Gemma 4 tool call starts 'call:NAME{{', not {head[:40]!r}")
    return name


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    """One call: its name and its arguments converted to JSON (the request's tools are not
    needed: the notation types its values)."""
    head, brace, rest = body.partition("{")
    name = _name(head)
    if not brace:
        raise ValueError(f"a Gemma 4 tool call needs its '{{...}}' arguments: {body[:40]!r}")
    notation = Notation()
    args = "{" + notation.feed(rest)
    if not notation.closed:
        raise ValueError(f"malformed Gemma 4 arguments: {notation.error or 'the object never closes'}")
    json.loads(args)  # a check: the conversion always writes JSON
    return [(name, args)]


class Gemma4BodyReader:
    """One Gemma 4 tool-call body as it streams (``BodyReader``): the name at its ``{``,
    then the arguments as :class:`Notation` converts them; ``done`` once the object closed."""

    __slots__ = ("calls", "done", "_args", "_head", "_notation", "_dead")

    def __init__(self) -> None:
        self.calls = 0
        self.done: list[bool] = []
        self._args: list[str] = []
        self._head = ""
        self._notation: Notation | None = None
        self._dead = False

    @property
    def args(self) -> list[str]:
        return ["".join(self._args)] if self.calls else []

    def feed(self, text: str) -> list[Event]:
        if self._dead:
            return []  # the parse at the close sends what is left, or reports the body
        events: list[Event] = []
        notation = self._notation
        if notation is None:
            self._head += text
            head, brace, text = self._head.partition("{")
            if not brace:
                self._dead = not _may_become_head(head)
                return events
            try:
                name = _name(head)
            except ValueError:
                self._dead = True
                return events
            notation = self._notation = Notation()
            events.append((0, name, ""))
            self.calls, self.done = 1, [False]
        piece = notation.feed(text)
        if notation.error is not None:
            self._dead = True
            return events  # malformed: the parse at the close reports it
        piece = "{" + piece if events else piece  # the object's brace goes with its first piece
        if piece:
            self._args.append(piece)
            events.append((0, None, piece))
        self.done[0] = notation.closed
        return events


def _may_become_head(head: str) -> bool:
    """Whether text with no ``{`` yet may still become ``call:NAME`` or ``:NAME``."""
    head = head.lstrip()
    if head.startswith(":"):
        return "<" not in head
    return _PREFIX.startswith(head) if len(head) < len(_PREFIX) else head.startswith(_PREFIX) and "<" not in head


FAMILY = Family(
    ToolFormat("gemma4", parse, lambda tools: Gemma4BodyReader(), keeps_special_tokens=True, marker_is_text=in_string),
    (Preset("gemma4", "<|channel>thought\n", "<channel|>", "<|tool_call>", "<tool_call|>"),),
)
