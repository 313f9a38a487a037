"""Typing the values of XML-style tool calls from the request's tool schemas.

Qwen3-Coder and GLM-4.5 (``qwen3_coder.py``, ``glm45.py``) write every value as text.
Every value is a string until the tool's JSON schema says otherwise, so the parse takes
the request's ``tools`` (OpenAI's list of ``{"type": "function", "function": {...}}``) and
types each value whose property the schema names, by the rule vLLM 0.33's parsers use
(``vllm.tool_parsers.utils.coerce_to_schema_type``): the first of null, integer, number,
boolean, object, array, string that the schema allows and the text parses as; a property
the schema does not name, or no tools at all, keeps the string. The core's own parse at a
body's close has no request, so there every value is a string; a chat layer parses the
same body again with the request's tools (``ChatStream``).

>>> tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}}]
>>> typed_json({"n": "3", "s": "hi"}, properties_of(tools, "f"))
'{"n": 3, "s": "hi"}'
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["coerce_value", "properties_of", "schema_types", "trim_newlines", "typed_json"]

_ALIASES = {
    "str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
    "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
    "uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer",
    "float": "number", "float32": "number", "float64": "number", "double": "number",
    "bool": "boolean", "dict": "object", "arr": "array", "list": "array", "sequence": "array",
}  # fmt: skip
_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")
_ENUM_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"), (dict, "object"))


def trim_newlines(value: str) -> str:
    """One leading and one trailing newline off: Qwen3's template puts each value on its own line."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def properties_of(tools: Sequence[Mapping[str, Any]] | None, name: str) -> Mapping[str, Any]:
    """The ``properties`` of the function ``name``'s parameters in ``tools``; {} if none."""
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and fn.get("name") == name:
            params = fn.get("parameters") or {}
            props = params.get("properties", {}) if isinstance(params, Mapping) else {}
            return props if isinstance(props, Mapping) else {}
    return {}


def typed_json(params: dict[str, str], props: Mapping[str, Any]) -> str:
    """A call's parameters as its ``arguments`` JSON, each value typed by its property."""
    typed = {k: coerce_value(v, schema_types(props[k])) if isinstance(props.get(k), Mapping) else v for k, v in params.items()}
    return json.dumps(typed, ensure_ascii=False)


def schema_types(schema: Any) -> set[str]:
    """The JSON types a property's schema allows: ``type``, the types of its ``enum``
    values, and those of ``anyOf``/``oneOf``/``allOf``, aliases folded; ``{"string"}``
    when it says none."""
    if not isinstance(schema, Mapping):
        return {"string"}
    types = _declared(schema)
    for key in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(key)
        for choice in choices if isinstance(choices, list) else ():
            types |= schema_types(choice)
    return {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types} or {"string"}


def _declared(schema: Mapping[str, Any]) -> set[str]:
    """The types one schema names itself: its ``type`` (one or a list) and its ``enum``'s."""
    declared = schema.get("type")
    types = {t for t in (declared if isinstance(declared, list) else [declared]) if isinstance(t, str)}
    enum = schema.get("enum")
    for value in enum if isinstance(enum, list) else ():
        types.add("null" if value is None else next((n for k, n in _ENUM_TYPES if isinstance(value, k)), "string"))
    return types


def coerce_value(value: str, types: set[str]) -> Any:
    """``value`` as the first type of null, integer, number, boolean, object, array,
    string that ``types`` allows and the text parses as; else JSON if it parses (finite),
    else the string."""
    for candidate in _PRIORITY:
        if candidate in types:
            ok, out = _as(candidate, value)
            if ok:
                return out
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


def _as(kind: str, value: str) -> tuple[bool, Any]:
    """Whether ``value`` reads as the JSON type ``kind``, and as what."""
    if kind == "string":
        return True, value
    if kind == "null":
        return value.lower() == "null", None
    if kind == "boolean":
        low = value.lower().strip()
        return low in ("true", "1", "false", "0"), low in ("true", "1")
    try:
        if kind in ("integer", "number"):
            try:
                return True, int(value)
            except ValueError:
                if kind == "integer":
                    raise
            val = float(value)
            return math.isfinite(val), (int(val) if val == int(val) else val) if math.isfinite(val) else None
        parsed = json.loads(value)  # object, array
    except (ValueError, TypeError):
        return False, None
    return _finite(parsed), parsed


def _finite(value: Any) -> bool:
    """Whether ``value`` has no inf or nan in it (JSON cannot carry them)."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True
