"""A made-up tool-call family, written as a family module is: markers, a finished parse
and a streaming reader from one definition. ``<call>NAME|{"json": "arguments"}</call>``,
reasoning in ``<think>``. The tests register it (``families.register``) to show that a
family is one module and one registry entry, and that it then works through vLLM's chat
layer under the ``detok_made_up`` parser names."""

from __future__ import annotations

import json
from typing import Any

from detok_plugin.families import Dialect, Event, Family, JsonBodyReader, Preset, ToolFormat, may_become_head


def parse(body: str, tools: Any = None) -> list[tuple[str, str]]:
    name, sep, args = body.partition("|")
    if not sep or not name.strip():
        raise ValueError("a made-up call is NAME|{arguments}")
    json.loads(args)
    return [(name.strip(), args.strip())]


def _head(reader: JsonBodyReader, events: list[Event]) -> None:
    """``NAME|`` then the JSON arguments; one call per body."""
    if reader.calls:
        return
    sep = reader.buf.find("|", reader.pos)
    if sep < 0:
        if not may_become_head(reader.buf[reader.pos :]):
            reader.give_up()
        return
    name = reader.buf[reader.pos : sep].strip()
    reader.pos = sep + 1
    reader.raw_call(name, events)


_DIALECT = Dialect(_head)

FAMILY = Family(
    ToolFormat("made_up", parse, lambda tools: JsonBodyReader(_DIALECT)),
    (Preset("made_up", "<think>", "</think>", "<call>", "</call>"),),
)
