"""A finished chat request is freed when vLLM drops it: the ``detok_*`` parsers make no
reference cycle, in any family, streamed or not.

A cycle among a request's objects (its parser, its ``ChatStream`` and the core's state, the
request it read) keeps all of them alive until a pass of the garbage collector, which then
walks them in whichever request it lands on; stock vLLM's parsers make none. Each family's
CanIToolCall fixtures with a local tokenizer are replayed as vLLM's server drives them
(``tests/support/conformance_replay.py``: the non-streamed parse and every default
chunking), with the collector off; what it then finds unreachable is the cycles.

Real parts: CanIToolCall's corpus, the zoo's real tokenizers, vLLM 0.33's chat layer and
``OutputProcessor``.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm.parser.abstract_parser", reason="vLLM 0.32+ is not installed")

import conformance as C  # noqa: E402

#: One family per tool format the ``detok_*`` names cover here (each with its own stream
#: and body reader; gpt-oss's harmony reader is its own class).
FAMILIES = ("deepseek", "gemma4", "gpt-oss", "llama", "mistral", "qwen3-hermes", "qwen3-xml")


@pytest.fixture(autouse=True)
def _quiet_and_collector_restored() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in ("vllm", "vllm.detok_plugin")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    enabled = gc.isenabled()
    yield
    gc.set_debug(0)
    gc.garbage.clear()
    if enabled:
        gc.enable()
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)


def _cycles(fixtures: list[object], config: str) -> list[object]:
    """The objects the replays of ``fixtures`` under ``config`` left in reference cycles."""
    for f in fixtures:  # first replays: imports, tables and caches, which live on anyway
        C.replays(f, C.CONFIGS[config])
    gc.collect()
    gc.freeze()  # what lives now is out of the collector's passes: they walk the replays' objects only
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for f in fixtures:
            C.replays(f, C.CONFIGS[config])
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.unfreeze()
        gc.enable()


def _ours(found: list[object]) -> list[str]:
    """The types of the plugin's objects among ``found``, and of the request's own."""
    names = []
    for obj in found:
        cls = type(obj)
        if cls.__module__.startswith("detok_plugin") or cls.__name__ in ("ChatCompletionRequest", "StreamState"):
            names.append(f"{cls.__module__}.{cls.__qualname__}")
    return sorted(set(names))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_finished_request_leaves_no_reference_cycle(family: str) -> None:
    fixtures = [f for f in C.fixtures([family]) if C.local_tokenizer(f).name is not None][:2]
    if not fixtures:
        pytest.skip(f"no local tokenizer for {family}")
    detok = _cycles(fixtures, "detok")
    assert _ours(detok) == [], f"{family}: objects a finished request left in reference cycles"
    # Whatever else a replay leaves (vLLM's own, the harness's), no more than stock leaves.
    assert len(detok) <= len(_cycles(fixtures, "stock"))
