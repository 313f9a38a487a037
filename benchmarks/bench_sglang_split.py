"""Where the plugin's per-token time goes in SGLang's scheduler stop check: the seam's floor,
the shim's own work, and the core's ``ServingStream.watch`` check, in one run.

``bench_sglang.py`` sets the plugin against stock; this script splits the plugin's steady
per-token time (the steps between each request's first and last) into three parts, on the
same harness (its ``requests``, ids and clock):

* ``floor``: SGLang's two calls (``Req._check_str_based_finish(1)``,
  ``Req.check_match_stop_str_prefix()``) landing on callables bound on each request that do
  nothing: what any per-request seam costs at least;
* ``shim``: the plugin registered, with the check ``ServingStream.watch`` makes answering
  "quiet" (False) at once, without taking the ids (SGLang's call of the request's bound
  check, the prefix check): the plugin less the core;
* ``plugin``: the plugin as it ships;
* ``lookup``: the least a check that looks at each new id can do, bound on each request
  like the floor: one dictionary lookup of its last output id (``rest.get(ids[-1]) is
  None``, in a dict of the ids it will be given), the prefix check the floor's. Every stop
  check must at least read the id and look it up, so this bounds any design from below;
* ``stock``: SGLang's own check, for the ratios.

So ``shim - floor`` is what the shim adds to a seam, ``plugin - shim`` what the core's
check costs (``watch``'s own step, and ``follow`` through the shim on every other step),
and ``lookup / stock`` how near the target any per-token check can come. Two stop sets:
``bench_sglang.STOPS`` (``"\\n\\nUser:"`` starts at every newline of the text, a genuine
partial match the stream holds), and the same less that one (no stop's first character
occurs in the text). Rounds alternate harness, floor, lookup, shim, plugin and stock
(``--repeats`` each, after a warm-up round each); each figure is the median round's CPU
nanoseconds per token, the harness's own loop taken out.

Run (SGLang lives in ``.venv-sglang``)::

    .venv-sglang/bin/python benchmarks/bench_sglang_split.py [--tokens 2048] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import bench_sglang as bench
from _common import built_qwen3, table

from detok_plugin import ServingStream

#: The stop sets timed: with a stop that starts at every newline, and without it.
STOP_SETS = {"with \\n\\nUser:": list(bench.STOPS), "without": [s for s in bench.STOPS if not s.startswith("\n")]}


def _quiet(
    self: ServingStream, ids: Sequence[int], otherwise: Callable[[int], Any], holding: Callable[[str], Any]
) -> Callable[[int], Any]:
    """``watch`` less the core: a check that answers every step "quiet", no id taken."""
    return _nothing_finished


def _nothing_finished(arg: Any, /) -> bool:
    return False


def run_shim(tok: Any, ids: list[list[int]], stops: bool, prompt: list[int]) -> tuple[tuple[int, int], list[Any]]:
    """The plugin's scheduler run with the core's check answering without work."""
    real = ServingStream.watch
    ServingStream.watch = _quiet  # type: ignore[method-assign]
    try:
        return bench.run_scheduler(tok, ids, stops, prompt)
    finally:
        ServingStream.watch = real  # type: ignore[method-assign]


def run_lookup(tok: Any, ids: list[list[int]], stops: bool, prompt: list[int]) -> tuple[tuple[int, int], list[Any]]:
    """One lookup of the last output id per step (``_bind_lookup``), the prefix check the floor's."""
    return bench.run_scheduler(tok, ids, stops, prompt, bind=_bind_lookup)


def _bind_lookup(req: Any, out: list[int]) -> None:
    output_ids = req.output_ids
    known: dict[int, str | None] = dict.fromkeys(out, "")

    def check(new_accepted_len: int = 1) -> bool:
        return known.get(output_ids[-1]) is None  # False: every id here is known

    req._check_str_based_finish = check
    req.check_match_stop_str_prefix = bench._nothing_held


def measure(runs: dict[str, Callable[..., Any]], args: tuple[Any, ...], per: int, repeats: int) -> dict[str, float]:
    """Median steady ns per token of each run, less the harness's, in alternating rounds."""
    rounds: dict[str, list[int]] = {name: [] for name in runs}
    for n in range(repeats + 1):
        for name, fn in runs.items():
            bench.shim.register() if name in ("shim", "plugin") else bench.shim.unregister()  # stock: unregistered
            (_, steady), _ = bench.timed(fn, *args)
            if n > 0:
                rounds[name].append(steady)
    bench.shim.unregister()
    harness = statistics.median(rounds["harness"])
    return {name: (statistics.median(rounds[name]) - harness) / per for name in runs if name != "harness"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    tok = built_qwen3()
    tok.additional_stop_token_ids = None  # what SGLang's get_tokenizer adds
    prompt = tok.encode("Write a few paragraphs, please.", add_special_tokens=False)
    runs = {
        "harness": bench.run_scheduler_harness, "floor": bench.run_scheduler_floor, "lookup": run_lookup,
        "shim": run_shim, "plugin": bench.run_scheduler, "stock": bench.run_scheduler,
    }
    rows = []
    for batch in (1, 32):
        ids = bench.streams(tok, batch, args.tokens)
        for label, stops in STOP_SETS.items():
            bench.STOPS[:] = stops  # what bench.requests gives each request
            got = measure(runs, (tok, ids, True, prompt), batch * (args.tokens - 2), args.repeats)
            floor, lookup, shim, plugin, stock = (got[k] for k in ("floor", "lookup", "shim", "plugin", "stock"))
            rows.append([
                batch, label, f"{floor:,.0f}", f"{lookup:,.0f}", f"{shim:,.0f}", f"{plugin:,.0f}", f"{stock:,.0f}",
                f"{shim - floor:,.0f}", f"{plugin - shim:,.0f}", f"{(plugin - shim) / max(plugin - floor, 1):.0%}",
                f"{floor / stock:.3f}x", f"{lookup / stock:.3f}x", f"{plugin / stock:.3f}x",
            ])
        bench.STOPS[:] = STOP_SETS["with \\n\\nUser:"]
    print(f"SGLang 0.5.23 scheduler stop check, Qwen3 tokenizer, {args.tokens} ids per request, median of "
          f"{args.repeats} rounds; steady CPU ns per token")
    print(table(rows, [
        "batch", "stops", "floor", "lookup", "shim", "plugin", "stock", "shim - floor", "core check",
        "core share above floor", "floor / stock", "lookup / stock", "plugin / stock",
    ]))


if __name__ == "__main__":
    main()
