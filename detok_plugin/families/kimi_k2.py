"""Kimi K2: ``functions.NAME:N`` headers and raw JSON arguments, in a calls section.

::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "東京"}<|tool_call_end|><|tool_calls_section_end|>

The markers are special tokens: a request with tools keeps special tokens in its text.
"""

from __future__ import annotations

import json

from ._format import Event, Family, Preset, ToolFormat, Tools
from ._json_calls import call_blocks, in_json_string
from ._json_reader import Dialect, JsonBodyReader

__all__ = ["FAMILY", "call_name"]

_CALL = "<|tool_call_begin|>"
_ARGS = "<|tool_call_argument_begin|>"
_END = "<|tool_call_end|>"


def call_name(header: str) -> str:
    """A call header ``functions.NAME:N`` (Kimi's own call id) to the function name.

    >>> call_name(" functions.get_weather:0 ")
    'get_weather'
    """
    head = header.strip()
    ident, colon, number = head.rpartition(":")
    if not colon or not number.isdigit() or not ident:
        raise ValueError(f"a Kimi tool call header must be 'functions.NAME:N', not {head!r}")
    return ident.split(":")[0].removeprefix("functions.")


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    """The arguments are kept as written (checked to be JSON)."""
    calls = []
    for block in call_blocks(body, _CALL, _END):
        header, sep, args = block.partition(_ARGS)
        if not sep:
            raise ValueError(f"a Kimi tool call needs {_ARGS}")
        args = args.strip() or "{}"
        json.loads(args)
        calls.append((call_name(header), args))
    return calls


def _head(reader: JsonBodyReader, events: list[Event]) -> None:
    buf = reader.buf
    at = reader.find_call(_CALL)
    sep = buf.find(_ARGS, at) if at >= 0 else -1
    if sep < 0:
        return
    try:
        name = call_name(buf[at + len(_CALL) : sep])
    except ValueError:
        reader.give_up()  # the parse at the close reports it
        return
    reader.pos = sep + len(_ARGS)
    reader.raw_call(name, events)


_DIALECT = Dialect(_head, closers=(_END,))

FAMILY = Family(
    ToolFormat("kimi_k2", parse, lambda tools: JsonBodyReader(_DIALECT), keeps_special_tokens=True, marker_is_text=in_json_string, call_close=_END),
    (Preset("kimi_k2", "<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),),
)
