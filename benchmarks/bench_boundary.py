"""Stops and tags: per-token cost and characters held back, ours against vLLM.

Same process, same Qwen3 token stream (real multilingual text with a reasoning block),
same four stop strings (none of which occurs, so both run to the end):

* ``vllm_fast``: vLLM 0.33's own ``FastIncrementalDetokenizer`` with the stops in its
  ``SamplingParams``: ``update([id], False)`` then ``get_next_output_text(False, True)``
  per token, as its OutputProcessor calls them.
* ``core_stops``: ``DetokenizerState`` with the same stops.
* ``core_stops_tags``: the same plus the qwen3 tags (reasoning and tool-call channels,
  which vLLM does in a separate reasoning parser not timed here).

Held back: after each token, the characters that the full decode has settled but the
stream has not sent. vLLM holds max(len(stop)) - 1 characters whenever stops are set
(vllm #11089); ours holds only a genuine partial match.

Run: ``.venv/bin/python benchmarks/bench_boundary.py [--tokens 2048] [--repeats 7]``
"""

from __future__ import annotations

import argparse
import statistics

from _common import PARAGRAPHS, interleaved_medians, table, tokenizer_zoo

from detok_plugin import DetokenizerState, IncrementalDetokenizer

STOPS = ["\n\nUser:", "<|endoftext|>", "Observation:", "###"]


def build_stream(tok, n: int) -> list[int]:
    body = "".join(PARAGRAPHS.values())
    text = f"<think>\n{PARAGRAPHS['chinese']}Let me check the units.\n</think>\n\n"
    while len(tok.encode(text, add_special_tokens=False)) < n:
        text += body
    return tok.encode(text, add_special_tokens=False)[:n]


def vllm_detokenizer(tok, stops):
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

    params = SamplingParams(stop=stops, max_tokens=1 << 20)
    req = EngineCoreRequest(
        request_id="bench", prompt_token_ids=[], mm_features=None, sampling_params=params,
        pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
    )
    return FastIncrementalDetokenizer(tok, req)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    tok = tokenizer_zoo.load("qwen3")
    ids = build_stream(tok, args.tokens)

    def vllm_fast():
        d = vllm_detokenizer(tok, STOPS)
        for i in ids:
            d.update([i], False)
            d.get_next_output_text(False, True)

    def core_stops():
        s = DetokenizerState.from_tokenizer(tok, stop=STOPS, eos_token_ids=())
        for i in ids:
            s.push(i)

    def core_stops_tags():
        s = DetokenizerState.from_tokenizer(tok, stop=STOPS, tags="qwen3", eos_token_ids=())
        for i in ids:
            s.push(i)

    med = interleaved_medians(
        {"vllm_fast": vllm_fast, "core_stops": core_stops, "core_stops_tags": core_stops_tags}, args.repeats
    )
    base = med["vllm_fast"]
    print(f"Qwen3, {len(ids)} tokens, stops={STOPS}, median of {args.repeats} interleaved repeats")
    print(table([[k, f"{v / len(ids) * 1e6:.3f}", f"{v / base:.2f}x"] for k, v in med.items()], ["method", "µs/token", "vs vllm_fast"]))

    # Characters held back per token, against what the decode has settled.
    ref = IncrementalDetokenizer(tok, [])
    ours = DetokenizerState.from_tokenizer(tok, stop=STOPS, eos_token_ids=())
    theirs = vllm_detokenizer(tok, STOPS)
    settled = sent_ours = sent_vllm = 0
    held_ours, held_vllm = [], []
    for i in ids:
        settled += len(ref.push(i))
        sent_ours += len(ours.push(i).text)
        theirs.update([i], False)
        sent_vllm += len(theirs.get_next_output_text(False, True))
        held_ours.append(settled - sent_ours)
        held_vllm.append(settled - sent_vllm)
    rows = []
    for name, h in (("vllm_fast", held_vllm), ("core_stops", held_ours)):
        rows.append([name, f"{statistics.mean(h):.2f}", max(h), f"{sum(x > 0 for x in h) / len(h):.1%}"])
    print()
    print(table(rows, ["method", "mean chars held", "max held", "tokens with a hold"]))


if __name__ == "__main__":
    main()
