"""Reasoning and tool-call markers, and the parsers for finished tool-call bodies.

A :class:`TagSet` names the markers one model family writes. Presets:

========== ======================== ============================== =====================
preset     reasoning                tool call                      body format
========== ======================== ============================== =====================
qwen3      ``<think>``/``</think>`` ``<tool_call>``/``</tool_call>`` Hermes JSON object
hermes     (same as qwen3)
deepseek_r1 ``<think>``/``</think>`` ``<｜tool▁calls▁begin｜>`` ...  DeepSeek call blocks
deepseek_v31 (same as deepseek_r1)  (same as deepseek_r1)          ``NAME<｜tool▁sep｜>{args}``
mistral    none                     ``[TOOL_CALLS]`` to the end      JSON list, or ``NAME[ARGS]{..}``
magistral  ``[THINK]``/``[/THINK]``   ``[TOOL_CALLS]`` to the end      (same as mistral)
llama3     none                     ``<|python_tag|>`` to the end    JSON object
qwen3_coder ``<think>``/``</think>`` ``<tool_call>``/``</tool_call>`` ``<function=NAME>`` XML
glm45      ``<think>``/``</think>`` ``<tool_call>``/``</tool_call>`` ``NAME<arg_key>..`` XML
kimi_k2    ``<think>``/``</think>`` ``<|tool_calls_section_begin|>`` ``functions.NAME:0`` + JSON
========== ======================== ============================== =====================

The XML formats (``_xml_calls``) write every value as text; ``parse_tool_body(...,
tools=...)`` types the values from the request's tool schemas.

``[TOOL_CALLS]``, ``[THINK]``, ``[/THINK]`` and ``<|python_tag|>`` are control tokens that
``skip_special_tokens=True`` removes from the text, so the stream also recognises them by
token id.

Mistral writes two layouts after ``[TOOL_CALLS]``. Before tokenizer v11 the body is a JSON
list of ``{"name", "arguments"}`` objects; from v11 on (Mistral Small 3.1/3.2, Devstral,
Magistral, Ministral) each call is ``NAME[ARGS]{json}``, and several calls follow each other,
each after its own ``[TOOL_CALLS]``. A body without a close tag runs to the end of the
stream, and a ``[TOOL_CALLS]`` inside it is body text (or, removed by
``skip_special_tokens``, nothing), so the ``mistral`` format reads every call of a v11 reply
from one body. vLLM picks the layout from the vocabulary (``[ARGS]`` in it means v11); the
parse here has no tokenizer and picks it from the body: a body that begins with ``[`` or
``{`` (but not ``[TOOL_CALLS]``) is the JSON list or a bare object, anything else is v11.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._xml_calls import glm45_calls, qwen3_xml_calls

__all__ = ["TagSet", "ToolCall", "parse_tool_body"]

ToolFormat = Literal["hermes", "mistral", "llama3", "deepseek", "deepseek_v31", "qwen3_xml", "glm45", "kimi_k2"]


@dataclass(frozen=True, slots=True)
class TagSet:
    """The markers of one model family. ``tool_close=None`` means the body runs to the end."""

    name: str = "custom"
    reasoning_open: str | None = None
    reasoning_close: str | None = None
    tool_open: str | None = None
    tool_close: str | None = None
    tool_format: ToolFormat = "hermes"

    @classmethod
    def preset(cls, name: str) -> TagSet:
        try:
            return _PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown tag preset {name!r}; choose one of {sorted(_PRESETS)}") from None

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        return tuple(sorted(_PRESETS))


_PRESETS = {
    "qwen3": TagSet("qwen3", "<think>", "</think>", "<tool_call>", "</tool_call>", "hermes"),
    "hermes": TagSet("hermes", "<think>", "</think>", "<tool_call>", "</tool_call>", "hermes"),
    "deepseek_r1": TagSet(
        "deepseek_r1", "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "deepseek"
    ),
    "deepseek_v31": TagSet(
        "deepseek_v31", "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "deepseek_v31"
    ),
    "mistral": TagSet("mistral", None, None, "[TOOL_CALLS]", None, "mistral"),
    "magistral": TagSet("magistral", "[THINK]", "[/THINK]", "[TOOL_CALLS]", None, "mistral"),
    "llama3": TagSet("llama3", None, None, "<|python_tag|>", None, "llama3"),
    "qwen3_coder": TagSet("qwen3_coder", "<think>", "</think>", "<tool_call>", "</tool_call>", "qwen3_xml"),
    "glm45": TagSet("glm45", "<think>", "</think>", "<tool_call>", "</tool_call>", "glm45"),
    "kimi_k2": TagSet(
        "kimi_k2", "<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "kimi_k2"
    ),
}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call's part of a Delta.

    ``text`` is body text streamed in this delta. At the closing tag (or the end of the
    stream, for formats without one) a delta carries ``complete=True`` and either the
    parsed ``name`` and ``arguments`` (a JSON string, as OpenAI's API sends it) or
    ``error``: a malformed body is reported, never dropped.
    """

    index: int
    text: str = ""
    name: str | None = None
    arguments: str | None = None
    complete: bool = False
    error: str | None = None


def _args_json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _one(obj: Any, args_key: str) -> tuple[str, str]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("a tool call must be a JSON object with a string 'name'")
    for key in (args_key, "arguments", "parameters"):
        if key in obj:
            return obj["name"], _args_json(obj[key])
    return obj["name"], "{}"


def _deepseek_calls(body: str) -> list[tuple[str, str]]:
    calls = []
    for block in body.split("<｜tool▁call▁begin｜>")[1:]:
        block = block.split("<｜tool▁call▁end｜>")[0]
        if "<｜tool▁sep｜>" not in block:
            raise ValueError("a DeepSeek tool call needs <｜tool▁sep｜>")
        _head, rest = block.split("<｜tool▁sep｜>", 1)
        name, _, args = rest.partition("\n")
        args = args.strip()
        if args.startswith("```"):
            args = args.split("\n", 1)[1] if "\n" in args else ""
            args = args.rsplit("```", 1)[0]
        calls.append((name.strip(), _args_json(json.loads(args))))
    if not calls:
        raise ValueError("no <｜tool▁call▁begin｜> block in the body")
    return calls


def _deepseek_v31_calls(body: str) -> list[tuple[str, str]]:
    """DeepSeek V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{args}<｜tool▁call▁end｜>`` per call."""
    calls = []
    for block in body.split("<｜tool▁call▁begin｜>")[1:]:
        name, sep, args = block.split("<｜tool▁call▁end｜>")[0].partition("<｜tool▁sep｜>")
        if not sep:
            raise ValueError("a DeepSeek V3.1 tool call needs <｜tool▁sep｜>")
        calls.append((name.strip(), _args_json(json.loads(args))))
    if not calls:
        raise ValueError("no <｜tool▁call▁begin｜> block in the body")
    return calls


_KIMI_CALL = "<|tool_call_begin|>"
_KIMI_ARGS = "<|tool_call_argument_begin|>"
_KIMI_END = "<|tool_call_end|>"


def kimi_name(header: str) -> str:
    """Kimi K2's call header ``functions.NAME:N`` (its own call id) to the function name."""
    head = header.strip()
    ident, colon, number = head.rpartition(":")
    if not colon or not number.isdigit() or not ident:
        raise ValueError(f"a Kimi tool call header must be 'functions.NAME:N', not {head!r}")
    return ident.split(":")[0].removeprefix("functions.")


def _kimi_calls(body: str) -> list[tuple[str, str]]:
    """Kimi K2: ``<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{args}<|tool_call_end|>``
    per call; the arguments are kept as written (checked to be JSON)."""
    calls = []
    for block in body.split(_KIMI_CALL)[1:]:
        header, sep, args = block.split(_KIMI_END)[0].partition(_KIMI_ARGS)
        if not sep:
            raise ValueError(f"a Kimi tool call needs {_KIMI_ARGS}")
        args = args.strip() or "{}"
        json.loads(args)
        calls.append((kimi_name(header), args))
    if not calls:
        raise ValueError(f"no {_KIMI_CALL} block in the body")
    return calls


MISTRAL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
#: One v11 call's head: an optional ``[TOOL_CALLS]`` (a call after the first; absent when
#: ``skip_special_tokens`` removed it), the name, then ``[ARGS]`` or (``[ARGS]`` removed) the
#: arguments' opening brace, as vLLM's ``mistral`` parser also accepts.
MISTRAL_V11_HEAD = re.compile(r"\s*(?:\[TOOL_CALLS\]\s*)?([^\s\[\]{}]+)\s*(?:\[ARGS\]|(?=\{))")


def is_mistral_v11(body: str) -> bool:
    """Which Mistral layout a body is in, from its first character (see the module docstring)."""
    head = body.lstrip()
    return head[:1] not in ("[", "{") or head.startswith(MISTRAL_CALLS)


def mistral_v11_calls(body: str) -> list[tuple[str, str]]:
    """Mistral v11+: ``NAME[ARGS]{args}``, then ``[TOOL_CALLS]NAME[ARGS]{args}`` per further
    call. The arguments are kept as written (checked to be one JSON value; nothing after
    ``[ARGS]`` is ``{}``, as vLLM's parser gives); text after the last call is malformed.

    >>> mistral_v11_calls('get_weather[ARGS]{"city": "東京"}[TOOL_CALLS]get_time[ARGS]{}')
    [('get_weather', '{"city": "東京"}'), ('get_time', '{}')]
    """
    calls, pos, decoder = [], 0, json.JSONDecoder()
    while body[pos:].strip():
        m = MISTRAL_V11_HEAD.match(body, pos)
        if m is None:
            raise ValueError(f"a Mistral tool call must be 'NAME[ARGS]{{...}}', not {body[pos:pos + 40]!r}")
        pos = m.end()
        while pos < len(body) and body[pos].isspace():
            pos += 1
        if pos == len(body) or body.startswith(MISTRAL_CALLS, pos):
            calls.append((m.group(1), "{}"))
            continue
        _value, end = decoder.raw_decode(body, pos)
        calls.append((m.group(1), body[pos:end]))
        pos = end
    if not calls:
        raise ValueError("no call after [TOOL_CALLS]")
    return calls


def parse_tool_body(
    body: str, fmt: ToolFormat, *, tools: Sequence[Mapping[str, Any]] | None = None
) -> list[tuple[str, str]]:
    """Parse a finished tool-call body into ``[(name, arguments_json), ...]``.

    Raises ``ValueError`` (``json.JSONDecodeError`` is one) for a malformed body.
    ``tools`` (OpenAI's request field, as plain dicts) types the values of the XML
    formats (``qwen3_xml``, ``glm45``); without it they stay strings.

    >>> parse_tool_body('{"name": "get_time", "arguments": {"tz": "東京"}}', "hermes")
    [('get_time', '{"tz": "東京"}')]
    """
    if fmt == "deepseek":
        return _deepseek_calls(body)
    if fmt == "deepseek_v31":
        return _deepseek_v31_calls(body)
    if fmt == "kimi_k2":
        return _kimi_calls(body)
    if fmt == "glm45":
        return glm45_calls(body, tools)
    if fmt == "qwen3_xml" and not body.lstrip().startswith("{"):
        return qwen3_xml_calls(body, tools)
    if fmt == "mistral" and is_mistral_v11(body):
        return mistral_v11_calls(body)
    obj = json.loads(body)
    if fmt == "mistral":
        items = obj if isinstance(obj, list) else [obj]
        return [_one(o, "arguments") for o in items]
    if fmt == "llama3":
        return [_one(obj, "parameters")]
    return [_one(obj, "arguments")]
