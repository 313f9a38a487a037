"""Hermes (Qwen2.5, Qwen3, NousResearch Hermes): one JSON object per ``<tool_call>`` body.

::

    <think>Let me check.</think>
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "東京"}}
    </tool_call>
"""

from __future__ import annotations

import json

from ._format import Family, Preset, ToolFormat, Tools
from ._json_calls import in_json_string, named_call
from ._json_reader import Dialect, JsonBodyReader, one_object_head

__all__ = ["FAMILY"]

_DIALECT = Dialect(one_object_head)


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    return [named_call(json.loads(body), "arguments")]


FAMILY = Family(
    ToolFormat("hermes", parse, lambda tools: JsonBodyReader(_DIALECT), marker_is_text=in_json_string),
    (
        Preset("qwen3", "<think>", "</think>", "<tool_call>", "</tool_call>"),
        Preset("hermes", "<think>", "</think>", "<tool_call>", "</tool_call>"),
    ),
)
