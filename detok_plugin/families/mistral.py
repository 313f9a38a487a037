"""Mistral and Magistral: ``[TOOL_CALLS]`` then the calls, to the end of the reply.

Mistral writes two layouts after ``[TOOL_CALLS]``. Before tokenizer v11 the body is a JSON
list of ``{"name", "arguments"}`` objects; from v11 on (Mistral Small 3.1/3.2, Devstral,
Magistral, Ministral) each call is ``NAME[ARGS]{json}``, and several calls follow each other,
each after its own ``[TOOL_CALLS]``. A body without a close tag runs to the end of the
stream, and a ``[TOOL_CALLS]`` inside it is body text (or, removed by
``skip_special_tokens``, nothing), so one body holds every call of a v11 reply. vLLM picks
the layout from the vocabulary (``[ARGS]`` in it means v11); the parse here has no
tokenizer and picks it from the body: a body that begins with ``[`` or ``{`` (but not
``[TOOL_CALLS]``) is the JSON list or a bare object, anything else is v11.

``[TOOL_CALLS]``, ``[ARGS]``, ``[THINK]`` and ``[/THINK]`` are control tokens: a request with
tools keeps special tokens in its text, and the core also recognises the tags by id. Tool-call
ids are Mistral's 9 letters and digits, the only ids its chat templates accept back.

Magistral reasons between ``[THINK]`` and ``[/THINK]`` from Tekken v13 on (Magistral Small
2507/2509, Ministral 3 Reasoning); Magistral Small 2506, whose Tekken v11 has no ``[THINK]``,
writes ``<think>`` and ``</think>`` as text. The tokenizer says which (:func:`reasoning_tags`).
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Container
from typing import Literal

from ._format import Event, Family, Preset, ToolFormat, Tools
from ._json_calls import in_json_string, named_call
from ._json_reader import Dialect, JsonBodyReader, may_become_head, object_head

__all__ = ["FAMILY", "THINK", "call_id", "is_v11", "reasoning_tags", "v11_calls"]

CALLS = "[TOOL_CALLS]"
THINK = ("[THINK]", "[/THINK]")  # Magistral's reasoning tags, control tokens from Tekken v13 on
THINK_TEXT = ("<think>", "</think>")  # Magistral Small 2506's (Tekken v11), written as text
#: One v11 call's head: an optional ``[TOOL_CALLS]`` (a call after the first; absent when
#: ``skip_special_tokens`` removed it), the name, an optional ``[CALL_ID]`` and the call's id
#: (Mistral Small 3.2's history renders, llama.cpp's tests), then ``[ARGS]`` or (``[ARGS]``
#: removed) the arguments' opening brace, as vLLM's ``mistral`` parser also accepts.
_V11_HEAD = re.compile(r"\s*(?:\[TOOL_CALLS\]\s*)?([^\s\[\]{}]+)\s*(?:\[CALL_ID\]\s*[^\s\[\]{}]*\s*)?(?:\[ARGS\]|(?=\{))")
_LIST_OPEN = re.compile(r"\s*\[")
_NEXT = re.compile(r"\s*\}\s*(,)?\s*")


def is_v11(body: str) -> bool:
    """Which layout a body is in, from its first character (see the module docstring)."""
    head = body.lstrip()
    return head[:1] not in ("[", "{") or head.startswith(CALLS)


def v11_calls(body: str) -> list[tuple[str, str]]:
    """v11+: ``NAME[ARGS]{args}``, then ``[TOOL_CALLS]NAME[ARGS]{args}`` per further call.
    The arguments are kept as written (checked to be one JSON value; nothing after
    ``[ARGS]`` is ``{}``, as vLLM's parser gives); text after the last call is malformed.

    >>> v11_calls('get_weather[ARGS]{"city": "東京"}[TOOL_CALLS]get_time[ARGS]{}')
    [('get_weather', '{"city": "東京"}'), ('get_time', '{}')]
    """
    calls, pos, decoder = [], 0, json.JSONDecoder()
    while body[pos:].strip():
        m = _V11_HEAD.match(body, pos)
        if m is None:
            raise ValueError(f"a Mistral tool call must be 'NAME[ARGS]{{...}}', not {body[pos:pos + 40]!r}")
        pos = m.end()
        while pos < len(body) and body[pos].isspace():
            pos += 1
        if pos == len(body) or body.startswith(CALLS, pos):
            calls.append((m.group(1), "{}"))
            continue
        _value, end = decoder.raw_decode(body, pos)
        calls.append((m.group(1), body[pos:end]))
        pos = end
    if not calls:
        raise ValueError("no call after [TOOL_CALLS]")
    return calls


def parse(body: str, tools: Tools = None) -> list[tuple[str, str]]:
    if is_v11(body):
        return v11_calls(body)
    obj = json.loads(body)
    items = obj if isinstance(obj, list) else [obj]
    return [named_call(o, "arguments") for o in items]


def reasoning_tags(vocab: Container[str]) -> tuple[str, str]:
    """The tags a Magistral model reasons between, by its tokenizer's vocabulary: ``[THINK]``
    and ``[/THINK]`` where ``[THINK]`` is a token, else ``<think>`` and ``</think>`` as text,
    the choice vLLM 0.33's ``mistral`` parser makes (``vllm/parser/mistral.py``,
    ``MistralParser.__init__``: ``[THINK]`` in the vocabulary, else plain-text tags on a
    Tekken v11+ tokenizer).

    >>> reasoning_tags({"[THINK]": 34, "[/THINK]": 35})
    ('[THINK]', '[/THINK]')
    >>> reasoning_tags({"[ARGS]": 32})
    ('<think>', '</think>')
    """
    return THINK if THINK[0] in vocab else THINK_TEXT


def call_id() -> str:
    """A tool-call id: 9 random letters and digits, as vLLM's ``mistral`` parser makes them
    (``MistralToolCall``); Mistral's chat templates refuse any other id when the
    conversation comes back with the call in it."""
    return "".join(random.choices(_ALPHANUMERIC, k=9))


_ALPHANUMERIC = string.ascii_letters + string.digits


def _v11_head(reader: JsonBodyReader, events: list[Event]) -> None:
    """``NAME[ARGS]`` (after a ``[TOOL_CALLS]`` for a call after the first) then the JSON;
    the name is known once ``[ARGS]`` (or the brace) follows it."""
    m = _V11_HEAD.match(reader.buf, reader.pos)
    if m is None:
        if not may_become_head(reader.buf[reader.pos :]):
            reader.give_up()
        return
    reader.pos = m.end()
    reader.raw_call(m.group(1), events)


def _head(reader: JsonBodyReader, events: list[Event]) -> None:
    """The first call picks the layout; in the JSON list, each object's head in turn."""
    buf, pos = reader.buf, reader.pos
    if reader.calls == 0:
        layout = _layout(buf[pos:])
        if layout == "v11":
            reader.dialect = _V11
            _v11_head(reader, events)
        if layout != "json":
            return  # read as v11 from now on, or the layout is not known yet
        m = _LIST_OPEN.match(buf, pos)
        if m is None:
            if buf[pos:].strip():
                reader.give_up()
            return
        pos = m.end()
    else:
        if not reader.done[-1]:
            return
        m = _NEXT.match(buf, pos)
        if m is None or m.end() == len(buf) or m.group(1) is None:
            return  # more may come, or "}" then the end of the list
        pos = m.end()
    object_head(reader, pos, events)


def _layout(text: str) -> Literal["json", "v11", "unknown"]:
    """A body's layout from its start (``is_v11``), or ``unknown`` while the start may
    still become ``[TOOL_CALLS]``."""
    head = text.lstrip()
    if not head or (len(head) < len(CALLS) and CALLS.startswith(head)):
        return "unknown"
    return "v11" if is_v11(head) else "json"


_V11 = Dialect(_v11_head, opens="{")  # a "[" there may be the next call's [TOOL_CALLS]
_DIALECT = Dialect(_head)

FAMILY = Family(
    ToolFormat("mistral", parse, lambda tools: JsonBodyReader(_DIALECT), keeps_special_tokens=True, call_id=call_id, marker_is_text=in_json_string),
    (
        Preset("mistral", None, None, CALLS, None),
        Preset("magistral", *THINK, CALLS, None),  # <think> text on Tekken v11 (reasoning_tags)
    ),
)
