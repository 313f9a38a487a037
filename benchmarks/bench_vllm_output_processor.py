"""vLLM's ``OutputProcessor.process_outputs`` per engine step: stock detokenizer vs detok-plugin.

Both run in this process on the same replayed engine outputs: ``concurrency`` requests, each
a real multilingual text (English, Chinese, Japanese, emoji) tokenized by the real tokenizer,
one token per request per step, DELTA outputs (what the OpenAI server streams). Three
workloads: no stop strings; four stop strings that never occur, the same for every request
(each stream runs to the end and every step pays for the stop check); and four of each
request's own (multi-tenant API traffic: no two requests share a stop set).

Two references bound what any detokenizer can reach here:

* the floor: vLLM's base ``IncrementalDetokenizer`` (no text at all), what
  ``process_outputs`` costs without any detokenizer;
* bare (:class:`Bare`): the least a Python object under vLLM's detokenizer contract can do and
  still return text: append the id and index a shared table of token texts. No UTF-8
  holding, no stop strings, text wrong wherever a character spans tokens. Not a
  detokenizer, a bound: what three Python calls per request and step, and one table
  lookup, cost inside ``process_outputs``.

``detok ns/req`` is each one's cost above the floor per request per step.

What the plugin learns as streams run (each stop automaton's scan memo) is dropped
(``detok_plugin.forget()``) before each row's first replay, which is also the warm-up:
``cold`` is that replay's plugin/stock. The other replays run on what the first learnt, as
a server's streams do once a few requests have passed.

Timing: the four processors (stock, plugin, bare, floor) are built untimed with the same requests,
each with its own copy of the replayed steps; then the heap is collected and frozen
(``gc.freeze``, as a server does after start-up; see ``one_replay``) and the four take each
engine step in turn, the order rotating every step, each ``process_outputs`` call timed with
``perf_counter_ns``. Load on the machine, the heap's size and the caches' state so fall on all
four alike. A replay's figure is the mean over its steps; the table shows the median over
``--repeats`` replays (the ratio is the median of the per-replay ratios), after a warm-up
replay. The plugin is switched on through its real entry point (``DETOK_PLUGIN=1`` and
``register()``) while its processor's requests are added, and off again with ``unregister()``.

Last, a request's setup (``setup_replay``): ``OutputProcessor.add_request`` per request, stock
against the plugin (the floor beside them), in CPU time, the modes taking turns; and the same
with the first engine step after it (each request's first text), since a setup may leave its
work to that step (vLLM's ``DecodeStream(ids=prompt)`` decodes the whole prompt there, and
the plugin opens its stream on the prompt there), at several prompt lengths
(``--setup-prompt-len``).

Run: ``.venv/bin/python benchmarks/bench_vllm_output_processor.py [--repeats 5] [--quick]``
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Sequence

from _common import PARAGRAPHS, table, token_stream, tokenizer_zoo
from detok_plugin.integrations import vllm as shim
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.tokenizers.hf import get_cached_tokenizer
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.detokenizer import IncrementalDetokenizer
from vllm.v1.engine.output_processor import OutputProcessor

import detok_plugin
from detok_plugin import build_table

STOPS = ["\n\nUser:", "</answer>", "<|endofturn|>", "Observation:"]
STOP_MODES = ("none", "shared", "own")
LABELS = {"none": "none", "shared": "4 stops, shared", "own": "4 stops, per request"}
TARGETS = {"none": 0.8, "shared": 0.58, "own": 0.58}  # plugin / stock


def stops_of(mode: str, r: int) -> list[str] | None:
    """Request ``r``'s stop strings: none; the same four for every request; or four of its
    own (multi-tenant API traffic: every request brings a set no other has)."""
    if mode == "none":
        return None
    return STOPS if mode == "shared" else [f"{s[:-1]}{r}{s[-1]}" for s in STOPS]


def workload(tok, concurrency: int, steps: int, prompt_len: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, output) ids per request: real text in four languages, at staggered offsets."""
    langs = sorted(PARAGRAPHS)
    streams = {lang: token_stream(tok, lang, steps * 4 + prompt_len) for lang in langs}
    work = []
    for r in range(concurrency):
        ids = streams[langs[r % len(langs)]]
        off = (r * 7) % (len(ids) - steps - prompt_len)
        work.append((ids[off : off + prompt_len], ids[off + prompt_len : off + prompt_len + steps]))
    return work


def requests(work, *, stops: str) -> list[EngineCoreRequest]:
    """One DELTA request per (prompt, output) of ``work``, as the OpenAI server streams."""
    steps = len(work[0][1])
    return [
        EngineCoreRequest(
            request_id=f"r{r}", external_req_id=f"r{r}", prompt_token_ids=list(prompt), mm_features=None,
            sampling_params=SamplingParams(
                max_tokens=steps, output_kind=RequestOutputKind.DELTA, stop=stops_of(stops, r)
            ),
            pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
        )
        for r, (prompt, _) in enumerate(work)
    ]


def build(tok, work, *, stops: str, mode: str, per_step: int = 1) -> tuple[OutputProcessor, list[list[EngineCoreOutput]]]:
    """One processor with every request added, and its own copy of the replayed steps,
    ``per_step`` ids per request each (``process_outputs`` may trim a step's ids in place,
    so no two processors share one)."""
    steps = len(work[0][1])
    with _switched(tok, mode):
        op = OutputProcessor(tok, log_stats=False)
        for request in requests(work, stops=stops):
            op.add_request(request, None)
    batches = [
        [
            EngineCoreOutput(
                request_id=f"r{r}",
                new_token_ids=out[k : k + per_step],
                finish_reason=FinishReason.LENGTH if k + per_step >= steps else None,
            )
            for r, (_, out) in enumerate(work)
        ]
        for k in range(0, steps, per_step)
    ]
    return op, batches


class Bare:
    """A bound, not a detokenizer (see the module docstring): vLLM's contract with the
    least work that still returns text per token."""

    __slots__ = ("token_ids", "_unsent", "_texts")

    def __init__(self, texts: Sequence[str | None]) -> None:
        self.token_ids: list[int] = []
        self._unsent = ""
        self._texts = texts

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids

    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        for tid in new_token_ids:
            self.token_ids.append(tid)
            self._unsent += self._texts[tid] or ""
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        text = self._unsent
        self._unsent = ""
        return text


MODES = ("stock", "plugin", "bare", "floor")


def one_replay(tok, work, *, stops: str, per_step: int = 1) -> dict[str, float]:
    """Mean ns per ``process_outputs`` call of each of ``MODES`` over one replay.

    The processors live side by side and take each engine step in turn (the order
    rotates every step), so load on the machine, the heap's size and the caches' state fall
    on all of them alike: a ratio compares two runs of the same step a few milliseconds apart.
    """
    built = {mode: build(tok, work, stops=stops, mode=mode, per_step=per_step) for mode in MODES}
    steps = len(built["stock"][1])
    # Collect, then freeze what exists: setup objects (tokenizer, requests, replayed outputs)
    # move to the permanent generation, as a server freezes its heap after start-up. Without
    # it, one full collection (its cost set by the whole heap) lands inside one side's step
    # and decides the ratio by itself. Collections of what the timed steps allocate still run.
    gc.collect()
    gc.freeze()
    totals = dict.fromkeys(MODES, 0)
    clock = time.perf_counter_ns
    try:
        for k in range(steps):
            shift = k % len(MODES)
            for mode in MODES[shift:] + MODES[:shift]:
                op, batches = built[mode]
                t0 = clock()
                op.process_outputs(batches[k])
                totals[mode] += clock() - t0
    finally:
        gc.unfreeze()
    for op, _ in built.values():
        assert not op.has_unfinished_requests()
    return {mode: total / steps for mode, total in totals.items()}


def isolated_replay(tok, work, *, stops: str) -> dict[str, float]:
    """Mean ns per request-step of the detokenizers alone: ``update`` and
    ``get_next_output_text`` as ``process_outputs`` calls them, with nothing around them.
    All kinds are built from the same requests and take each step in turn."""
    steps = len(work[0][1])
    dets = {}
    for mode in MODES:
        with _switched(tok, mode):
            dets[mode] = [IncrementalDetokenizer.from_new_request(tok, req) for req in requests(work, stops=stops)]
    columns = [[[out[k]] for _, out in work] for k in range(steps)]
    gc.collect()
    gc.freeze()
    totals = dict.fromkeys(MODES, 0)
    clock = time.perf_counter_ns
    try:
        for k in range(steps):
            shift = k % len(MODES)
            last = k == steps - 1
            for mode in MODES[shift:] + MODES[:shift]:
                t0 = clock()
                for det, ids in zip(dets[mode], columns[k]):
                    det.update(ids, False)
                    det.get_next_output_text(last, True)
                totals[mode] += clock() - t0
    finally:
        gc.unfreeze()
    return {mode: total / (steps * len(work)) for mode, total in totals.items()}


def setup_replay(tok, work, *, stops: str) -> tuple[dict[str, float], dict[str, float]]:
    """CPU µs per request of ``OutputProcessor.add_request`` (the request's detokenizer
    built from its prompt, and vLLM's own state around it) for each of ``MODES``, and of the
    first engine step that follows (``process_outputs`` with each request's first id: its
    first text), the requests and the step's outputs built untimed; the modes take turns,
    each adding every request of ``work``. The first step counts because a setup may leave
    work to it: vLLM's ``DecodeStream(ids=prompt)`` decodes the prompt at its first step."""
    spent, first = {}, {}
    for mode in MODES:
        reqs = requests(work, stops=stops)
        step = [EngineCoreOutput(request_id=f"r{r}", new_token_ids=[out[0]]) for r, (_, out) in enumerate(work)]
        with _switched(tok, mode):
            op = OutputProcessor(tok, log_stats=False)
            gc.collect()
            t0 = time.process_time_ns()
            for request in reqs:
                op.add_request(request, None)
            t1 = time.process_time_ns()
            op.process_outputs(step)
            t2 = time.process_time_ns()
            spent[mode] = (t1 - t0) / len(reqs) / 1e3
            first[mode] = (t2 - t1) / len(reqs) / 1e3
    return spent, first


class _switched:
    """While one run's requests are added: the plugin on (through its entry point), vLLM
    stock, or one of the two references (see the module docstring)."""

    def __init__(self, tok, mode: str) -> None:
        self.tok, self.mode = tok, mode

    def __enter__(self) -> None:
        cls = IncrementalDetokenizer
        self._stock = cls.__dict__["from_new_request"]
        if self.mode == "plugin":
            os.environ["DETOK_PLUGIN"] = "1"
            assert shim.register()
        elif self.mode == "bare":
            texts = build_table(self.tok)[0].quick_texts(False)
            cls.from_new_request = classmethod(lambda cls, tokenizer, request: Bare(texts))
        elif self.mode == "floor":
            cls.from_new_request = classmethod(lambda cls, tokenizer, request: IncrementalDetokenizer())

    def __exit__(self, *exc: object) -> None:
        shim.unregister()
        os.environ.pop("DETOK_PLUGIN", None)
        IncrementalDetokenizer.from_new_request = self._stock


def forget(tok) -> None:
    """Empty what the plugin learnt (its stop automata's scan memos), so the next replay
    starts cold."""
    detok_plugin.forget()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=256, help="output tokens per request")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--tokenizer", default="qwen3", choices=["qwen3", "mistral_v1"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--isolated-requests", type=int, default=256, help="live requests in the detokenizers-alone table")
    ap.add_argument("--setup-prompt-len", type=int, nargs="+", default=[16, 64, 1024],
                    help="prompt lengths of the setup table")
    ap.add_argument("--ids-per-step", type=int, default=1,
                    help="ids per request per engine step in the first table (speculative decoding: several)")
    ap.add_argument("--quick", action="store_true", help="2 repeats, 32 steps")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.steps = 2, 32
    tok = get_cached_tokenizer(tokenizer_zoo.load(args.tokenizer))
    rows = []
    for stops in STOP_MODES:
        for conc in args.concurrency:
            work = workload(tok, conc, args.steps, args.prompt_len)
            forget(tok)
            cold = one_replay(tok, work, stops=stops, per_step=args.ids_per_step)  # warm-up, and the plugin's cold figure
            got = [one_replay(tok, work, stops=stops, per_step=args.ids_per_step) for _ in range(args.repeats)]
            med = {m: statistics.median(g[m] for g in got) for m in MODES}
            # Each ratio is the median of the per-replay ratios (a replay's modes ran together).
            ratio = {m: statistics.median(g[m] / g["stock"] for g in got) for m in MODES}
            rows.append(
                (
                    LABELS[stops],
                    conc,
                    *(f"{med[m] / 1e3:.1f}" for m in MODES),
                    f"{(med['stock'] - med['floor']) / conc:.0f}",
                    f"{(med['plugin'] - med['floor']) / conc:.0f}",
                    f"{ratio['plugin']:.2f}x",
                    f"{cold['plugin'] / cold['stock']:.2f}x",
                    f"{ratio['bare']:.2f}x",
                    f"{ratio['floor']:.2f}x",
                    f"<= {TARGETS[stops]}x",
                    "ok" if ratio["plugin"] <= TARGETS[stops] else "MISSED",
                )
            )
            print(f"  done: stops={stops} concurrency={conc} ratio={ratio['plugin']:.2f}", flush=True)
    iso_rows = []
    for stops in STOP_MODES:
        work = workload(tok, args.isolated_requests, args.steps, args.prompt_len)
        forget(tok)
        isolated_replay(tok, work, stops=stops)  # warm-up
        got = [isolated_replay(tok, work, stops=stops) for _ in range(args.repeats)]
        above = {m: statistics.median(g[m] - g["floor"] for g in got) for m in MODES}
        iso_rows.append(
            (
                LABELS[stops],
                args.isolated_requests,
                f"{above['stock']:.0f}",
                f"{above['plugin']:.0f}",
                f"{above['bare']:.0f}",
                f"{statistics.median((g['plugin'] - g['floor']) / (g['stock'] - g['floor']) for g in got):.2f}x",
            )
        )
    print()
    print(
        f"OutputProcessor.process_outputs per engine step, {args.tokenizer}, DELTA, {args.ids_per_step} token(s)/request/step, "
        f"{args.steps} output ids per request, prompt {args.prompt_len} ids, median of {args.repeats} replays ({len(MODES)} processors, each step in turn)"
    )
    print(
        table(
            rows,
            ["stops", "requests", "stock µs/step", "plugin µs/step", "bare µs/step", "floor µs/step",
             "stock detok ns/req", "plugin detok ns/req", "plugin/stock", "cold", "bare/stock", "floor/stock", "target", ""],
        )
    )
    print()
    print(
        "The detokenizers alone (update + get_next_output_text, no process_outputs around them), "
        "ns per request-step above vLLM's base detokenizer"
    )
    print(table(iso_rows, ["stops", "requests", "stock ns", "plugin ns", "bare ns", "plugin/stock"]))
    setup_rows = []
    for prompt_len in args.setup_prompt_len:
        for stops in STOP_MODES:
            work = workload(tok, args.isolated_requests, args.steps, prompt_len)
            forget(tok)
            setup_replay(tok, work, stops=stops)  # warm-up (the stop automata are built once, then cached)
            got = [setup_replay(tok, work, stops=stops) for _ in range(max(args.repeats, 5))]
            add = {m: statistics.median(g[0][m] for g in got) for m in MODES}
            both = {m: statistics.median(g[0][m] + g[1][m] for g in got) for m in MODES}
            setup_rows.append((
                prompt_len, LABELS[stops], f"{add['stock']:.1f}", f"{add['plugin']:.1f}", f"{add['floor']:.1f}",
                f"{statistics.median(g[0]['plugin'] / g[0]['stock'] for g in got):.2f}x",
                f"{both['stock']:.1f}", f"{both['plugin']:.1f}", f"{both['floor']:.1f}",
                f"{statistics.median((g[0]['plugin'] + g[1]['plugin']) / (g[0]['stock'] + g[1]['stock']) for g in got):.2f}x",
            ))
    print()
    print(f"A request's setup, {args.isolated_requests} requests: OutputProcessor.add_request (its detokenizer from the "
          "prompt), and with the first engine step (its first text), CPU µs per request, median of interleaved rounds")
    print(table(setup_rows, ["prompt ids", "stops", "add: stock", "plugin", "floor", "plugin/stock",
                             "add + 1st step: stock", "plugin", "floor", "plugin/stock"]))

if __name__ == "__main__":
    main()
