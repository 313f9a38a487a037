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
until the request's schemas type them (``_xml_values``). A body that is a JSON object instead
is read as Hermes JSON, as vLLM's parser does.

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

_FUNCTION = re.compile(r"<function=([^>]*)>(.*?)(?:</function>|(?=<function=)|\Z)", re.DOTALL)
# A value ends at its close tag or at the next parameter; unlike vLLM's converter, also at
# the end of the function (a last parameter whose close tag the model left out is kept).
_PARAMETER = re.compile(r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=)|\Z)", re.DOTALL)


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    if body.lstrip().startswith("{"):
        return [named_call(json.loads(body), "arguments")]
    calls = []
    for m in _FUNCTION.finditer(body):
        name = m.group(1).strip()
        if not name:
            raise ValueError("a <function=...> tag with no name")
        params = {p.group(1): trim_newlines(p.group(2)) for p in _PARAMETER.finditer(m.group(2))}
        calls.append((name, typed_json(params, properties_of(tools, name))))
    if not calls:
        raise ValueError("no <function=...> block in the body")
    return calls


_WS = r"\s*"
_PARAMETER_OPEN = ["<", _WS, *chars("parameter"), _WS]
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
        re.compile(r"<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=)|(?=</function>)|(?=<function=)"),
        tail(["<", _WS, "/", _WS, *chars("parameter"), _WS, ">"], [*_PARAMETER_OPEN, "="], chars("</function>"), chars("<function=")),
    ),
    strip_keys=False,
    newline_markup=True,
    name_first=False,
)

FAMILY = Family(
    ToolFormat("qwen3_xml", parse, lambda tools: XmlBodyReader(_DIALECT, tools), typed_by_schema=True),
    (Preset("qwen3_coder", "<think>", "</think>", "<tool_call>", "</tool_call>"),),
)
