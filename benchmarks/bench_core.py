"""Per-token cost of the core against every known way to stream detokenized text.

Baselines, all run in this process on the same real token streams:

* ``DecodeStream``: tokenizers' own incremental decoder (vLLM's fast path). The reference:
  every ratio is against it.
* ``tgi``: TGI's prefix/read-offset window decode (``decode_token``), re-implemented here
  from its public description (two decodes of a small window per token).
* ``vllm_window``: vLLM's ``detokenize_incrementally`` (the slow path: window diff over
  token strings), called from the installed vllm.
* ``TextIteratorStreamer``: transformers' streamer, ``put`` per token (re-decodes its cache).
* ``full_redecode``: decode the whole output after every token (O(N) per token).
* ``core_str``: ``IncrementalDetokenizer.push`` (str per token: DecodeStream's contract).
* ``core_delta``: ``DetokenizerState.push`` (a Delta per token), built as the README shows
  it, ``from_tokenizer(tok)``: default options, the tokenizer's EOS ids live.
* ``core_delta_no_eos``: the same with ``eos_token_ids=()`` (EOS left to the caller), the
  configuration every benchmark used to pass: the defaults must be as fast (within 1.1x).

Run: ``.venv/bin/python benchmarks/bench_core.py [--repeats 5] [--quick]``
Prints a table of median µs/token with the ratio to DecodeStream and writes
``benchmarks/out/bench_core.png``.
"""

from __future__ import annotations

import argparse
import json

from _common import OUT, interleaved_medians, table, token_stream, tokenizer_zoo

from detok_plugin import DetokenizerState, IncrementalDetokenizer


def runners_for(tok, ids: list[int], heavy: bool):
    from tokenizers.decoders import DecodeStream

    backend = tok.backend_tokenizer

    def decode_stream():
        ds = DecodeStream(skip_special_tokens=False)
        step = ds.step
        for i in ids:
            step(backend, i)

    def core_str():
        d = IncrementalDetokenizer(tok, [])
        push = d.push
        for i in ids:
            push(i)
        d.flush()

    def core_delta():
        s = DetokenizerState.from_tokenizer(tok)
        push = s.push
        for i in ids:
            push(i)
        s.finish()

    def core_delta_no_eos():
        s = DetokenizerState.from_tokenizer(tok, eos_token_ids=())
        push = s.push
        for i in ids:
            push(i)
        s.finish()

    def tgi():
        all_ids: list[int] = []
        prefix = read = 0
        decode = tok.decode
        for i in ids:
            all_ids.append(i)
            prefix_text = decode(all_ids[prefix:read])
            new_text = decode(all_ids[prefix:])
            if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
                prefix, read = read, len(all_ids)

    runners = {"DecodeStream": decode_stream, "core_str": core_str, "core_delta": core_delta, "core_delta_no_eos": core_delta_no_eos, "tgi": tgi}

    try:
        from vllm.tokenizers.detokenizer_utils import detokenize_incrementally
    except Exception:  # vllm not installed: skip that baseline
        detokenize_incrementally = None
    if detokenize_incrementally is not None:

        def vllm_window():
            all_ids: list[int] = []
            tokens = None
            prefix = read = 0
            for i in ids:
                all_ids.append(i)
                new_tokens, _, prefix, read = detokenize_incrementally(
                    tok, all_ids, tokens, prefix, read, skip_special_tokens=False
                )
                tokens = new_tokens if tokens is None else tokens + new_tokens

        runners["vllm_window"] = vllm_window

    if heavy:
        import torch
        from transformers import TextIteratorStreamer

        tensors = [torch.tensor([i]) for i in ids]

        def streamer():
            s = TextIteratorStreamer(tok)
            for t in tensors:
                s.put(t)
            s.end()

        def full_redecode():
            decode = tok.decode
            for k in range(1, len(ids) + 1):
                decode(ids[:k])

        runners["TextIteratorStreamer"] = streamer
        runners["full_redecode"] = full_redecode
    return runners


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 2048, 8192])
    ap.add_argument("--tokenizers", nargs="+", default=["qwen3", "mistral_v1"])
    ap.add_argument("--languages", nargs="+", default=["english", "chinese", "japanese", "emoji"])
    ap.add_argument("--quick", action="store_true", help="one repeat, lengths 256 and 2048")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.lengths = 1, [256, 2048]
    results = []
    for name in args.tokenizers:
        tok = tokenizer_zoo.load(name)
        for lang in args.languages:
            for n in args.lengths:
                ids = token_stream(tok, lang, n)
                # The O(N)-per-token baselines take seconds at 8192: one repeat is enough
                # to show their slope, and keeps the run short.
                heavy = interleaved_medians(runners_for(tok, ids, True), 1, warmup=0) if n <= 2048 else None
                light = interleaved_medians(runners_for(tok, ids, False), args.repeats)
                if heavy is None:
                    heavy = interleaved_medians(
                        {k: v for k, v in runners_for(tok, ids, True).items() if k in ("TextIteratorStreamer", "full_redecode")},
                        1,
                        warmup=0,
                    )
                merged = {**heavy, **light}
                for method, sec in merged.items():
                    results.append(
                        {"tokenizer": name, "language": lang, "tokens": n, "method": method, "us_per_token": sec / n * 1e6}
                    )
                print(f"done {name} {lang} {n}", flush=True)
    base = {(r["tokenizer"], r["language"], r["tokens"]): r["us_per_token"] for r in results if r["method"] == "DecodeStream"}
    rows = []
    for r in results:
        b = base[(r["tokenizer"], r["language"], r["tokens"])]
        rows.append([r["tokenizer"], r["language"], r["tokens"], r["method"], f"{r['us_per_token']:.3f}", f"{r['us_per_token'] / b:.2f}x"])
    print(table(rows, ["tokenizer", "language", "tokens", "method", "µs/token", "vs DecodeStream"]))
    # Flatness: core at the longest length against the shortest, per stream.
    lo, hi = min(args.lengths), max(args.lengths)
    flat = []
    for name in args.tokenizers:
        for lang in args.languages:
            for method in ("core_str", "core_delta", "core_delta_no_eos", "DecodeStream"):
                get = {(r["tokens"]): r["us_per_token"] for r in results if (r["tokenizer"], r["language"], r["method"]) == (name, lang, method)}
                flat.append([name, lang, method, f"{get[hi] / get[lo]:.2f}"])
    print()
    print(table(flat, ["tokenizer", "language", "method", f"µs/token at {hi} / at {lo}"]))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_core.json").write_text(json.dumps(results, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    fig, axes = plt.subplots(len(args.tokenizers), len(args.languages), figsize=(4 * len(args.languages), 3.5 * len(args.tokenizers)), squeeze=False)
    methods = sorted({r["method"] for r in results})
    for a, name in enumerate(args.tokenizers):
        for b, lang in enumerate(args.languages):
            ax = axes[a][b]
            for m in methods:
                pts = sorted((r["tokens"], r["us_per_token"]) for r in results if (r["tokenizer"], r["language"], r["method"]) == (name, lang, m))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{name} / {lang}")
            ax.set_xlabel("tokens in stream")
            ax.set_ylabel("µs per token")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "bench_core.png", dpi=90)
    print(f"plot: {OUT / 'bench_core.png'}")


if __name__ == "__main__":
    main()
