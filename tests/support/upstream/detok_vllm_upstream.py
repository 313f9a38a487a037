"""A pytest plugin for vLLM's own tests: runs them against stock vLLM or against detok-plugin.

Loaded with ``-p detok_vllm_upstream`` by ``tests/support/vllm_upstream_suite.py``, in a pytest
process of its own whose working directory holds vLLM's extracted ``tests`` package. The
mode comes from ``DETOK_UPSTREAM_MODE``:

* ``stock``: the plugin is not registered; vLLM's own detokenizers run.
* ``plugin``: :func:`detok_plugin.integrations.vllm.register` replaces vLLM's factory, as
  ``DETOK_PLUGIN=1`` does in a server, and every detokenizer vLLM's tests construct
  directly (``FastIncrementalDetokenizer(tokenizer, request)``, the slow one likewise) is
  built through that factory instead, so the tests see ours wherever vLLM would.

Either way the session fails at start-up if the mode is not in effect, so a run can never
report stock results as the plugin's.

Where ``DETOK_UPSTREAM_REPORT`` names a file, the session writes to it, as JSON, each test's
outcome (``passed``, ``failed``, ``error``, ``skipped``), its parameters, and how many of
the plugin's detokenizers it built (counted in both modes, so a stock run shows 0 and a
plugin run shows which tests really went through the plugin).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

_ROUTED = ("FastIncrementalDetokenizer", "SlowIncrementalDetokenizer")

_built = [0]  # the plugin's detokenizers constructed so far in this process
_report: dict[str, dict[str, Any]] = {}


def _mode() -> str:
    mode = os.environ.get("DETOK_UPSTREAM_MODE", "")
    if mode not in ("stock", "plugin"):
        raise pytest.UsageError(f"DETOK_UPSTREAM_MODE must be 'stock' or 'plugin', not {mode!r}")
    return mode


def pytest_configure(config: pytest.Config) -> None:
    from detok_plugin.integrations import vllm as shim

    mode = _mode()
    _count_the_plugins_detokenizers(shim.VllmDetokenizer)
    if mode == "plugin":
        os.environ["DETOK_PLUGIN"] = "1"
        if not shim.register():
            raise pytest.UsageError("detok-plugin did not register with this vLLM")
    elif shim.is_registered():
        raise pytest.UsageError("stock mode, yet detok-plugin is registered")


def _through_the_factory(tokenizer: Any, request: Any) -> Any:
    """What a direct construction becomes in plugin mode: vLLM's factory, i.e. ours."""
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    return IncrementalDetokenizer.from_new_request(tokenizer, request)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if _mode() != "plugin":
        return
    from vllm.v1.engine import detokenizer

    for module in {item.module for item in items if isinstance(item, pytest.Function)}:
        for name in _ROUTED:
            if getattr(module, name, None) is getattr(detokenizer, name):
                setattr(module, name, _through_the_factory)


def _count_the_plugins_detokenizers(cls: type) -> None:
    init = cls.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _built[0] += 1
        init(self, *args, **kwargs)

    cls.__init__ = counting_init  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    before = _built[0]
    try:
        return (yield)
    finally:
        entry = _report.setdefault(item.nodeid, {"outcome": "passed"})
        entry["ours"] = _built[0] - before
        callspec = getattr(item, "callspec", None)
        entry["params"] = {k: _plain(v) for k, v in (callspec.params.items() if callspec else ())}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, bool, int, float, type(None))) else repr(value)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _report.setdefault(report.nodeid, {"outcome": "passed"})
    if report.skipped:
        entry["outcome"] = "skipped"
    elif report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("DETOK_UPSTREAM_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(_report, out, indent=0, sort_keys=True)
