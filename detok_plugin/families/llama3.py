"""Llama 3.1/3.2/3.3: ``<|python_tag|>`` then one JSON object, to the end of the reply.

::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "東京"}}

``<|python_tag|>`` is a special token that ``skip_special_tokens=True`` removes from the
text; the core also recognises it by id.
"""

from __future__ import annotations

import json

from ._format import Family, Preset, ToolFormat, Tools
from ._json_calls import in_json_string, named_call
from ._json_reader import Dialect, JsonBodyReader, one_object_head

__all__ = ["FAMILY"]

_DIALECT = Dialect(one_object_head)


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    return [named_call(json.loads(body), "parameters")]


FAMILY = Family(
    ToolFormat("llama3", parse, lambda tools: JsonBodyReader(_DIALECT), marker_is_text=in_json_string),
    (Preset("llama3", None, None, "<|python_tag|>", None, bare_open="{", bare_at_start=True),),
)
