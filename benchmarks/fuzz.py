"""Differential fuzz: N random streams through every layer a server uses, on every tokenizer
the tests build, each checked against the tokenizer's own decode.

Stream ``s`` (seeds ``--seed`` .. ``--seed + --streams - 1``) is drawn from its seed alone:
its layer is ``layers[s % L]``, its tokenizer ``tokenizers[(s // L) % T]``, and its ids and
options come from ``random.Random(s)`` (``_fuzz_cases.draw``). So ``--seed`` resumes a run
where another stopped, and a failing seed reproduces with ``--seed S --streams 1`` and the
same ``--layers`` and ``--tokenizers`` (each failure prints that command).

Layers: ``serving`` (``ServingStream``), ``tagged`` (``TaggedServingStream``), ``chat``
(``ChatStream``), ``vllm`` (the plugin's detokenizer in vLLM's real ``OutputProcessor``),
``tgi`` (the TGI shim's ``RequestText``). The oracle and the checks are in
``_fuzz_oracle`` and ``_fuzz_layers``: exact text, nothing taken back, nothing held without
a genuine partial stop or tag match, the oracle's finish, no exception.

    .venv/bin/python benchmarks/fuzz.py                       # 100,000 streams
    .venv/bin/python benchmarks/fuzz.py --streams 5000 --seed 7 --layers serving,vllm
    .venv/bin/python benchmarks/fuzz.py --ci                  # the slice tests/test_fuzz_slice.py runs

Not a timed benchmark: it prints counts, failures and the seconds the run took.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

import _common  # noqa: F401  (puts tests/support on the path)
from _fuzz_cases import CI_TOKENIZERS, TOKENIZERS, Tok, draw, load
from _fuzz_hosts import tgi, vllm, vllm_missing, vllm_plugin_on
from _fuzz_layers import LAYERS, chat, serving, tagged
from _fuzz_oracle import Oracle

RUNNERS = {"serving": serving, "tagged": tagged, "chat": chat, "vllm": vllm, "tgi": tgi}
CI = {"streams": 250, "seed": 20250101, "tokenizers": CI_TOKENIZERS}


class Failure(NamedTuple):
    seed: int
    layer: str
    tok: str
    problems: list[str]


class Summary(NamedTuple):
    streams: int
    by_layer: Counter[str]
    by_tokenizer: Counter[str]
    failures: list[Failure]
    seconds: float

    def lines(self, layers: Sequence[str], tokenizers: Sequence[str]) -> list[str]:
        out = [
            f"fuzz: {self.streams} streams, {len(self.failures)} failures, {self.seconds:.0f} s",
            "  layers: " + ", ".join(f"{k} {self.by_layer[k]}" for k in layers),
            "  tokenizers: " + ", ".join(f"{k} {self.by_tokenizer[k]}" for k in tokenizers),
        ]
        for f in self.failures[:50]:
            out.append(f"  FAIL seed {f.seed} ({f.layer}, {f.tok}): {f.problems[0]}")
            out.append(
                f"    reproduce: .venv/bin/python benchmarks/fuzz.py --seed {f.seed} --streams 1 "
                f"--layers {','.join(layers)} --tokenizers {','.join(tokenizers)}"
            )
        if len(self.failures) > 50:
            out.append(f"  {len(self.failures) - 50} more failures, seeds " + " ".join(str(f.seed) for f in self.failures[50:]))
        return out


def one(seed: int, layers: Sequence[str], toks: Sequence[Tok]) -> Failure | None:
    """Draw and run the stream of ``seed``; its failure, or None."""
    layer = layers[seed % len(layers)]
    t = toks[(seed // len(layers)) % len(toks)]

    def final_text(prompt: list[int], out: list[int], skip: bool, spaces: bool) -> str:
        return Oracle(t.tok, prompt, out, skip, spaces, []).text(len(out))

    try:
        case = draw(seed, layer, t, final_text)
        problems = RUNNERS[layer](case, t)
    except Exception as exc:  # any exception is a failure of the stream, named by its seed
        problems = [f"raised {exc!r} at {traceback.extract_tb(exc.__traceback__)[-1].name}"]
    return Failure(seed, layer, t.name, problems) if problems else None


def run(streams: int, seed: int, layers: Sequence[str], tokenizers: Sequence[str], progress: Any = None) -> Summary:
    """Run ``streams`` streams from ``seed`` on; ``progress(done, failed)`` after each.

    The streams' own warnings (an unknown id, a malformed tool call sent as content) are
    expected here and silenced while it runs; an ERROR (a request handed over to stock)
    still shows. vLLM's detokenizer is the plugin's while it runs, and stock after."""
    t0 = time.monotonic()
    toks = [load(name) for name in tokenizers]
    by_layer: Counter[str] = Counter()
    by_tok: Counter[str] = Counter()
    failures = []
    on = vllm_plugin_on() if "vllm" in layers else contextlib.nullcontext()
    logging.disable(logging.WARNING)
    try:
        with on:
            for s in range(seed, seed + streams):
                f = one(s, layers, toks)
                by_layer[layers[s % len(layers)]] += 1
                by_tok[toks[(s // len(layers)) % len(toks)].name] += 1
                if f is not None:
                    failures.append(f)
                if progress is not None:
                    progress(s - seed + 1, len(failures))
    finally:
        logging.disable(logging.NOTSET)
    return Summary(streams, by_layer, by_tok, failures, time.monotonic() - t0)


def _bar(total: int, start: float) -> Any:
    def show(done: int, failed: int) -> None:
        if done % 50 and done != total:
            return
        rate = done / max(time.monotonic() - start, 1e-9)
        width = 30
        fill = width * done // total
        eta = (total - done) / rate if rate else 0
        sys.stderr.write(
            f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} streams, {failed} failures, "
            f"{rate:.0f}/s, {eta / 60:.0f} min left "
        )
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def main(argv: Sequence[str] | None = None) -> Summary:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0, help="the first stream's seed (a run resumes from where another ended)")
    p.add_argument("--layers", default=",".join(LAYERS), help=f"comma-separated, of {', '.join(LAYERS)}")
    p.add_argument("--tokenizers", default=",".join(TOKENIZERS), help=f"comma-separated, of {', '.join(TOKENIZERS)}")
    p.add_argument("--ci", action="store_true", help=f"the CI slice: {CI['streams']} streams from seed {CI['seed']} on {', '.join(CI_TOKENIZERS)}")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.ci:
        args.streams, args.seed, args.tokenizers = CI["streams"], CI["seed"], ",".join(CI["tokenizers"])
    layers = [x for x in args.layers.split(",") if x]
    tokenizers = [x for x in args.tokenizers.split(",") if x]
    for x in layers:
        if x not in RUNNERS:
            p.error(f"unknown layer {x!r}: choose from {', '.join(LAYERS)}")
    for x in tokenizers:
        if x not in TOKENIZERS:
            p.error(f"unknown tokenizer {x!r}: choose from {', '.join(TOKENIZERS)}")
    if "vllm" in layers and (why := vllm_missing()) is not None:
        print(f"fuzz: the vllm layer is left out: {why}", file=sys.stderr)
        layers.remove("vllm")
    progress = None if args.no_progress else _bar(args.streams, time.monotonic())
    summary = run(args.streams, args.seed, layers, tokenizers, progress)
    print(f"command: benchmarks/fuzz.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print("\n".join(summary.lines(layers, tokenizers)))
    return summary


if __name__ == "__main__":
    sys.exit(1 if main().failures else 0)
