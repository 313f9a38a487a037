"""Cost of opening one request's stream, the tokenizer's table warm, with a stop set never
seen before (multi-tenant API traffic: every request brings its own stops).

Rows, all in this process on the same prompts:

* ``DecodeStream`` (the named baseline): what vLLM's fast detokenizer does per request,
  a ``tokenizers`` ``DecodeStream`` stepped over the prompt's last 6 ids.
* ``ServingStream``: ``ServingStream.from_tokenizer(tok, prompt_ids=..., stop=[4 new stops])``,
  the serving layer (vLLM, TGI).
* ``DetokenizerState``: the reference layer, same options.
* ``*_shared``: the same with one stop set every request shares (its automaton cached).

Target: a never-seen stop set at most 40 µs per request on both layers.

Run: ``.venv/bin/python benchmarks/bench_open.py [--requests 2000] [--tokenizers qwen3 mistral_v1]``
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import time

from _common import table, token_stream, tokenizer_zoo

from detok_plugin import DetokenizerState, ServingStream, build_table

_serial = itertools.count()


def new_stops() -> list[str]:
    """Four stops no request has used before (one of 30+ characters)."""
    n = next(_serial)
    return [f"\n\nUser{n}:", f"###{n}", f"<END {n}>", f"{n} and that is the end of the reply, thanks"]


SHARED = ["\n\nUser:", "###", "<END>", "and that is the end of the reply, thanks"]


def per_request_us(makers: dict, prompts: list[list[int]], repeats: int) -> dict[str, float]:
    """Median µs per request of each maker over ``repeats`` passes, the makers interleaved
    in every pass (load on the machine falls on all alike), in CPU time (the shared
    machine's load is not ours)."""
    samples: dict[str, list[float]] = {k: [] for k in makers}
    for _ in range(repeats):
        for name, make in makers.items():
            t0 = time.process_time_ns()
            for p in prompts:
                make(p)
            samples[name].append((time.process_time_ns() - t0) / len(prompts) / 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokenizers", nargs="+", default=["qwen3", "mistral_v1"])
    args = ap.parse_args()
    from tokenizers.decoders import DecodeStream

    rows = []
    for name in args.tokenizers:
        tok = tokenizer_zoo.load(name)
        build_table(tok)  # warm: the table is built once per tokenizer, not per request
        backend = tok.backend_tokenizer
        base_ids = token_stream(tok, "english", 64 + args.requests)
        prompts = [base_ids[k : k + 64] for k in range(args.requests)]

        def decode_stream(p, backend=backend):
            ds = DecodeStream(skip_special_tokens=True)
            for i in p[-6:]:
                ds.step(backend, i)

        makers = {
            "DecodeStream": decode_stream,
            "ServingStream": lambda p, tok=tok: ServingStream.from_tokenizer(tok, prompt_ids=p, stop=new_stops()),
            "DetokenizerState": lambda p, tok=tok: DetokenizerState.from_tokenizer(tok, prompt_ids=p, stop=new_stops()),
            "ServingStream_shared": lambda p, tok=tok: ServingStream.from_tokenizer(tok, prompt_ids=p, stop=SHARED),
            "DetokenizerState_shared": lambda p, tok=tok: DetokenizerState.from_tokenizer(tok, prompt_ids=p, stop=SHARED),
        }
        for make in makers.values():  # warm up
            make(prompts[0])
        # The setup heap (the tokenizer's tables) is frozen, as in bench_vllm_output_processor:
        # otherwise a full collection scanning it lands on whichever row happens to run.
        gc.collect()
        gc.freeze()
        got = per_request_us(makers, prompts, args.repeats)
        for k, us in got.items():
            target = "≤ 40 µs " + ("met" if us <= 40 else "missed") if k in ("ServingStream", "DetokenizerState") else ""
            rows.append([name, k, f"{us:.1f}", f"{us / got['DecodeStream']:.2f}x", target])
    print(table(rows, ["tokenizer", "open", "µs/request", "vs DecodeStream", "target"]))


if __name__ == "__main__":
    main()
