"""TGI's own text path against the shim's, and TGI's step stock against wrapped, in one run.

TGI's server is not on PyPI: the script runs where ``DETOK_TGI_PYTHON`` names a Python
with TGI's ``text_generation_server`` and detok-plugin (docs/tgi.md), and otherwise says
so and exits 0. It re-runs itself in that interpreter; the model is TGI's non-flash
``CausalLM`` with TGI's ``OPTForCausalLM`` and tiny random weights over the real Qwen3
tokenizer (tests/tgi_harness.py), on the CPU.

1. Text path, per generated id, on the same recorded ids and stops (the ids of the
   harness's corpus as TGI's loop produced them with the shim; a third of the requests
   have a stop string): stock = TGI's ``Model.decode_token`` + its ``StoppingCriteria``
   (from ``from_pb``) per id, and the final ``decode_token`` for ``generated_text``; shim =
   our criteria (from the patched ``from_pb``, its state built from the prompt) per id,
   the step's texts taken, and the joined text. Printed per id with and without the
   per-request setup (timed apart). Target: shim/stock <= 0.2.
2. ``generate_token`` per step, stock against wrapped (the shim on), at batch 1, 16 and 64,
   on prefilled batches with no stops and EOS ignored, interleaved repeats. Target: no
   slower within noise. (The wrapped step still runs TGI's own ``decode_token``, whose
   text the shim replaces; only the criteria's work changes.)

    DETOK_TGI_PYTHON=/path/to/tgi/python .venv/bin/python benchmarks/bench_tgi.py [--repeats 5]
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
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed per batch")
    parser.add_argument("--inside", nargs=2, metavar=("TOKENIZER_DIR", "WORK_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        return inside(*args.inside, repeats=args.repeats, steps=args.steps)
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
               "--repeats", str(args.repeats), "--steps", str(args.steps)]
        return subprocess.run(cmd, env=env).returncode


# --- inside TGI's Python ----------------------------------------------------------------


def inside(tokenizer_dir: str, work: str, *, repeats: int, steps: int) -> int:
    import logging

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT / "tests"))
    from loguru import logger

    logger.remove()  # TGI's INFO lines would drown the table
    logging.disable(logging.WARNING)
    import tgi_harness
    from _common import table
    from detok_plugin.integrations import tgi

    model_dir = str(Path(work) / "model")
    tgi_harness.make_model(tokenizer_dir, model_dir)
    model = tgi_harness.load_model(model_dir)
    print(f"TGI contract {tgi.contract_fingerprint()}: {tgi.VERIFIED_CONTRACTS.get(tgi.contract_fingerprint(), 'unverified')}")
    assert tgi.install(tgi.Settings(enabled=True))
    first = tgi_harness.drive(model, tgi_harness.corpus(model.tokenizer, None))
    texts = {rid: rec["final"] for rid, rec in first.items()}
    waves = tgi_harness.corpus(model.tokenizer, texts)
    recorded = tgi_harness.drive(model, waves)
    tgi.uninstall()
    requests = [r for wave in waves for r in wave]
    text_path(model, requests, recorded, repeats)
    step_times(model, steps, repeats, table)
    return 0


def text_path(model, requests, recorded, repeats: int) -> None:
    from _common import interleaved_medians
    from detok_plugin.integrations._tgi_step import criteria_class
    from detok_plugin.integrations.tgi import Settings
    from text_generation_server.utils.tokens import StoppingCriteria

    tok = model.tokenizer
    ours = criteria_class(StoppingCriteria, Settings(enabled=True))
    cases = [(r, tok(r.inputs)["input_ids"], recorded[r.id]["ids"]) for r in requests]
    n_ids = sum(len(ids) for _, _, ids in cases)

    def stock() -> None:
        for r, prompt, ids in cases:
            criteria = StoppingCriteria.from_pb(r.stopping_parameters, tok)
            all_ids = list(prompt)
            prefix, read = len(prompt) - 5, len(prompt)  # CausalLMBatch.from_pb's offsets
            for tid in ids:
                all_ids.append(tid)
                text, prefix, read = model.decode_token(all_ids, prefix, read)
                criteria(tid, text)
            model.decode_token(all_ids, len(all_ids) - len(ids) - 1, len(all_ids) - len(ids),
                               skip_special_tokens=True)

    def shim_setup() -> list:
        # What the patched from_pb and the wrapper's first step do for each request.
        built = []
        for r, prompt, _ in cases:
            pb = r.stopping_parameters
            criteria = ours.from_stock(StoppingCriteria.from_pb(pb, tok), tuple(pb.stop_sequences), tok)
            criteria.detok_build(prompt, r.id)
            built.append(criteria)
        return built

    def shim() -> None:
        for criteria, (_, _, ids) in zip(shim_setup(), cases):
            for tid in ids:
                criteria(tid, "")
                criteria.take_step()
            _ = criteria.text

    medians = interleaved_medians({"stock": stock, "shim": shim, "setup": shim_setup}, repeats)
    us = {k: v / n_ids * 1e6 for k, v in medians.items()}
    per_id = us["shim"] - us["setup"]
    setup_us = medians["setup"] / len(cases) * 1e6
    print(f"\ntext path, {len(cases)} requests, {n_ids} ids (Qwen3, skewed sampling), median of {repeats}:")
    print(f"  stock decode_token + StoppingCriteria:   {us['stock']:.2f} us/id")
    print(f"  shim, per request built and all its ids: {us['shim']:.2f} us/id  ({us['shim'] / us['stock']:.3f}x)")
    print(f"  shim, per id (setup taken off):          {per_id:.2f} us/id  ({per_id / us['stock']:.3f}x, target <= 0.2)")
    print(f"  shim setup per request (criteria + state from the prompt): {setup_us:.1f} us")


def step_times(model, steps: int, repeats: int, table) -> None:
    import statistics
    import time

    import tgi_harness
    import torch
    from detok_plugin.integrations import tgi
    from text_generation_server.pb import generate_pb2 as pb

    def timed_steps(size: int, on: bool) -> float:
        """Seconds per decode step of one fresh batch (its prefill not timed)."""
        if on:
            assert tgi.install(tgi.Settings(enabled=True))
        try:
            reqs = [tgi_harness.request_pb(i + 1, tgi_harness.PROMPTS[i % len(tgi_harness.PROMPTS)],
                                           max_new_tokens=steps + 2, stops=[], seed=i, ignore_eos=True)
                    for i in range(size)]
            b = model.batch_type.from_pb(pb.Batch(id=size, requests=reqs, size=size), model.tokenizer,
                                         torch.float32, model.device)
            _, b, _ = model.generate_token(b)  # prefill
            t0 = time.perf_counter_ns()
            for _ in range(steps):
                _, b, _ = model.generate_token(b)
            return (time.perf_counter_ns() - t0) / steps / 1e9
        finally:
            tgi.uninstall()

    rows = []
    for size in (1, 16, 64):
        timed_steps(size, False), timed_steps(size, True)  # warm-up
        samples = {False: [], True: []}
        for k in range(repeats):
            for on in ((False, True) if k % 2 == 0 else (True, False)):
                samples[on].append(timed_steps(size, on))
        stock_ms, wrapped_ms = (statistics.median(samples[on]) * 1e3 for on in (False, True))
        rows.append((size, f"{stock_ms:.2f}", f"{wrapped_ms:.2f}", f"{wrapped_ms / stock_ms:.3f}x"))
    print(f"\ngenerate_token per decode step (CPU, OPT over Qwen3, {steps} steps, median of {repeats}):")
    print(table(rows, ("batch", "stock ms", "wrapped ms", "wrapped/stock")))


if __name__ == "__main__":
    raise SystemExit(main())
