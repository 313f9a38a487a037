"""The finished parse shared by the formats whose body is JSON objects with a name."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["args_json", "named_call"]


def args_json(value: Any) -> str:
    """Arguments as OpenAI's API sends them: a JSON string (a string value stays as written)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def named_call(obj: Any, args_key: str) -> tuple[str, str]:
    """``{"name": ..., args_key | "arguments" | "parameters": ...}`` to ``(name, arguments)``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("a tool call must be a JSON object with a string 'name'")
    for key in (args_key, "arguments", "parameters"):
        if key in obj:
            return obj["name"], args_json(obj[key])
    return obj["name"], "{}"
