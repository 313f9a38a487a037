"""The plugin inside a real ``sglang.launch_server`` (SGLang 0.5.23, SmolLM2-135M, this CPU).

Two servers run side by side for the module (``sglang_server.Server``): stock
(``DETOK_PLUGIN=0``: the plugin installed, loaded, off) and the plugin (``DETOK_PLUGIN=1``).
Scripted token ids go through each server's real scheduler, detokenizer and OpenAI layer,
forced by SGLang's own custom logit processor (``tests/support/sglang_script``): a stop
spelled one character per token, a CJK stop in byte tokens, characters split into bytes,
``n=2``, a skipped special token. The oracle is the tokenizer's decode:
``decode(prompt + out)[len(decode(prompt)):]`` (skip_special_tokens), cut at the stop.
The plugin must be exact on every case; stock's failures are pinned (``STOCK_WRONG``). A
real chat (Japanese, emoji; the model's own ids, greedy) must read the same on both, with
no U+FFFD. Each process of the plugin's server says it is on, the stock one's off.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest
from sglang_env import require_sglang
from sglang_replay import byte_ids, char_ids, enc
from sglang_server import Server, model_dir, scripted_processor, stream

pytestmark = pytest.mark.sglang

require_sglang()

START_TIMEOUT_S = 420
STOP_USER = "\n\nUser:"

#: Stock SGLang's failures on this server, by case name.
STOCK_WRONG = {
    "stop_spelled_char_by_char": "stock decodes only the last len(encode(stop)) + 1 ids: the stop leaks, generation runs on",
    "cjk_stop_in_byte_tokens": "stock's tail decode is too short to see a stop spelled in byte tokens: it leaks",
}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Server]]:
    model = model_dir()
    started = {"stock": Server(model, {"DETOK_PLUGIN": "0"}), "plugin": Server(model, {"DETOK_PLUGIN": "1"})}
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(s.wait, START_TIMEOUT_S) for s in started.values()]:
                done.result()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir())


@pytest.fixture(scope="module")
def processor() -> str:
    return scripted_processor()


def scripted_cases(tok: Any) -> dict[str, dict[str, Any]]:
    special = tok.convert_tokens_to_ids("<|im_start|>")
    return {
        "stop_spelled_char_by_char": {
            "ids": enc(tok, "Sure thing") + char_ids(tok, STOP_USER) + enc(tok, " more text"), "stop": [STOP_USER]},
        "cjk_stop_in_byte_tokens": {
            "ids": enc(tok, "好的") + byte_ids(tok, "结束".encode()) + enc(tok, "之后"), "stop": ["结束"]},
        "split_characters": {"ids": enc(tok, "Hi ") + byte_ids(tok, "你好🫨".encode()) + enc(tok, " ok")},
        "n_2": {"ids": enc(tok, "A ") + byte_ids(tok, "日本🌊".encode()), "n": 2},
        "skipped_special_token": {"ids": enc(tok, "a") + [special] + enc(tok, " b 🙂")},
    }


def oracle(tok: Any, prompt: list[int], ids: list[int], stops: list[str]) -> str:
    base = tok.decode(prompt, skip_special_tokens=True)
    for k in range(1, len(ids) + 1):
        text = tok.decode(prompt + ids[:k], skip_special_tokens=True)[len(base) :]
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return text[: min(hits)]
    return tok.decode(prompt + ids, skip_special_tokens=True)[len(base) :]


def complete(server: Server, prompt: list[int], case: dict[str, Any], processor: str) -> dict[int, str]:
    """One scripted streaming completion: the text of each choice."""
    body = {
        "model": "m", "prompt": prompt, "max_tokens": len(case["ids"]), "temperature": 0, "stop": case.get("stop"),
        "n": case.get("n", 1), "custom_logit_processor": processor, "custom_params": {"ids": case["ids"]},
    }
    texts: dict[int, str] = {}
    for event in stream(server.url, "/v1/completions", body):
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + (choice.get("text") or "")
    return texts


@pytest.fixture(scope="module")
def scripted(servers: dict[str, Server], tokenizer: Any, processor: str) -> dict[str, dict[str, Any]]:
    """Every scripted case on both servers, all at once."""
    prompt = enc(tokenizer, "Q: ")
    cases = scripted_cases(tokenizer)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runs = {
            (who, name): pool.submit(complete, server, prompt, case, processor)
            for name, case in cases.items()
            for who, server in servers.items()
        }
        return {
            name: {
                "oracle": oracle(tokenizer, prompt, case["ids"], case.get("stop") or []),
                "n": case.get("n", 1),
                **{who: runs[who, name].result() for who in servers},
            }
            for name, case in cases.items()
        }


CASES = ["stop_spelled_char_by_char", "cjk_stop_in_byte_tokens", "split_characters", "n_2", "skipped_special_token"]


@pytest.mark.parametrize("name", CASES)
def test_plugin_server_is_exact(scripted: dict[str, dict[str, Any]], name: str) -> None:
    run = scripted[name]
    assert run["plugin"] == dict.fromkeys(range(run["n"]), run["oracle"])


@pytest.mark.parametrize("name", CASES)
def test_stock_server_fails_only_where_pinned(scripted: dict[str, dict[str, Any]], name: str) -> None:
    run = scripted[name]
    exact = run["stock"] == dict.fromkeys(range(run["n"]), run["oracle"])
    assert exact is (name not in STOCK_WRONG), (run["stock"], run["oracle"])


def test_real_chat_reads_the_same_without_replacement_characters(servers: dict[str, Server]) -> None:
    body = {
        "model": "m", "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello in Japanese and add an emoji."}],
    }

    def chat(server: Server) -> str:
        return "".join(
            event["choices"][0]["delta"].get("content") or ""
            for event in stream(server.url, "/v1/chat/completions", body)
            if event.get("choices")
        )

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        stock, plugin = pool.map(chat, [servers["stock"], servers["plugin"]])
    assert plugin
    assert "\ufffd" not in plugin
    assert plugin == stock


def test_each_process_says_what_the_switch_did(servers: dict[str, Server]) -> None:
    for who, said in (("plugin", "detok-plugin: on (DETOK_PLUGIN=1)"), ("stock", "detok-plugin: off (DETOK_PLUGIN=0)")):
        lines = servers[who].lines(said)
        for process in ("[MainProcess]", "[sglang::scheduler]", "[sglang::detokenizer]"):
            assert sum(line.startswith(process) for line in lines) == 1, (process, servers[who].tail())
    assert not servers["stock"].lines("detok-plugin: on")


def test_each_plugin_process_builds_its_table_before_the_server_is_ready(
    servers: dict[str, Server], tokenizer: Any, processor: str
) -> None:
    """The scheduler and the detokenizer each build their tokenizer's table as they load the
    tokenizer, in the background, once, before the server says it is ready: these servers
    skip SGLang's warm-up request, so no request builds one on a loop. Stock builds none.
    The text is exact."""
    prompt = enc(tokenizer, "Say something.")
    case = {"ids": enc(tokenizer, "Hello there, 世界")}
    for who in ("plugin", "stock"):
        assert complete(servers[who], prompt, case, processor) == {0: oracle(tokenizer, prompt, case["ids"], [])}
    log = servers["plugin"].lines("")
    ready = next(n for n, line in enumerate(log) if "The server is fired up and ready to roll!" in line)
    for process in ("[sglang::scheduler]", "[sglang::detokenizer]"):
        at = [n for n, line in enumerate(log) if f"{process} detok-plugin: " in line and "tokenizer table ready (byte_level; " in line]
        assert len(at) == 1 and at[0] < ready, (process, servers["plugin"].tail())
    assert not servers["stock"].lines("tokenizer table ready")
