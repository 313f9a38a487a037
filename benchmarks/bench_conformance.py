"""CanIToolCall's suite through vLLM 0.33's chat path: the table, the non-passes, the time.

Every fixture of CanIToolCall 0.1.1 (its bundled corpus) is replayed as vLLM's OpenAI
server drives a chat request (``tests/support/conformance_replay.py``: ids through the real
``OutputProcessor``, then ``ChatStreamProcessor.step`` per step, or ``parse`` without
streaming), without streaming and under each default chunking, in three configurations
(``tests/support/conformance.py``):

* ``detok``: ``DETOK_PLUGIN=1`` with the ``detok_*`` parsers;
* ``stock``: vLLM 0.33's own detokenizer and parsers (``DETOK_PLUGIN=0``);
* ``pairing``: the plugin's detokenizer with vLLM's own parsers.

CanIToolCall's runner code judges each (``pass``, ``soft_pass``, ``fail``, ``error``,
``unsupported``); a fixture whose tokenizer cannot be built here is ``no_tokenizer``.
It prints

(a) the table per family (and per reference model with ``--models``), per configuration;
(b) every non-pass with its failing checks (and where pairing's status differs from stock's);
(c) the wall time per fixture (its non-streamed and streamed replays; not the switch of the
    plugin around them nor the parser class's lookup, which a server makes once at start-up), stock beside detok,
    the median over each family's fixtures, and the median of the per-fixture ratios
    detok/stock. The configurations take turns on each fixture, the order rotating from
    fixture to fixture, after an untimed warm-up of each configuration on each tokenizer
    and vLLM's own ``freeze_gc_heap`` (what its server calls once started), so the load of
    a shared machine falls on all alike. Each turn is one untimed pass of the fixture's
    replays, then ``--repeats N`` timed passes (default 1), the median counting: each timed
    request follows requests of its own configuration, as in a server.

Run: ``.venv/bin/python benchmarks/bench_conformance.py [--family qwen3-hermes] [--models] [--repeats 3] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import _common  # noqa: F401  (puts tests/support on sys.path)
import conformance as C
from vllm.utils.gc_utils import freeze_gc_heap

CONFIG_NAMES = ("detok", "stock", "pairing")


def _quiet() -> None:
    """Parsers log each malformed body with a traceback (vLLM's) or a line (the plugin's)."""
    for name in ("vllm", "vllm.detok_plugin", "detok_plugin"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _warm_up(fixtures: Sequence[Any]) -> None:
    """One untimed replay per configuration per (family, tokenizer): imports, tables, caches."""
    seen: set[tuple[str, str | None]] = set()
    for f in fixtures:
        key = (f.family, C.local_tokenizer(f).name)
        if key in seen or key[1] is None:
            continue
        seen.add(key)
        for name in CONFIG_NAMES:
            C.run_case(f, name, cached=False)


def run(fixtures: Sequence[Any], repeats: int = 1) -> dict[str, list[C.FixtureResult]]:
    """Every fixture under every configuration, the configurations taking turns on each
    fixture (the order rotating from fixture to fixture, so the load of a shared machine
    falls on all alike); each turn one untimed pass of the fixture's replays, then
    ``repeats`` timed passes, the median counting: each timed request follows requests of
    its own configuration, as in a server (``conformance.replays``)."""
    _warm_up(fixtures)
    # What vLLM's API server does once it has started (``freeze_gc_heap``): the heap built
    # so far (here every tokenizer and table the run needs) is left out of the collector's
    # passes, so that a full collection does not land on whichever replay runs then.
    freeze_gc_heap()
    results: dict[str, list[C.FixtureResult]] = {name: [] for name in CONFIG_NAMES}
    for turn, f in enumerate(fixtures):
        for name in CONFIG_NAMES[turn % 3 :] + CONFIG_NAMES[: turn % 3]:
            results[name].append(C.run_case(f, name, cached=False, timings=repeats))
    return results


def _key(r: C.FixtureResult, models: bool) -> str:
    return f"{r.family} / {r.model}" if models else r.family


def print_table(results: dict[str, list[C.FixtureResult]], models: bool) -> None:
    cols = ("pass", "soft_pass", "fail", "error", "unsupported", C.NO_TOKENIZER)
    for name, rows in results.items():
        print(f"\n## {name}: {C.CONFIGS[name]}")
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for r in rows:
            counts[_key(r, models)][r.status] += 1
        width = max([len(k) for k in counts] + [6])
        print(f"{'family':<{width}}  " + "  ".join(f"{c:>12}" for c in cols) + f"  {'total':>6}")
        total: Counter[str] = Counter()
        for key in sorted(counts):
            total.update(counts[key])
            print(f"{key:<{width}}  " + "  ".join(f"{counts[key][c]:>12}" for c in cols) + f"  {sum(counts[key].values()):>6}")
        print(f"{'all':<{width}}  " + "  ".join(f"{total[c]:>12}" for c in cols) + f"  {sum(total.values()):>6}")


def print_non_passes(results: dict[str, list[C.FixtureResult]]) -> None:
    for name, rows in results.items():
        bad = [r for r in rows if r.status in ("soft_pass", "fail", "error")]
        print(f"\n## {name}: {len(bad)} non-passes (of {sum(r.status not in ('unsupported', C.NO_TOKENIZER) for r in rows)} run)")
        for r in bad:
            print(f"- {r.fixture_id}: {r.status}: {r.reason}")
    stock = {r.fixture_id: r.status for r in results["stock"]}
    differ = [r for r in results["pairing"] if stock.get(r.fixture_id) != r.status]
    print(f"\n## pairing vs stock: {len(differ)} fixtures whose status differs")
    for r in differ:
        print(f"- {r.fixture_id}: stock {stock.get(r.fixture_id)}, pairing {r.status}: {r.reason}")
    unsupported = Counter(r.reason for r in results["detok"] if r.status == "unsupported")
    no_tok = Counter(r.reason for r in results["detok"] if r.status == C.NO_TOKENIZER)
    print("\n## detok unsupported, by reason")
    for reason, n in unsupported.most_common():
        print(f"- {n}: {reason}")
    print("\n## no tokenizer, by reason")
    for reason, n in no_tok.most_common():
        print(f"- {n}: {reason}")


def print_times(results: dict[str, list[C.FixtureResult]]) -> None:
    """Median wall per fixture, stock and detok, where both ran; median per-fixture ratio."""
    stock = {r.fixture_id: r for r in results["stock"] if r.case is not None}
    per_family: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in results["detok"]:
        s = stock.get(r.fixture_id)
        if r.case is not None and s is not None:
            per_family[r.family].append((s.wall_s, r.wall_s))
    print("\n## wall per fixture (its non-streamed and 8 streamed replays), ms, median over fixtures")
    print(f"{'family':<14} {'fixtures':>8} {'stock':>9} {'detok':>9} {'detok/stock':>12}")
    everything: list[tuple[float, float]] = []
    for fam in sorted(per_family):
        pairs = per_family[fam]
        everything += pairs
        _time_row(fam, pairs)
    if everything:
        _time_row("all", everything)


def _time_row(label: str, pairs: list[tuple[float, float]]) -> None:
    s = statistics.median(p[0] for p in pairs) * 1e3
    d = statistics.median(p[1] for p in pairs) * 1e3
    ratio = statistics.median(p[1] / p[0] for p in pairs)
    print(f"{label:<14} {len(pairs):>8} {s:>9.2f} {d:>9.2f} {ratio:>11.2f}x")


def as_json(results: dict[str, list[C.FixtureResult]]) -> dict[str, Any]:
    return {
        name: [
            {k: getattr(r, k) for k in ("fixture_id", "family", "model", "status", "reason", "wall_s")} for r in rows
        ]
        for name, rows in results.items()
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", action="append", default=[], help="only this family (repeatable)")
    ap.add_argument("--models", action="store_true", help="one table row per reference model")
    ap.add_argument("--json", help="write every fixture's result here")
    ap.add_argument("--repeats", type=int, default=1, help="time each fixture's replays this many times (the median counts)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    _quiet()
    t0 = time.perf_counter()
    fixtures = C.fixtures(args.family)
    results = run(fixtures, args.repeats)
    print(f"# CanIToolCall 0.1.1, {len(fixtures)} fixtures, vLLM 0.33.0 chat path ({time.perf_counter() - t0:.0f} s; "
          f"{args.repeats} timing(s) each)")
    print_table(results, args.models)
    print_non_passes(results)
    print_times(results)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(as_json(results), fh, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
