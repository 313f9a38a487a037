"""Qwen3-Coder: ``<function=NAME>`` blocks of ``<parameter=KEY>`` values in ``<tool_call>``.

::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    東京
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A value loses one leading and one trailing newline (the template's markup); values are text
until the request's schemas type them (``_xml_values``). Inside a value a ``</parameter>``
ends it at a line start (the template writes ``\n</parameter>\n``) or where markup or the
body's end follows it (a compact body, ``<parameter=a>1</parameter></function>``); where the
model left it out, another tag at a line start does. Anywhere else a tag is text of the value:
``</parameter>``, ``</function>``, ``<function=`` or ``</tool_call>`` written inline, as
Qwen3.8 writes a value about its own format. A body that is a JSON
object instead is read as Hermes JSON, as vLLM's parser does. A model that leaves out
``<tool_call>`` and opens with ``<function=`` (``Preset.bare_open``) writes a call too.

>>> body = "<function=f>\\n<parameter=n>\\n3\\n</parameter>\\n<parameter=s>\\nhi\\n</parameter>\\n</function>"
>>> parse(body)
[('f', '{"n": "3", "s": "hi"}')]
>>> tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}}]
>>> parse(body, tools)
[('f', '{"n": 3, "s": "hi"}')]
"""

from __future__ import annotations

import json
import re

from ._format import Family, Preset, ToolFormat, Tools
from ._json_calls import named_call
from ._xml_reader import Search, XmlBodyReader, XmlDialect, chars, tail
from ._xml_values import properties_of, trim_newlines, typed_json

__all__ = ["FAMILY"]

#: The body's markup. Inside a parameter's value a tag is markup at a line start (the template
#: writes each tag on its own line), and a ``</parameter>`` also where ``_AFTER_CLOSE``
#: follows it: anywhere else it is text of the value.
_MARKUP = re.compile(r"<function=([^>]*)>|</function>|<\s*parameter\s*=\s*([^<>\n]*)>|<\s*/\s*parameter\s*>")
#: What, after blanks, makes an inline ``</parameter>`` the value's end: the next tag of the
#: call, or the body's end (a body or a prefix of one cut before its close marker, which the
#: core asks ``marker_is_text`` about).
_AFTER_CLOSE = re.compile(r"\s*(?:<\s*parameter\s*=|</function>|<function=|\Z)")


class _Walk:
    """The calls of a body, read by the grammar: ``calls`` as ``[name, {key: raw value}]``;
    ``value`` the key and start of the value still open at the end, else None."""

    __slots__ = ("calls", "value")

    def __init__(self, body: str) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.value: tuple[str, int] | None = None
        for m in _MARKUP.finditer(body):
            if self.value is not None and not self._ends_value(body, m):
                continue  # text of the value
            self._markup(body, m)

    def _ends_value(self, body: str, m: re.Match[str]) -> bool:
        key, start = self.value  # type: ignore[misc]
        at_line = m.start() > start and body[m.start() - 1] == "\n"
        closes = m.group(1) is None and m.group(2) is None and "parameter" in m.group(0)
        if not (at_line or (closes and _AFTER_CLOSE.match(body, m.end()))):
            return False
        self.calls[-1][1][key] = body[start : m.start()]
        self.value = None
        return True

    def _markup(self, body: str, m: re.Match[str]) -> None:
        if m.group(1) is not None:
            self.calls.append((m.group(1).strip(), {}))
        elif m.group(2) is not None and self.calls:
            self.value = (m.group(2), m.end())


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    if body.lstrip().startswith("{"):
        return [named_call(json.loads(body), "arguments")]
    walk = _Walk(body)
    if walk.value is not None:  # a last value whose close tag never came runs to the end
        key, start = walk.value
        walk.calls[-1][1][key] = body[start:]
    calls = []
    for name, raw in walk.calls:
        if not name:
            raise ValueError("a <function=...> tag with no name")
        params = {k: trim_newlines(v) for k, v in raw.items()}
        calls.append((name, typed_json(params, properties_of(tools, name))))
    if not calls:
        raise ValueError("no <function=...> block in the body")
    return calls


def marker_is_text(body: str) -> bool:
    """A marker right after ``body`` is text when a value is open there and the marker is
    not at a line start (the grammar of ``_Walk``)."""
    return not body.endswith("\n") and _Walk(body).value is not None


_WS = r"\s*"
_PARAMETER_OPEN = ["<", _WS, *chars("parameter"), _WS]
_PARAMETER_CLOSE = ["<", _WS, "/", _WS, *chars("parameter"), _WS, ">"]
_AFTER = ([*_PARAMETER_OPEN, "="], chars("</function>"), chars("<function="))  # _AFTER_CLOSE's tags
_FUNCTION_TAG = Search(re.compile(r"<function=([^>]*)>"), tail([*chars("<function="), "[^>]*"]))


def _head(reader: XmlBodyReader) -> tuple[str, int] | None:
    if reader.calls == 0 and reader.opening == "{":
        reader.give_up()  # a JSON body: sent whole at the close
        return None
    [m] = reader.find(_FUNCTION_TAG)
    return None if m is None else (m.group(1).strip(), m.end())


_DIALECT = XmlDialect(
    head=_head,
    key=Search(re.compile(r"<\s*parameter\s*=\s*([^>]*)>"), tail([*_PARAMETER_OPEN, "=", _WS, "[^>]*"])),
    call_end=Search(re.compile(r"</function>|(?=<function=)"), tail(chars("</function>"), chars("<function="))),
    value_end=Search(
        re.compile(
            r"(?<=\n)<\s*/\s*parameter\s*>|<\s*/\s*parameter\s*>(?=\s*(?:<\s*parameter\s*=|</function>|<function=))"
            r"|(?<=\n)(?=<\s*parameter\s*=|</function>|<function=)"
        ),
        # A tag after a line start, or an inline </parameter> and the tag after it: a
        # </parameter> then the body's end waits for the caller's parse at the close.
        tail(*_AFTER, *([*_PARAMETER_CLOSE, _WS, *after] for after in _AFTER)),
    ),
    strip_keys=False,
    newline_markup=True,
    name_first=False,
)

FAMILY = Family(
    ToolFormat("qwen3_xml", parse, lambda tools: XmlBodyReader(_DIALECT, tools), typed_by_schema=True, marker_is_text=marker_is_text, call_close="</function>"),
    (Preset("qwen3_coder", "<think>", "</think>", "<tool_call>", "</tool_call>", bare_open="<function=", tool_ends_reasoning=True),),
)
