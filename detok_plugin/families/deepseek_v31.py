"""DeepSeek V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{args}<｜tool▁call▁end｜>`` per call.

::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "東京"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
"""

from __future__ import annotations

import json

from ._format import Event, Family, Preset, ToolFormat, Tools
from ._json_calls import args_json, call_blocks, in_json_string
from ._json_reader import Dialect, JsonBodyReader
from .deepseek_r1 import CALL, END, SEP

__all__ = ["FAMILY"]


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    calls = []
    for block in call_blocks(body, CALL, END):
        name, sep, args = block.partition(SEP)
        if not sep:
            raise ValueError(f"a DeepSeek V3.1 tool call needs {SEP}")
        calls.append((name.strip(), args_json(json.loads(args))))
    return calls


def _head(reader: JsonBodyReader, events: list[Event]) -> None:
    buf = reader.buf
    at = reader.find_call(CALL)
    sep = buf.find(SEP, at) if at >= 0 else -1
    if sep < 0:
        return
    reader.pos = sep + len(SEP)
    reader.raw_call(buf[at + len(CALL) : sep].strip(), events)


_DIALECT = Dialect(_head, closers=(END,))

FAMILY = Family(
    ToolFormat("deepseek_v31", parse, lambda tools: JsonBodyReader(_DIALECT), marker_is_text=in_json_string, call_close=END),
    (Preset("deepseek_v31", "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),),
)
