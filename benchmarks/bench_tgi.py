"""TGI's own text path against the shim's, and TGI's step stock against wrapped, in one run.

TGI's server is not on PyPI: the script runs where ``DETOK_TGI_PYTHON`` names a Python
with TGI's ``text_generation_server`` and detok-plugin (docs/tgi.md), and otherwise says
so and exits 0. It re-runs itself in that interpreter; the model is TGI's non-flash
``CausalLM`` with TGI's ``OPTForCausalLM`` and tiny random weights over the real Qwen3
tokenizer (tests/support/tgi_harness.py), on the CPU.

1. Text path, per generated id, on the same recorded ids and stops (the ids of the
   harness's corpus as TGI's loop produced them with the shim; a third of the requests
   have a stop string), step by step over the 24 requests as one batch would run them:
   stock = TGI's ``StoppingCriteria.from_pb`` per request (setup), then per id TGI's
   ``Model.decode_token`` + the criteria, and the final ``decode_token`` for
   ``generated_text``; shim = the patched ``from_pb`` and the first step's ``prepare``
   (setup: the request's stream from the prompt ids of a real ``CausalLMBatch``), then per
   step ``prepare``, the criteria per id and ``rewrite`` into TGI's own ``Generation``
   records; and, to show where the shim's time goes, the core alone (each request's
   ``ServingStream`` on the same ids). Each step is timed on its own, and a step's records
   are built untimed just before it, fresh and carrying TGI's text for each id, as TGI's
   step builds them just before ``rewrite`` (stock builds them too; neither side is timed
   building them). The runners take turns going first; printed: medians per id, and the
   median and interquartile range of the per-repeat ratios, without and with the setup.
   Target: shim/stock <= 0.2.
2. ``generate_token`` per decode step, stock against wrapped, at batch 1, 16 and 64, on
   one prefilled batch per size (no stops, EOS ignored, one torch thread): each pair of
   steps runs one stock step (TGI's ``generate_token`` and criteria) and one wrapped step
   (the shim's wrapper and criteria) on the same running batch, alternating which goes
   first; after each step the other side's criteria take the step's ids untimed, so both
   stay in step. Printed: the median of the per-pair ratios wrapped/stock, its
   interquartile range and a bootstrap 95% interval of the median. Target: no slower
   within noise (the interval reaches 1.0 or lies below it). The wrapped step still runs
   TGI's own ``decode_token``, whose text the shim replaces.

The step part times CPU time (``time.process_time_ns``), not the wall clock: on a shared
machine the wall clock also counts waiting for a core, and that falls unevenly (a short
run more often fits in one time slice than a long one). The text part times each engine
step on its own (tens of microseconds, which a time slice seldom splits) with
``time.perf_counter_ns``: ``process_time_ns`` is a system call of about 0.5 µs here, which
per step would be 2-3% of the shim's step and 0.5% of stock's.

    DETOK_TGI_PYTHON=/path/to/tgi/python .venv/bin/python benchmarks/bench_tgi.py \
        [--repeats 200] [--pairs 40] [--part text|step|both]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="text path repeats")
    parser.add_argument("--pairs", type=int, default=40, help="stock/wrapped step pairs per batch size")
    parser.add_argument("--part", choices=("text", "step", "both"), default="both")
    parser.add_argument("--inside", nargs=2, metavar=("TOKENIZER_DIR", "WORK_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        return inside(*args.inside, repeats=args.repeats, pairs=args.pairs, part=args.part)
    python = os.environ.get("DETOK_TGI_PYTHON")
    if not python or not Path(python).exists():
        print("bench_tgi: skipped: DETOK_TGI_PYTHON does not name a Python with TGI's server (docs/tgi.md)")
        return 0
    sys.path.insert(0, str(HERE))
    from _common import tokenizer_zoo

    env = {k: v for k, v in os.environ.items() if k != "DETOK_PLUGIN"}
    env.update(ATTENTION="paged", PREFIX_CACHING="0", TQDM_DISABLE="1")
    with tempfile.TemporaryDirectory() as work:
        cmd = [python, __file__, "--inside", str(tokenizer_zoo.directory("qwen3")), work,
               "--repeats", str(args.repeats), "--pairs", str(args.pairs), "--part", args.part]
        return subprocess.run(cmd, env=env).returncode


# --- inside TGI's Python ----------------------------------------------------------------


def inside(tokenizer_dir: str, work: str, *, repeats: int, pairs: int, part: str) -> int:
    import logging

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from loguru import logger

    logger.remove()  # TGI's INFO lines would drown the table
    logging.disable(logging.WARNING)
    import tgi_harness
    import torch
    from detok_plugin.integrations import tgi

    torch.set_num_threads(1)  # the step pairs: both sides alike, fewer threads to lose to other workers
    model_dir = str(Path(work) / "model")
    tgi_harness.make_model(tokenizer_dir, model_dir)
    model = tgi_harness.load_model(model_dir)
    print(f"TGI contract {tgi.contract_fingerprint()}: {tgi.VERIFIED_CONTRACTS.get(tgi.contract_fingerprint(), 'unverified')}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if part in ("text", "both"):
        assert tgi.install(tgi.Settings(enabled=True))
        first = tgi_harness.drive(model, tgi_harness.corpus(model.tokenizer, None))
        texts = {rid: rec["final"] for rid, rec in first.items()}
        waves = tgi_harness.corpus(model.tokenizer, texts)
        recorded = tgi_harness.drive(model, waves)
        tgi.uninstall()
        text_path(model, [r for wave in waves for r in wave], recorded, repeats)
    if part in ("step", "both"):
        step_times(model, pairs)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def spread(values: list[float]) -> str:
    """``median [q1, q3]`` of ``values``."""
    import statistics

    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.3f}x [IQR {q1:.3f}, {q3:.3f}]"


def text_path(model, requests, recorded, repeats: int) -> None:
    import gc
    import statistics
    import time

    import torch
    from detok_plugin.integrations.tgi import Settings
    from detok_plugin.integrations.tgi.step import criteria_class, prepare, rewrite
    from text_generation_server.models.types import GeneratedText, Generation, Tokens
    from text_generation_server.pb import generate_pb2 as pb
    from text_generation_server.utils.tokens import StoppingCriteria

    tok = model.tokenizer
    cls = criteria_class(StoppingCriteria, Settings(enabled=True))
    batch = model.batch_type.from_pb(pb.Batch(id=0, requests=requests, size=len(requests)), tok,
                                     torch.float32, model.device)
    prompts = [tok(r.inputs)["input_ids"] for r in requests]
    ids = [recorded[r.id]["ids"] for r in requests]
    n_ids = sum(map(len, ids))
    # Step t: the requests still running.
    steps = [[k for k in range(len(requests)) if t < len(ids[k])] for t in range(max(map(len, ids)))]
    special = model.all_special_ids
    step_requests = [[requests[k] for k in live] for live in steps]
    clock = time.perf_counter_ns  # per step: see the module docstring

    def stock_setup() -> tuple:
        return ([StoppingCriteria.from_pb(r.stopping_parameters, tok) for r in requests],
                [list(p) for p in prompts], [[len(p) - 5, len(p)] for p in prompts])  # from_pb's offsets

    def stock(state: tuple) -> int:
        criterias, all_ids, offsets = state
        decode = model.decode_token
        spent = 0
        for t, live in enumerate(steps):
            t0 = clock()
            for k in live:
                tid, seq, off = ids[k][t], all_ids[k], offsets[k]
                seq.append(tid)
                text, off[0], off[1] = decode(seq, off[0], off[1])
                criterias[k](tid, text)
                if t == len(ids[k]) - 1:  # generated_text
                    decode(seq, len(seq) - t - 2, len(seq) - t - 1, skip_special_tokens=True)
            spent += clock() - t0
        return spent

    # TGI's own text of every id, which the records TGI's step builds carry (rewrite replaces
    # it): one untimed stock pass whose criteria keep the text TGI hands them.
    tgi_texts: list[list[str]] = [[] for _ in requests]
    _, all_ids, offsets = stock_setup()
    stock(([lambda _tid, text, keep=texts.append: keep(text) for texts in tgi_texts], all_ids, offsets))

    def records(t: int, live: list[int]) -> list:
        """Step t's Generation records, built as TGI's step builds them (fresh, with TGI's text)."""
        return [Generation(requests[k].id, None, Tokens([ids[k][t]], [0.0], [tgi_texts[k][t]], [ids[k][t] in special]),
                           GeneratedText(tgi_texts[k][t], t + 1, 0, None) if t == len(ids[k]) - 1 else None, None)
                for k in live]

    def shim_setup() -> list:
        criterias = [cls.from_stock(StoppingCriteria.from_pb(r.stopping_parameters, tok),
                                    tuple(r.stopping_parameters.stop_sequences), tok) for r in requests]
        batch.requests, batch.stopping_criterias = requests, criterias
        prepare(batch, cls)  # the first step builds each request's stream
        return [[criterias[k] for k in live] for live in steps]

    def shim(step_criterias: list) -> int:
        spent = 0
        for t, live in enumerate(steps):
            # TGI's step builds the records between the criteria calls and rewrite; here just
            # before the timed part (both sides build them; neither is timed building them).
            gens = records(t, live)
            t0 = clock()
            batch.requests, batch.stopping_criterias = step_requests[t], step_criterias[t]
            ours = prepare(batch, cls)
            for k, criteria in zip(live, step_criterias[t]):
                criteria(ids[k][t], "")
            rewrite(gens, ours)
            spent += clock() - t0
        return spent

    def core(step_criterias: list) -> int:
        # The core alone under the shim: each request's ServingStream, the same ids.
        spent = 0
        for t, live in enumerate(steps):
            t0 = clock()
            for k, criteria in zip(live, step_criterias[t]):
                stream = criteria.stream
                stream.push_text(ids[k][t])
                if t == len(ids[k]) - 1:
                    stream.finish()
            spent += clock() - t0
        return spent

    runners = {"stock": (stock_setup, stock), "shim": (shim_setup, shim), "core": (shim_setup, core)}
    names = list(runners)
    times: dict[str, list[float]] = {name + part: [] for name in names for part in ("_setup", "")}
    for k in range(repeats + 2):  # two warm-up repeats; each runner first in turn
        gc.collect()
        for name in names[k % 3:] + names[:k % 3]:
            setup, run = runners[name]
            t0 = clock()
            state = setup()
            t1 = clock()
            spent = run(state)
            if k >= 2:
                times[name + "_setup"].append((t1 - t0) / 1e3)
                times[name].append(spent / 1e3)
    per_id = [s / k for s, k in zip(times["shim"], times["stock"])]
    whole = [(a + b) / (c + d) for a, b, c, d in zip(times["shim_setup"], times["shim"], times["stock_setup"], times["stock"])]
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\ntext path, {len(requests)} requests, {n_ids} ids (Qwen3, skewed sampling), {repeats} repeats, each step timed:")
    print(f"  stock decode_token + StoppingCriteria: {med['stock'] / n_ids:.2f} us/id  "
          f"(+ from_pb {med['stock_setup'] / len(requests):.1f} us/request)")
    print(f"  shim criteria + prepare + rewrite:     {med['shim'] / n_ids:.2f} us/id  "
          f"(+ setup {med['shim_setup'] / len(requests):.1f} us/request: from_pb, stream from the prompt)")
    print(f"  of which the core (ServingStream.push_text, finish): {med['core'] / n_ids:.2f} us/id")
    print(f"  shim/stock per id, setup apart:  {spread(per_id)}  (target <= 0.2)")
    print(f"  shim/stock with each side's setup: {spread(whole)}")


def step_times(model, pairs: int) -> None:
    import random
    import statistics

    from _common import table

    rows = []
    for size in (1, 16, 64):
        ms = step_pairs(model, size, pairs)
        ratios = [w / s for w, s in zip(ms[True], ms[False])]
        rng = random.Random(0)
        boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
        lo, hi = boot[49], boot[1949]
        verdict = "slower by > 1%" if lo > 1.01 else ("faster by > 1%" if hi < 0.99 else "within 1%")
        rows.append((size, f"{statistics.median(ms[False]):.2f}", f"{statistics.median(ms[True]):.2f}",
                     spread(ratios), f"[{lo:.3f}, {hi:.3f}]", verdict))
    print(f"\ngenerate_token per decode step (CPU, OPT over Qwen3, one torch thread), {pairs} interleaved pairs, CPU time:")
    print(table(rows, ("batch", "stock ms", "wrapped ms", "wrapped/stock per pair", "95% CI of median", "verdict")))


def step_pairs(model, size: int, pairs: int) -> dict[bool, list[float]]:
    """Milliseconds of each stock (False) and wrapped (True) step, ``pairs`` of each, on
    one running batch of ``size`` requests; the k-th of each side form pair k."""
    import gc
    import time

    import tgi_harness
    import torch
    from detok_plugin.integrations import tgi
    from detok_plugin.integrations.tgi._framework import STOCK_ATTR
    from text_generation_server.pb import generate_pb2 as pb
    from text_generation_server.utils.tokens import StoppingCriteria

    assert tgi.install(tgi.Settings(enabled=True))
    try:
        wrapped = type(model).generate_token
        reqs = [tgi_harness.request_pb(i + 1, tgi_harness.PROMPTS[i % len(tgi_harness.PROMPTS)],
                                       max_new_tokens=2 * pairs + 8, stops=[], seed=i, ignore_eos=True)
                for i in range(size)]
        batch = model.batch_type.from_pb(pb.Batch(id=size, requests=reqs, size=size), model.tokenizer,
                                         torch.float32, model.device)  # the shim's criteria
    finally:
        tgi.uninstall()
    theirs = [StoppingCriteria.from_pb(r.stopping_parameters, model.tokenizer) for r in reqs]
    sides = {False: (getattr(wrapped, STOCK_ATTR), theirs), True: (wrapped, batch.stopping_criterias)}
    index = {r.id: i for i, r in enumerate(reqs)}
    ms: dict[bool, list[float]] = {False: [], True: []}
    order = [True, False, True] + [on for k in range(pairs) for on in ((False, True), (True, False))[k % 2]]
    for n, on in enumerate(order):  # a prefill (builds the shim's streams), a warm-up pair, the pairs
        fn, criterias = sides[on]
        batch.stopping_criterias = criterias
        gc.collect()  # every step starts from the same collector state (the other side's sync left garbage)
        t0 = time.process_time_ns()
        gens, batch, _ = fn(model, batch)
        if n >= 3:
            ms[on].append((time.process_time_ns() - t0) / 1e6)
        for g in gens:  # the other side takes the same ids, untimed
            other = sides[not on][1][index[g.request_id]]
            for tid in g.tokens.token_ids:
                other(int(tid), "")
            if not on:
                other.sent = len(other.texts)  # as rewrite would
    return ms


if __name__ == "__main__":
    raise SystemExit(main())
