"""SGLang 0.5.23 per token: its scheduler's stop check and its detokenizer step, stock
against the plugin, at batch 1 and 32, with and without stop strings, in one run.

What is timed, on the same replayed ids (Qwen3's real tokenizer, the paragraphs of
``_common.PARAGRAPHS`` in turn, ``--tokens`` ids per request: 2048 by default, so that
a run at batch 1 lasts milliseconds; at 256 ids the plugin's run lasted a few hundred
microseconds, and one interruption moved its figure by tens of percent):

* ``scheduler``: per request and step, what SGLang's scheduler calls on a streaming request
  after appending its id (the append timed too, alike for both): ``Req._check_str_based_finish(1)`` (through
  ``update_finish_state``, which does more, untimed here) and the output streamer's
  ``Req.check_match_stop_str_prefix()``; on real ``Req`` objects with real, normalized
  ``SamplingParams`` (four stop strings that never occur, or none);
* ``detokenizer``: per step, one ``DetokenizerManager._decode_batch_token_id_output`` of a
  batch carrying one id per request (the first step with up to 5 prompt ids of context, as
  SGLang sends it), on a real ``DetokenizerManager``. Each step's batch is unpickled
  just before it, outside the clock (the steps between the first and the last are timed
  ``CHUNK`` at a time, each chunk's batches unpickled just before the chunk), as SGLang's
  detokenizer receives it from the scheduler's socket: a step reads a batch just made, not
  one made before the run and gone cold in memory since (which cost every run alike about
  0.7-0.9 µs more per step at batch 1). Before, each batch was unpickled inside the clock
  and the harness's unpickling taken out: a difference of two figures several times the
  step's, whose noise could exceed the step itself.

``stock``: SGLang's own methods; ``plugin``: after ``register()`` (``DETOK_PLUGIN=1``), each
request's setup (its streams, built on its first call) inside the timed run; ``floor``: what
any per-request seam costs at least, in the same rounds: SGLang's two scheduler calls landing
on callables bound on each request that do nothing, and a detokenizer step that only looks
each row's stream up by rid and pushes its one id (no finish, no state, no safety net). The
rounds alternate harness, stock, plugin and floor (``--repeats`` each, after a warm-up round each); each
figure is the median round's nanoseconds of CPU time (``process_time_ns``: load on the
shared machine falls outside it) per token (per request and id), the ratio plugin
over stock; "whole" counts every step (each request's setup on its first step, its end on
its last), "steady" the steps between. The texts and finishes of both are checked equal in
the warm-up round.

Run (SGLang lives in ``.venv-sglang``, ``scripts/setup_sglang.sh``)::

    .venv-sglang/bin/python benchmarks/bench_sglang.py [--tokens 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import statistics
import time
import types
from array import array
from collections.abc import Callable
from typing import Any

from _common import PARAGRAPHS, built_qwen3, table, token_stream
from sglang_replay import detokenizer_manager

os.environ["DETOK_PLUGIN"] = "1"

from detok_plugin.integrations import sglang as shim  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

#: Stop strings that never occur in the replayed text: every token pays for the check.
STOPS = ["\n\nUser:", "<|endofturn|>", "###", "結束了"]


def streams(tok: Any, batch: int, tokens: int) -> list[list[int]]:
    languages = list(PARAGRAPHS)
    return [token_stream(tok, languages[i % len(languages)], tokens) for i in range(batch)]


def requests(tok: Any, ids: list[list[int]], stops: bool, prompt: list[int]) -> list[Any]:
    out = []
    for i in range(len(ids)):
        sp = SamplingParams(max_new_tokens=1 << 20, stop=list(STOPS) if stops else None)
        sp.normalize(tok)
        req = Req(f"r{i}", "", array("q", prompt), sp, stream=True, eos_token_ids={tok.eos_token_id}, vocab_size=len(tok))
        req.tokenizer = tok
        out.append(req)
    return out


def run_scheduler(
    tok: Any,
    ids: list[list[int]],
    stops: bool,
    prompt: list[int],
    checks: bool = True,
    bind: Callable[[Any, list[int]], None] | None = None,
) -> tuple[tuple[int, int], list[Any]]:
    """Nanoseconds for every request's checks over every step, and over the steps between
    the first (each request's setup) and the last; each request's finish. ``checks=False``:
    the harness alone (the loop and the appends, no check); ``bind(req, out)``: puts the
    request's own two callables on it (``out``: the ids it will be given), untimed."""
    reqs = requests(tok, ids, stops, prompt)
    for req, out in zip(reqs, ids) if bind is not None else ():
        bind(req, out)
    pairs = list(zip(reqs, ids))
    n = len(ids[0])
    marks = []
    t0 = time.process_time_ns()  # a clock read per phase: a read costs about what a check does
    for step in range(n):
        if step in (1, n - 1):
            marks.append(time.process_time_ns())
        for req, out in pairs:
            req.output_ids.append(out[step])
            if checks:
                req._check_str_based_finish(1)
                req.check_match_stop_str_prefix()
    total = time.process_time_ns() - t0
    return (total, marks[1] - marks[0]), [req.finished_reason for req in reqs]


def run_scheduler_harness(tok: Any, ids: list[list[int]], stops: bool, prompt: list[int]) -> tuple[tuple[int, int], list[Any]]:
    return run_scheduler(tok, ids, stops, prompt, checks=False)


def run_scheduler_floor(tok: Any, ids: list[list[int]], stops: bool, prompt: list[int]) -> tuple[tuple[int, int], list[Any]]:
    """The floor of any per-request seam: SGLang's two calls landing on the cheapest
    Python callables there are (bound on each request, doing nothing)."""
    return run_scheduler(tok, ids, stops, prompt, bind=_bind_nothing)


def _bind_nothing(req: Any, out: list[int]) -> None:
    req._check_str_based_finish = _nothing_finished
    req.check_match_stop_str_prefix = _nothing_held


def _nothing_finished(new_accepted_len: int = 1) -> bool:
    return False


def _nothing_held() -> bool:
    return False


def payloads(ids: list[list[int]], prompt: list[int]) -> list[Any]:
    context = prompt[-5:]
    steps = []
    for step in range(len(ids[0])):
        last = step == len(ids[0]) - 1
        rows = len(ids)
        steps.append(pickle.dumps(types.SimpleNamespace(
            rids=[f"r{i}" for i in range(rows)],
            decoded_texts=[""] * rows,
            decode_ids=[(context if step == 0 else []) + [out[step]] for out in ids],
            read_offsets=[len(context)] * rows,
            finished_reasons=[{"type": "length", "length": len(ids[0])} if last else None] * rows,
            no_stop_trim=[False] * rows,
            skip_special_tokens=[True] * rows,
            spaces_between_special_tokens=[True] * rows,
        )))
    return steps


#: Detokenizer steps timed together: their batches are unpickled just before them, untimed.
CHUNK = 32


def run_detokenizer(
    tok: Any, steps: list[Any], harness: bool = False, step: Any = None
) -> tuple[tuple[int, int], list[str]]:
    """Nanoseconds for every step's batch, and for the steps between the first (each
    request's setup) and the last (each request's end); each request's text. The first
    step and the last are timed alone, the steps between ``CHUNK`` at a time; each chunk's
    batches are unpickled just before it, outside the clock (as SGLang's detokenizer
    reads a batch it has just received). ``harness``: the same loop and clock reads, the
    call a no-op; ``step``: this function in place of SGLang's."""
    m = detokenizer_manager(tok)
    decode = _no_step if harness else step or m._decode_batch_token_id_output
    loads, clock = pickle.loads, time.process_time_ns
    last = len(steps) - 1
    chunks = [(0, 1), *[(a, min(a + CHUNK, last)) for a in range(1, last, CHUNK)], (last, last + 1)]
    whole = steady = 0
    deltas: list[list[str]] = []
    for a, b in chunks:
        batches = [loads(payload) for payload in steps[a:b]]
        t0 = clock()
        got = [decode(batch) for batch in batches]
        ns = clock() - t0
        whole += ns
        if 0 < a < last:
            steady += ns
        deltas += got
    return (whole, steady), ["".join(parts) for parts in zip(*deltas)]


def _no_step(recv_obj: Any) -> list[str]:
    return _EMPTY


_EMPTY: list[str] = []


def run_detokenizer_harness(tok: Any, steps: list[Any]) -> tuple[tuple[int, int], list[str]]:
    return run_detokenizer(tok, steps, harness=True)


def run_detokenizer_floor(tok: Any, steps: list[Any]) -> tuple[tuple[int, int], list[str]]:
    """The floor of any step over per-request streams: SGLang's one call per step, each
    row's stream looked up by rid and pushed its one id, nothing else (no finish, no
    state kept, no safety net); a batch of one row without a loop."""
    from detok_plugin import ServingStream

    pushes: dict[str, Any] = {}

    def step(recv_obj: Any) -> list[str]:
        if not pushes:
            for rid, ids, start in zip(recv_obj.rids, recv_obj.decode_ids, recv_obj.read_offsets):
                stream = ServingStream.from_tokenizer(tok, prompt_ids=ids[:start], skip_special_tokens=True, eos_token_ids=())
                pushes[rid] = stream.push_text
            return ["".join(map(pushes[rid], ids[start:])) for rid, ids, start in zip(
                recv_obj.rids, recv_obj.decode_ids, recv_obj.read_offsets)]
        if len(recv_obj.rids) == 1:  # one row: no loop (as the plugin's step)
            return [pushes[recv_obj.rids[0]](recv_obj.decode_ids[0][0])]
        out = []
        for rid, ids in zip(recv_obj.rids, recv_obj.decode_ids):
            out.append(pushes[rid](ids[0]))
        return out

    return run_detokenizer(tok, steps, step=step)


def timed(fn: Any, *args: Any) -> tuple[int, Any]:
    gc.collect()
    gc.disable()
    try:
        return fn(*args)  # type: ignore[no-any-return]
    finally:
        gc.enable()


def measure(
    label: str, runs: dict[str, Any], args: tuple[Any, ...], per: int, steady_per: int, repeats: int
) -> dict[str, tuple[float, float]]:
    """Median ns per token, whole and steady, of each run (``harness``: the same loop
    without the part timed, taken out of the others; ``stock``; ``plugin``, registered;
    ``floor``), in alternating rounds; stock's and the plugin's outputs checked equal."""
    rounds: dict[str, list[tuple[int, int]]] = {name: [] for name in runs}
    seen = {}
    for n in range(repeats + 1):
        for name, fn in runs.items():
            shim.register() if name == "plugin" else shim.unregister()
            ns, result = timed(fn, *args)
            if n == 0:
                seen[name] = result
            else:
                rounds[name].append(ns)
    shim.unregister()
    if seen["stock"] != seen["plugin"]:
        raise SystemExit(f"{label}: the plugin's output differs from stock's")

    def net(name: str, k: int, count: int) -> float:
        return (statistics.median(r[k] for r in rounds[name]) - statistics.median(r[k] for r in rounds["harness"])) / count

    return {name: (net(name, 0, per), net(name, 1, steady_per)) for name in runs if name != "harness"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tok = built_qwen3()
    tok.additional_stop_token_ids = None  # what SGLang's get_tokenizer adds
    prompt = tok.encode("Write a few paragraphs, please.", add_special_tokens=False)
    rows = []
    for batch in (1, 32):
        ids = streams(tok, batch, args.tokens)
        per, steady = batch * args.tokens, batch * (args.tokens - 2)
        scheduler = {"harness": run_scheduler_harness, "stock": run_scheduler, "plugin": run_scheduler, "floor": run_scheduler_floor}
        for stops in (False, True):
            got = measure("scheduler", scheduler, (tok, ids, stops, prompt), per, steady, args.repeats)
            rows.append(["scheduler stop check", batch, "4" if stops else "none", *_cells(got)])
        detokenizer = {
            "harness": run_detokenizer_harness, "stock": run_detokenizer, "plugin": run_detokenizer, "floor": run_detokenizer_floor,
        }
        got = measure("detokenizer", detokenizer, (tok, payloads(ids, prompt)), per, steady, args.repeats)
        rows.append(["detokenizer step", batch, "(scheduler's)", *_cells(got)])
    print(f"SGLang 0.5.23, Qwen3 tokenizer, {args.tokens} ids per request, median of {args.repeats} rounds; CPU ns per token")
    print("(whole: every step, each request's setup and end included; steady: the steps between;")
    print(" the harness's own loop, measured alone in the same rounds, taken out of both)")
    print("(floor, steady: SGLang's calls landing on callables that do nothing (scheduler), or a step that only")
    print(" looks each row's stream up and pushes its id (detokenizer): what any per-request seam costs at least)")
    print(table(rows, [
        "part", "batch", "stops", "stock", "plugin", "plugin / stock", "stock steady", "plugin steady", "steady ratio",
        "floor steady", "floor / stock",
    ]))


def _cells(got: dict[str, tuple[float, float]]) -> list[str]:
    (stock, stock_steady), (plugin, plugin_steady), (_, floor) = got["stock"], got["plugin"], got["floor"]
    return [
        f"{stock:,.0f}", f"{plugin:,.0f}", f"{plugin / stock:.3f}x",
        f"{stock_steady:,.0f}", f"{plugin_steady:,.0f}", f"{plugin_steady / stock_steady:.3f}x",
        f"{floor:,.0f}", f"{floor / stock_steady:.3f}x",
    ]


if __name__ == "__main__":
    main()
