"""Switching the drop-ins on: :func:`install`, :func:`uninstall`, and ``DETOK_PLUGIN=1``.

:func:`install` rebinds transformers' streamer names (``_framework.STREAMER_NAMES``, where
the installed transformers has them) in ``transformers``, ``transformers.generation`` and
``transformers.generation.streamers``, through the shared patch registry; :func:`uninstall`
puts the originals back. ``DETOK_PLUGIN=1`` does the same at interpreter start through the
``.pth`` line (``common.startup``), when the streamers module is first imported.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

from ..common.patches import PATCHES
from ..common.startup import ImportHook, arm_at_start
from . import _framework
from .iterators import AsyncDetokIteratorStreamer, DetokDiffusionStreamer, DetokIteratorStreamer
from .streamers import DetokStreamer

__all__ = ["install", "installed", "startup", "uninstall"]

#: transformers' streamer names and the drop-in each is rebound to.
OURS: dict[str, type] = {
    "TextStreamer": DetokStreamer,
    "TextIteratorStreamer": DetokIteratorStreamer,
    "AsyncTextIteratorStreamer": AsyncDetokIteratorStreamer,
    "TextDiffusionStreamer": DetokDiffusionStreamer,
}


def _patch(streamers: ModuleType) -> None:
    with PATCHES.lock:
        if installed():
            return
        problems = _framework.contract_problems(streamers)
        if problems:
            warnings.warn(f"detok-plugin: transformers' streamers NOT switched: {'; '.join(problems)}", stacklevel=3)
            return
        # Rebinding the defining module covers every later lookup: transformers and
        # transformers.generation are lazy modules that resolve names from it on first
        # access. Names they already resolved and cached are rebound as well.
        for module in _framework.namespaces():
            for name, cls in OURS.items():
                if hasattr(streamers, name):
                    PATCHES.install(module, name, cls)


#: Waits, costing nothing, for transformers' streamers to be imported (DETOK_PLUGIN=1).
_HOOK = ImportHook(_framework.STREAMERS, _patch)


def install() -> None:
    """Make transformers' own streamer names build ours, for every later lookup.

    After ``install()``, ``transformers.TextStreamer(...)``, ``from transformers import
    TextIteratorStreamer`` and ``from transformers.generation.streamers import ...`` give
    :class:`DetokStreamer`, :class:`DetokIteratorStreamer`,
    :class:`AsyncDetokIteratorStreamer` and :class:`DetokDiffusionStreamer`. A name bound before ``install()`` (a module that
    ran ``from transformers import TextStreamer`` earlier) keeps the stock class: call it
    early, or use ``DETOK_PLUGIN=1``. Idempotent; :func:`uninstall` undoes it.
    """
    _framework.require()
    _patch(importlib.import_module(_framework.STREAMERS))


def uninstall() -> bool:
    """Restore transformers' own streamers (and disarm the ``DETOK_PLUGIN`` hook).

    Returns whether anything was undone. Classes defined by subclassing ours while it was
    installed keep ours as their base.
    """
    with PATCHES.lock:
        undone = _HOOK.disarm()
        for module in _framework.namespaces():
            for name in OURS:
                undone = PATCHES.uninstall(module, name) or undone
        return undone


def installed() -> bool:
    """Whether transformers' streamer names currently resolve to ours."""
    with PATCHES.lock:
        return any(PATCHES.is_ours(m, "TextStreamer") for m in _framework.namespaces())


def startup() -> None:
    """Called by the ``.pth`` line at interpreter start: honour ``DETOK_PLUGIN``
    (``common.startup.arm_at_start``): on, patch when the module it waits for is imported."""
    arm_at_start(_HOOK, "the transformers streamer patch")
