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


#: The end-of-message tokens that may close a call's body when a request keeps special
#: tokens (vLLM stops at the generation config's ``<|eom_id|>`` and keeps it in the ids).
_ENDS = ("<|eom_id|>", "<|eot_id|>")


#: ``raw_decode`` keeps no state between calls: one decoder serves every body.
_DECODER = json.JSONDecoder()


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    """One JSON object; after it, only an end-of-message token may follow."""
    obj, end = _DECODER.raw_decode(body)
    rest = body[end:].strip()
    if rest and rest not in _ENDS:
        raise ValueError(f"text after the call's JSON: {rest[:40]!r}")
    return [named_call(obj, "parameters")]


FAMILY = Family(
    ToolFormat("llama3", parse, lambda tools: JsonBodyReader(_DIALECT), marker_is_text=in_json_string),
    (Preset("llama3", None, None, "<|python_tag|>", None, bare_open="{", bare_at_start=True),),
)
