"""GLM-4.5: the function's name, then ``<arg_key>``/``<arg_value>`` pairs, one call per body.

::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>東京</arg_value>
    </tool_call>

A key is stripped; a value is kept as written, text until the request's schemas type it
(``_xml_values``). A value whose ``</arg_value>`` never comes runs to the body's end (as
Qwen3-Coder's last parameter does): the streaming reader has sent it as it formed.

>>> parse("f\\n<arg_key>path</arg_key>\\n<arg_value>src/a.py</arg_")
[('f', '{"path": "src/a.py</arg_"}')]
"""

from __future__ import annotations

import re

from ._format import Family, Preset, ToolFormat, Tools
from ._xml_reader import Search, XmlBodyReader, XmlDialect, chars, tail
from ._xml_values import properties_of, typed_json

__all__ = ["FAMILY", "in_open_value"]

_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)(?:</arg_value>|\Z)", re.DOTALL)


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    name = body.split("<arg_key>", 1)[0].strip()
    if not name or "<" in name:
        raise ValueError("a GLM tool call needs the function name before its first <arg_key>")
    params = {m.group(1).strip(): m.group(2) for m in _ARG.finditer(body)}
    return [(name, typed_json(params, properties_of(tools, name)))]


def in_open_value(body: str) -> bool:
    """Whether a ``</tool_call>`` right after ``body`` (a body's text so far) is text of a
    value (``ToolFormat.marker_is_text``): it is inside an ``<arg_value>`` not yet closed
    whose text holds more ``<tool_call>`` than ``</tool_call>``. A value that writes the tags
    (a note on the format) writes them in pairs; in a value with no unpaired opener the
    model left its ``</arg_value>`` out, and ``</tool_call>`` ends the call (vLLM #57826).

    >>> in_open_value("write_file<arg_key>content</arg_key><arg_value>Wrap it in <tool_call> and ")
    True
    >>> in_open_value("get_weather<arg_key>unit</arg_key><arg_value>celsius")
    False
    """
    at = body.rfind("<arg_value>")
    if at < 0 or body.find("</arg_value>", at) >= 0:
        return False
    return body.count("<tool_call>", at) > body.count("</tool_call>", at)


_NAME_END = Search(re.compile("<arg_key>"), tail(chars("<arg_key>")))


def _head(reader: XmlBodyReader) -> tuple[str, int] | None:
    if reader.calls:
        return None  # one call per body
    [m] = reader.find(_NAME_END)
    return None if m is None else (reader.step_text(m.start()).strip(), m.start())


_DIALECT = XmlDialect(
    head=_head,
    key=Search(re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>", re.DOTALL), tail([*chars("<arg_key>"), ".*"])),
    call_end=None,
    value_end=Search(re.compile(r"</arg_value>"), tail(chars("</arg_value>"))),
    strip_keys=True,
    newline_markup=False,
    name_first=True,
)

FAMILY = Family(
    ToolFormat("glm45", parse, lambda tools: XmlBodyReader(_DIALECT, tools), typed_by_schema=True, marker_is_text=in_open_value),
    (Preset("glm45", "<think>", "</think>", "<tool_call>", "</tool_call>"),),
)
