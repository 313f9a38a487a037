"""``detok-plugin serve`` over real HTTP on 127.0.0.1, with the real SmolLM2 on CPU.

Every streamed choice is checked against the tokenizer's own decode of the ids it carries
(``return_token_ids``), and against the runner's own generation for the same prompt; the
naive endpoints are checked to produce U+FFFD where the plugin produces none. Short
``max_tokens`` keep the module to well under a minute of generation.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from detok_plugin.gpu_runner import GenerationSettings, Runner  # noqa: E402
from detok_plugin.gpu_runner.access_log import ACCESS_LOGGER  # noqa: E402
from detok_plugin.gpu_runner.prompts import DEFAULT_CHAT_PROMPT  # noqa: E402
from detok_plugin.gpu_runner.serve import defaults_for, running  # noqa: E402
from detok_plugin.gpu_runner.verify import expected_text, naive_text  # noqa: E402
from serve_client import content, finish, get, post, token_ids  # noqa: E402

from detok_plugin import build_table  # noqa: E402

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
FFFD = "\ufffd"


@pytest.fixture(scope="module")
def server(runner: Runner) -> Any:
    defaults = defaults_for(runner, GenerationSettings(max_new_tokens=32), max_batch=8)
    with running(runner, defaults, max_batch=8) as url:
        yield url


def chat_ids(runner: Runner, prompt: str) -> list[int]:
    tok = runner.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def text_ids(runner: Runner, ids: list[int], reason: str | None, stop_reason: Any) -> list[int]:
    """The ids whose text the stream carries: an EOS that ended it adds none."""
    return ids[:-1] if reason == "stop" and stop_reason is None and ids and ids[-1] in runner.eos_token_ids else ids


def assert_exact(runner: Runner, reply: Any, prompt_ids: list[int], index: int = 0) -> str:
    text, ids = content(reply, index), token_ids(reply, index)
    reason, stop_reason = finish(reply, index)
    want = expected_text(runner.tokenizer, prompt_ids, text_ids(runner, ids, reason, stop_reason),
                         skip_special_tokens=True)
    assert text == want, f"choice {index}: stream {text!r} != decode {want!r}"
    return text


# --- streaming, exact ------------------------------------------------------------------


def test_chat_stream_is_the_full_decode_and_the_runners_reply(runner: Runner, server: str) -> None:
    body = {"messages": [{"role": "user", "content": DEFAULT_CHAT_PROMPT}], "stream": True, "max_tokens": 40,
            "temperature": 0, "return_token_ids": True, "stream_options": {"include_usage": True}}
    reply = post(server, CHAT, body)
    assert reply.status == 200 and reply.events[-1] == b"[DONE]"
    prompt = chat_ids(runner, DEFAULT_CHAT_PROMPT)
    text = assert_exact(runner, reply, prompt)
    assert FFFD not in text
    ids = token_ids(reply)
    # The same prompt through the runner directly: the same tokens and text.
    seq = runner.generate([prompt], GenerationSettings(max_new_tokens=40, chat_template=False)).sequences[0]
    assert list(seq.token_ids) == ids and seq.text == text
    # The case the plugin exists for: decoding each token alone would show U+FFFD here.
    assert FFFD in naive_text(runner.tokenizer, seq.text_ids, skip_special_tokens=True)
    usage = reply.chunks()[-1]["usage"]
    assert usage == {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}
    chunks = reply.chunks()
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    # Streamed and not: the same answer.
    whole = post(server, CHAT, {**body, "stream": False, "stream_options": None}).json()
    assert whole["choices"][0]["message"]["content"] == text and whole["choices"][0]["token_ids"] == ids


def test_completions_stream_is_the_full_decode(runner: Runner, server: str) -> None:
    prompt = "Translate to Chinese: The weather is nice today. 今天天气"
    reply = post(server, "/v1/completions", {"prompt": prompt, "stream": True, "max_tokens": 16, "temperature": 0,
                                             "return_token_ids": True})
    assert reply.status == 200
    assert reply.chunks()[0]["object"] == "text_completion"
    assert finish(reply) == ("length", None)
    assert len(token_ids(reply)) == 16
    assert_exact(runner, reply, runner.tokenizer.encode(prompt))


def test_completions_take_token_ids(runner: Runner, server: str) -> None:
    ids = runner.tokenizer.encode("🫨 こんにちは")
    reply = post(server, "/v1/completions", {"prompt": ids, "stream": True, "max_tokens": 8, "temperature": 0,
                                             "return_token_ids": True})
    assert_exact(runner, reply, ids)


def test_stop_cuts_where_it_starts(runner: Runner, server: str) -> None:
    base = {"messages": [{"role": "user", "content": DEFAULT_CHAT_PROMPT}], "stream": True, "max_tokens": 40,
            "temperature": 0, "return_token_ids": True}
    full = content(post(server, CHAT, base))
    stop = full[len(full) // 2: len(full) // 2 + 3]  # three characters from the middle
    assert stop.strip(), full
    reply = post(server, CHAT, {**base, "stop": ["never appears", stop]})
    assert content(reply) == full[: full.index(stop)]
    assert finish(reply) == ("stop", stop)
    assert len(token_ids(reply)) < 40


def test_max_tokens_ends_with_length(runner: Runner, server: str) -> None:
    body = {"messages": [{"role": "user", "content": DEFAULT_CHAT_PROMPT}], "stream": True, "max_tokens": 5,
            "temperature": 0, "return_token_ids": True}
    reply = post(server, CHAT, body)
    assert finish(reply) == ("length", None) and len(token_ids(reply)) == 5
    assert_exact(runner, reply, chat_ids(runner, DEFAULT_CHAT_PROMPT))


def test_n_choices_each_exact(runner: Runner, server: str) -> None:
    body = {"messages": [{"role": "user", "content": "Say good morning in Japanese kana, then add an emoji."}],
            "stream": True, "max_tokens": 12, "temperature": 1.0, "seed": 7, "n": 3, "return_token_ids": True}
    reply = post(server, CHAT, body)
    prompt = chat_ids(runner, body["messages"][0]["content"])
    texts = [assert_exact(runner, reply, prompt, i) for i in range(3)]
    assert all(finish(reply, i)[0] in ("stop", "length") for i in range(3))
    assert len({tuple(token_ids(reply, i)) for i in range(3)}) > 1  # sampled rows differ
    again = post(server, CHAT, body)  # a seeded request runs alone: same seed, same tokens
    assert [content(again, i) for i in range(3)] == texts


def test_concurrent_clients_are_batched_and_exact(runner: Runner, server: str) -> None:
    prompts = ["Translate to Arabic: Hello world", "Reply only with emoji: a flag 🇯🇵", DEFAULT_CHAT_PROMPT,
               "Write one sentence in Korean about the sea.", "你好，世界", "Say hello in Hindi: नमस्ते"]
    before = get(server, "/health").json()["batches"]
    replies: dict[int, Any] = {}

    def client(i: int) -> None:
        replies[i] = post(server, CHAT, {"messages": [{"role": "user", "content": prompts[i]}], "stream": True,
                                         "max_tokens": 10 + i, "temperature": 0, "return_token_ids": True})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i, prompt in enumerate(prompts):
        assert replies[i].status == 200
        assert_exact(runner, replies[i], chat_ids(runner, prompt))
        assert len(token_ids(replies[i])) <= 10 + i
    # Six requests that arrived together took fewer generate() calls than six.
    assert get(server, "/health").json()["batches"] - before < len(prompts)


# --- the naive endpoints the page compares with ----------------------------------------


def test_naive_bytes_split_characters_across_events(runner: Runner, server: str) -> None:
    body = {"messages": [{"role": "user", "content": DEFAULT_CHAT_PROMPT}], "stream": True, "max_tokens": 40,
            "temperature": 0}
    reply = post(server, "/naive/v1/chat/completions?mode=bytes", body)
    ours = post(server, CHAT, {**body, "return_token_ids": True})
    ids = text_ids(runner, token_ids(ours), *finish(ours))
    pieces = build_table(runner.tokenizer)[0].pieces
    # The body as a streaming decoder sees it: each event's bytes, framing between them.
    decoded = b"\n\n".join(reply.events).decode("utf-8", errors="replace")
    shown = "".join(json.loads(line)["choices"][0]["delta"].get("content", "")
                    for line in decoded.split("\n\n") if line != "[DONE]")
    assert shown == "".join(pieces[i].decode("utf-8", errors="replace") for i in ids)
    assert shown.count(FFFD) > 0 and content(ours).count(FFFD) == 0


def test_naive_decode_is_each_token_decoded_alone(runner: Runner, server: str) -> None:
    body = {"messages": [{"role": "user", "content": DEFAULT_CHAT_PROMPT}], "stream": True, "max_tokens": 40,
            "temperature": 0}
    reply = post(server, "/naive/v1/chat/completions?mode=decode", body)
    ours = post(server, CHAT, {**body, "return_token_ids": True})
    ids = text_ids(runner, token_ids(ours), *finish(ours))
    assert content(reply) == naive_text(runner.tokenizer, ids, skip_special_tokens=True)
    assert FFFD in content(reply)


def test_page_is_served(server: str) -> None:
    page = get(server, "/").body.decode()
    assert "TextDecoder" in page and "{stream: true}" in page and "SmolLM2" in page and "{{" not in page


def test_openai_client_streams_from_it(runner: Runner, server: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": DEFAULT_CHAT_PROMPT}],
                                            stream=True, max_tokens=24, temperature=0)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    prompt = chat_ids(runner, DEFAULT_CHAT_PROMPT)
    assert text == runner.generate([prompt], GenerationSettings(max_new_tokens=24, chat_template=False)).sequences[0].text


# --- bad requests ----------------------------------------------------------------------

MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        pytest.param(CHAT, {}, 400, "messages", id="no-messages"),
        pytest.param(CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0]", id="bad-role"),
        pytest.param(CHAT, {"messages": MSG, "n": 0}, 400, "n", id="n-zero"),
        pytest.param(CHAT, {"messages": MSG, "n": "2"}, 400, "n", id="n-string"),
        pytest.param(CHAT, {"messages": MSG, "n": 99}, 400, "n", id="n-too-many"),
        pytest.param(CHAT, {"messages": MSG, "max_tokens": 10**6}, 400, "max_tokens", id="max-tokens-past-context"),
        pytest.param(CHAT, {"messages": MSG, "max_tokens": 0}, 400, "max_tokens", id="max-tokens-zero"),
        pytest.param(CHAT, {"messages": MSG, "temperature": -1}, 400, "temperature", id="temperature"),
        pytest.param(CHAT, {"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", id="five-stops"),
        pytest.param(CHAT, {"messages": MSG, "logprobs": True}, 400, "logprobs", id="logprobs"),
        pytest.param(CHAT, {"messages": MSG, "stream_options": {"include_usage": True}}, 400, "stream_options",
                     id="stream-options-without-stream"),
        pytest.param(CHAT, {"messages": MSG, "model": "gpt-4o"}, 404, "model", id="unknown-model"),
        pytest.param("/v1/completions", {"prompt": ""}, 400, "prompt", id="empty-prompt"),
        pytest.param("/v1/completions", {"prompt": [1, 2, 10**9]}, 400, "prompt", id="id-past-vocab"),
        pytest.param("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt", id="two-prompts"),
        pytest.param("/naive/v1/chat/completions?mode=bytes", {"messages": MSG, "stream": True, "stop": "x"}, 400,
                     "stop", id="naive-stop"),
        pytest.param("/naive/v1/chat/completions?mode=utf16", {"messages": MSG, "stream": True}, 400, "mode",
                     id="naive-mode"),
    ],
)
def test_bad_requests_get_a_json_4xx(server: str, path: str, body: Any, status: int, param: str) -> None:
    reply = post(server, path, body)
    assert reply.status == status, reply.body
    error = reply.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_malformed_and_misrouted_requests(server: str) -> None:
    bad_json = post(server, CHAT, None, raw=b"{not json")
    assert bad_json.status == 400 and "JSON" in bad_json.json()["error"]["message"]
    assert post(server, CHAT, None, raw=b"[1, 2]").status == 400
    missing = post(server, "/v1/embeddings", {"input": "x"})
    assert missing.status == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert get(server, CHAT).status == 405 and "error" in get(server, CHAT).json()


# --- the access log ------------------------------------------------------------------


def test_each_request_leaves_one_access_line(server: str, caplog: pytest.LogCaptureFixture) -> None:
    """uvicorn's access line (client, method, path with query, HTTP version, status) plus the
    duration, logged once the response has ended: one record per request, whatever its status."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    get(server, "/health")
    get(server, "/v1/models")
    post(server, CHAT, {"messages": MSG, "n": 0})
    post(server, "/v1/embeddings", {"input": "x"})
    get(server, CHAT)
    post(server, "/naive/v1/chat/completions?mode=decode", {"messages": MSG, "stream": True, "max_tokens": 3})
    post(server, CHAT, {"messages": MSG, "stream": True, "max_tokens": 3, "temperature": 0})
    want = [("GET", "/health", 200), ("GET", "/v1/models", 200), ("POST", CHAT, 400),
            ("POST", "/v1/embeddings", 404), ("GET", CHAT, 405),
            ("POST", "/naive/v1/chat/completions?mode=decode", 200), ("POST", CHAT, 200)]
    deadline = time.monotonic() + 30  # a stream's line follows its last byte, maybe after the client read it
    while len(access_lines(caplog)) < len(want) and time.monotonic() < deadline:
        time.sleep(0.02)
    records = access_lines(caplog)
    assert [(r.method, r.path, r.status) for r in records] == want
    for r, (method, path, status) in zip(records, want):
        assert re.fullmatch(rf'127\.0\.0\.1:\d+ - "{method} {re.escape(path)} HTTP/1\.1" {status} \d+\.\d ms',
                            r.getMessage()), r.getMessage()
        assert r.levelno == logging.INFO and r.duration_ms >= 0


def access_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == ACCESS_LOGGER]


def test_a_client_that_leaves_does_not_stall_the_server(runner: Runner, server: str) -> None:
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(server)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("POST", CHAT, body=json.dumps({"messages": MSG, "stream": True, "max_tokens": 400,
                                                "temperature": 0}), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read1(64)
    conn.close()  # gone after the first bytes: its row is dropped at the next token
    reply = post(server, CHAT, {"messages": MSG, "stream": True, "max_tokens": 6, "temperature": 0,
                                "return_token_ids": True})
    assert reply.status == 200
    assert_exact(runner, reply, chat_ids(runner, "hi"))


def test_cli_serve_refuses_a_bad_option_in_one_line() -> None:
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("detok-plugin")
    done = subprocess.run([str(exe), "serve", "--max-batch", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == "detok-plugin: error: --max-batch must be at least 1, got 0"
    helped = subprocess.run([str(exe), "serve", "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "--max-batch" in helped.stdout and "127.0.0.1" in helped.stdout
