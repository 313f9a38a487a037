"""The finished parse shared by the formats whose body is JSON objects with a name."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["args_json", "call_blocks", "named_call"]


def args_json(value: Any) -> str:
    """Arguments as OpenAI's API sends them: a JSON string (a string value stays as written)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def call_blocks(body: str, begin: str, end: str) -> list[str]:
    """The text of each call in a body of marked calls (``begin`` ... ``end``, the end
    marker optional at the body's end); ``ValueError`` when there is none."""
    blocks = [block.split(end)[0] for block in body.split(begin)[1:]]
    if not blocks:
        raise ValueError(f"no {begin} block in the body")
    return blocks


def named_call(obj: Any, args_key: str) -> tuple[str, str]:
    """``{"name": ..., args_key | "arguments" | "parameters": ...}`` to ``(name, arguments)``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("a tool call must be a JSON object with a string 'name'")
    for key in (args_key, "arguments", "parameters"):
        if key in obj:
            return obj["name"], args_json(obj[key])
    return obj["name"], "{}"
