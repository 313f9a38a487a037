"""Switching the drop-ins on: :func:`install`, :func:`uninstall`, and ``DETOK_PLUGIN=1``.

:func:`install` rebinds transformers' streamer names (``_framework.STREAMER_NAMES``, where
the installed transformers has them) in ``transformers``, ``transformers.generation`` and
``transformers.generation.streamers``, through the shared patch registry; :func:`uninstall`
puts the originals back. ``DETOK_PLUGIN=1`` does the same at interpreter start through the
``.pth`` line (``common.startup``), when the streamers module is first imported, and says so
in one line (``detok-plugin: on (DETOK_PLUGIN=1): transformers' TextStreamer, ... build
detok-plugin's``); ``DETOK_PLUGIN=0`` or a mistaken value says ``off`` instead, at the same
moment. A process that never imports transformers' streamers hears nothing.
"""

from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType

from ..common.patches import PATCHES
from ..common.startup import ImportHook, arm_at_start, say
from ..common.switch import Switch
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


#: One line where the application shows it (its logging if configured, else stderr).
_tell = functools.partial(say, "detok_plugin.integrations.transformers")

#: What the lines say transformers keeps when the drop-ins are not in.
_STOCK = "transformers' streamers stay stock"


def _patch(streamers: ModuleType) -> list[str]:
    """Rebind the names; returns why not ([] when they are ours)."""
    with PATCHES.lock:
        if installed():
            return []
        problems = _framework.contract_problems(streamers)
        if problems:
            return problems
        # Rebinding the defining module covers every later lookup: transformers and
        # transformers.generation are lazy modules that resolve names from it on first
        # access. Names they already resolved and cached are rebound as well.
        for module in _framework.namespaces():
            for name, cls in OURS.items():
                if hasattr(streamers, name):
                    PATCHES.install(module, name, cls)
        return []


def _switch_on(streamers: ModuleType) -> None:
    """The hook's work (``DETOK_PLUGIN`` on), right after transformers' streamers are first
    imported: patch, and say in one line what happened. Never raises into that import."""
    source = Switch.from_env().source
    try:
        problems = _patch(streamers)
    except Exception as exc:
        problems = [repr(exc)]
    if problems:
        _tell(logging.WARNING, f"detok-plugin: NOT switched on ({source}): {'; '.join(problems)}; {_STOCK}")
        return
    names = ", ".join(n for n in OURS if hasattr(streamers, n))
    _tell(logging.INFO, f"detok-plugin: on ({source}): transformers' {names} build detok-plugin's drop-ins")


#: Waits, costing nothing, for transformers' streamers to be imported (DETOK_PLUGIN=1).
_HOOK = ImportHook(_framework.STREAMERS, _switch_on)


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
    problems = _patch(importlib.import_module(_framework.STREAMERS))
    if problems:
        _tell(logging.WARNING, f"detok-plugin: install() did nothing: {'; '.join(problems)}; {_STOCK}")


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
    (``common.startup.arm_at_start``): when transformers' streamers are imported, patch
    them (on) and say so, or say off."""
    arm_at_start(_HOOK, tell=_tell, stock=_STOCK)
