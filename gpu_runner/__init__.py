"""The reference runner: generate with a real model, stream every sequence through the core.

:class:`Runner` is the ground truth the integrations are compared with: a plain batched
generation loop over a transformers causal LM with a KV cache, greedy or seeded sampling,
on CUDA when present and CPU otherwise, that pushes every row's token into its own
:class:`detok_plugin.DetokenizerState` at every step. ``detok-plugin chat`` and
``detok-plugin verify`` (``cli.py``) drive it; ``docs/runner.md`` explains the choices.

The package's modules, one concept each: ``settings.py`` (:class:`GenerationSettings`),
``results.py`` (what ``generate`` returns), ``runner.py`` (the loop), ``clocks.py`` and
``memory.py`` (its timers and its memory check), ``model.py`` and ``fetch.py`` (finding and
loading a model), ``verify.py``, and the server's ``openai_api.py``, ``scheduler.py``,
``serve.py`` and ``access_log.py``.

Names that need torch (:class:`Runner`, :func:`load_model`, :func:`tiny_random_model`) are
imported lazily, so the settings, results, errors and ``fetch`` (stdlib only) stay
importable without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    BatchTooLargeError,
    DeviceError,
    ModelFetchError,
    ModelLoadError,
    ModelNotFoundError,
    PromptError,
    PromptTypeError,
    RunnerError,
)
from .fetch import default_cache_dir, fetch_default_model
from .results import RunResult, RunStats, SequenceResult
from .settings import GenerationSettings

if TYPE_CHECKING:
    from .model import load_model, tiny_random_model
    from .runner import Runner

__all__ = [
    "BatchTooLargeError",
    "DeviceError",
    "GenerationSettings",
    "ModelFetchError",
    "ModelLoadError",
    "ModelNotFoundError",
    "PromptError",
    "PromptTypeError",
    "RunResult",
    "RunStats",
    "Runner",
    "RunnerError",
    "SequenceResult",
    "default_cache_dir",
    "fetch_default_model",
    "load_model",
    "tiny_random_model",
]

_LAZY = {
    "Runner": "runner",
    "load_model": "model",
    "tiny_random_model": "model",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
