"""GLM-4.7 and GLM-5.x: GLM-4.5's tool calls written compact, reasoning opened by the prompt.

::

    <tool_call>get_weather<arg_key>city</arg_key><arg_value>東京</arg_value></tool_call>

The body is GLM-4.5's (``glm45.py``): the function's name, then ``<arg_key>``/``<arg_value>``
pairs, one call per body, values as written and typed by the request's schemas
(``_xml_values``). GLM-4.7 and 5.x leave out the newlines GLM-4.5 writes between the name,
the keys and the values, and a call without arguments is the name alone
(``<tool_call>get_time</tool_call>``); the GLM-4.5 parse and reader already read both
layouts (a name is stripped, a value is kept to the character), so this family shares their
format and adds its own preset. vLLM 0.33 serves ``glm45`` and ``glm47`` with one parser
(``vllm/parser/glm47_moe.py``) for the same reason.

What differs is the turn around the calls: GLM-4.7's generation prompt ends ``<think>``
(GLM-5.x's always does: its template has no thinking switch), so the reply starts inside
reasoning and holds only ``</think>``. The core sees this from the prompt's ids
(``starts_in``); with thinking off the prompt ends ``</think>`` and the reply is content.

Tested without GLM's own tokenizer (none builds offline from PyPI): on the texts
CanIToolCall 0.1.1 records for GLM-4.5, 4.7 and 5.3 (``tests/families/test_glm47.py``).

>>> from detok_plugin import parse_tool_body
>>> tools = [{"type": "function", "function": {"name": "set_timer", "parameters": {"properties": {"seconds": {"type": "integer"}}}}}]
>>> parse_tool_body("set_timer<arg_key>seconds</arg_key><arg_value>3</arg_value>", "glm45", tools=tools)
[('set_timer', '{"seconds": 3}')]
"""

from __future__ import annotations

from . import glm45
from ._format import Family, Preset

__all__ = ["FAMILY"]

FAMILY = Family(
    glm45.FAMILY.format,
    (Preset("glm47", "<think>", "</think>", "<tool_call>", "</tool_call>"),),
)
