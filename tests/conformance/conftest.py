"""Deselects the stream tests of chunkings this run does not replay (``CHUNKINGS`` of
``test_canitoolcall.py``, from ``DETOK_CONFORMANCE_CHUNKINGS``): CanIToolCall's plugin
parametrizes them over all eight default chunkings."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        strategy = callspec.params.get("canitoolcall_strategy") if callspec is not None else None
        chunkings = getattr(getattr(item, "module", None), "CHUNKINGS", None)
        if strategy is not None and chunkings is not None and strategy.id not in chunkings:
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
