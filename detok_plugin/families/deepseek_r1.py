"""DeepSeek R1 and V3: one fenced JSON block per call inside a calls section.

::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "東京"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
"""

from __future__ import annotations

import json
import re

from ._format import Event, Family, Preset, ToolFormat, Tools
from ._json_calls import args_json, call_blocks, in_json_string
from ._json_reader import Dialect, JsonBodyReader

__all__ = ["CALL", "END", "FAMILY", "SEP"]

CALL = "<｜tool▁call▁begin｜>"
SEP = "<｜tool▁sep｜>"
END = "<｜tool▁call▁end｜>"
_FENCE = re.compile(r"```(?:json)?\n")


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    calls = []
    for block in call_blocks(body, CALL, END):
        if SEP not in block:
            raise ValueError(f"a DeepSeek tool call needs {SEP}")
        _head, rest = block.split(SEP, 1)
        name, _, args = rest.partition("\n")
        args = args.strip()
        if args.startswith("```"):
            args = args.split("\n", 1)[1] if "\n" in args else ""
            args = args.rsplit("```", 1)[0]
        calls.append((name.strip(), args_json(json.loads(args))))
    return calls


def _head(reader: JsonBodyReader, events: list[Event]) -> None:
    """``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``, a newline, then the fence."""
    buf = reader.buf
    at = reader.find_call(CALL)
    if at < 0:
        return
    sep = buf.find(SEP, at)
    if sep < 0:
        return
    line = buf.find("\n", sep)
    if line < 0:
        return
    fence = _FENCE.match(buf, line + 1)
    if fence is None:
        if len(buf) - line - 1 < 8 and "```json\n".startswith(buf[line + 1 :] or "`"):
            return  # the fence may still be forming
        reader.pos = line + 1
    else:
        reader.pos = fence.end()
    reader.raw_call(buf[sep + len(SEP) : line].strip(), events)


_DIALECT = Dialect(_head, closers=("\n```", END))

FAMILY = Family(
    ToolFormat("deepseek", parse, lambda tools: JsonBodyReader(_DIALECT), marker_is_text=in_json_string, call_close=END),
    (Preset("deepseek_r1", "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),),
)
