"""The finished parse shared by the formats whose body is JSON objects with a name."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["args_json", "call_blocks", "in_json_string", "named_call", "split_outside_strings"]


#: ``json.dumps(value, ensure_ascii=False)``, without building an encoder per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def args_json(value: Any) -> str:
    """Arguments as OpenAI's API sends them: a JSON string (a string value stays as written)."""
    return value if isinstance(value, str) else _ENCODER.encode(value)


def in_json_string(body: str) -> bool:
    """Whether the end of ``body`` is inside a JSON string (the ``marker_is_text`` of the
    formats whose arguments are JSON): a marker there is text of a value.

    >>> in_json_string('{"text": "Use </tool_call')
    True
    >>> in_json_string(r'{"text": "a \\"quoted\\" word"} ')
    False
    """
    return _after_quotes(body, 0, len(body), False)


def split_outside_strings(body: str, marker: str) -> list[str]:
    """``body.split(marker)``, but a ``marker`` inside a JSON string does not split."""
    parts: list[str] = []
    start = at = 0
    inside = False
    while (found := body.find(marker, at)) >= 0:
        inside = _after_quotes(body, at, found, inside)
        if not inside:
            parts.append(body[start:found])
            start = found + len(marker)
        at = found + len(marker)
        if inside:
            inside = _after_quotes(body, found, at, inside)
    parts.append(body[start:])
    return parts


def _after_quotes(text: str, start: int, end: int, inside: bool) -> bool:
    """Whether a JSON string is open at ``end``, given whether one was at ``start``: each
    quote not escaped inside a string flips it (a backslash escapes only inside one)."""
    i = text.find('"', start, end)
    while i >= 0:
        if inside:
            k = i
            while k > start and text[k - 1] == "\\":
                k -= 1
            inside = (i - k) % 2 == 1
        else:
            inside = True
        i = text.find('"', i + 1, end)
    return inside


def call_blocks(body: str, begin: str, end: str) -> list[str]:
    """The text of each call in a body of marked calls (``begin`` ... ``end``, the end
    marker optional at the body's end); ``ValueError`` when there is none. A marker inside
    a JSON string is text, not a marker (``in_json_string``)."""
    blocks = [split_outside_strings(block, end)[0] for block in split_outside_strings(body, begin)[1:]]
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
