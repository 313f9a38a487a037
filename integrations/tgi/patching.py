"""Switching the TGI shim on: :func:`install`, :func:`uninstall`, and ``DETOK_PLUGIN=1``.

:func:`install` replaces ``StoppingCriteria.from_pb`` and wraps ``generate_token`` of every
``Model`` class that defines it, through the shared patch registry, once the contract holds
(``_framework``); :func:`uninstall` puts TGI's own back. ``DETOK_PLUGIN=1`` does it at
interpreter start through the ``.pth`` line (``common.startup``), when TGI's serving module
is first imported (its line says ``on``; ``DETOK_PLUGIN=0`` or a mistaken value says ``off``
at the same moment, and a process that never imports TGI's server hears nothing).
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ..common.patches import PATCHES
from ..common.startup import ImportHook, arm_at_start
from ..common.switch import Switch
from ._framework import (
    SERVER_MODULE,
    VERIFIED_CONTRACTS,
    contract_fingerprint,
    contract_problems,
    generate_token_classes,
    log,
    modules,
)
from .request import Settings
from .step import criteria_class, wrap_generate_token

__all__ = ["install", "installed", "startup", "uninstall"]


class _Installed:
    """What :func:`install` put in, to take out (one per process; under ``PATCHES.lock``)."""

    criteria: Any = None  # our StoppingCriteria subclass while installed
    wrapped: list[type] = []  # noqa: RUF012 (one per process, replaced whole on uninstall)


def install(settings: Settings | None = None) -> bool:
    """Put the core into TGI's server: returns whether it is on afterwards.

    ``settings`` default to :meth:`Settings.from_env` (the flag itself is not needed here:
    calling ``install()`` is the consent). Patches only when :func:`contract_problems` is
    empty (otherwise logs why and leaves TGI stock). Idempotent; call it before TGI builds
    its first batch. Logs one line, through TGI's own logger, saying it is on.
    """
    settings = Settings.from_env() if settings is None else settings
    for problem in settings.problems:
        log("WARNING", f"detok-plugin: {problem}")
    tokens, _, model = modules()
    with PATCHES.lock:
        if _Installed.criteria is not None:
            return True
        problems = contract_problems()
        if problems:
            log("ERROR", "detok-plugin: NOT switched on: this TGI breaks the contract the shim keeps: "
                + "; ".join(problems) + ". TGI keeps its stock text.")
            return False
        fingerprint = contract_fingerprint()
        verified = VERIFIED_CONTRACTS.get(fingerprint)
        if verified is None:
            log("WARNING", f"detok-plugin: TGI contract {fingerprint} is not one detok-plugin has verified "
                f"({', '.join(VERIFIED_CONTRACTS.values())}); its checks pass, so it switches on")
        base = tokens.StoppingCriteria
        cls: Any = criteria_class(base, settings)
        stock_from_pb = base.__dict__["from_pb"]

        def from_pb(_cls: type, pb: Any, tokenizer: Any) -> Any:
            stock = stock_from_pb.__func__(base, pb, tokenizer)
            try:
                return cls.from_stock(stock, tuple(pb.stop_sequences), tokenizer)
            except Exception as exc:  # never fail a request for the shim's sake
                log("WARNING", f"detok-plugin: a request stays stock: {exc!r}")
                return stock

        PATCHES.install(base, "from_pb", classmethod(from_pb))
        target: Any
        for target in generate_token_classes(model.Model):
            PATCHES.install(target, "generate_token", wrap_generate_token(target.__dict__["generate_token"], cls))
            _Installed.wrapped.append(target)
        _Installed.criteria = cls
    stop = "kept" if settings.keep_stop else "excluded"
    reasoning = f", reasoning ({settings.strip_reasoning}) stripped" if settings.strip_reasoning else ""
    log("INFO", f"detok-plugin: on: TGI's token texts, stop strings and generated_text come from "
        f"detok-plugin (stop strings {stop}{reasoning}; {len(_Installed.wrapped)} model classes; "
        f"contract {fingerprint}{' verified' if verified else ' unverified'})")
    return True


def uninstall() -> bool:
    """Put TGI's stock ``from_pb`` and ``generate_token`` back (and disarm the start-up
    hook); returns whether anything was undone. Batches built while it was on keep their
    criteria, which go on working."""
    with PATCHES.lock:
        undone = _HOOK.disarm()
        if _Installed.criteria is None:
            return undone
        tokens, _, _ = modules()
        PATCHES.uninstall(tokens.StoppingCriteria, "from_pb")
        for target in _Installed.wrapped:
            PATCHES.uninstall(target, "generate_token")
        _Installed.wrapped = []
        _Installed.criteria = None
        return True


def installed() -> bool:
    """Whether TGI's ``StoppingCriteria.from_pb`` is ours right now."""
    return _Installed.criteria is not None


# --- the start-up hook: DETOK_PLUGIN=1 ------------------------------------------------


def _install_quietly(_module: ModuleType | None = None) -> None:
    """install(), for the hook: a failure is logged, never raised into TGI's import."""
    try:
        install()
    except Exception as exc:
        source = Switch.from_env().source
        log("ERROR", f"detok-plugin: NOT switched on ({source}): {type(exc).__name__}: {exc}; TGI keeps its stock text")


#: Waits, costing nothing, for TGI's serving module, then installs (once).
_HOOK = ImportHook(SERVER_MODULE, _install_quietly)


def _tell(level: int, line: str) -> None:
    log(logging.getLevelName(level), line)


def startup() -> None:
    """Called by the ``.pth`` line at interpreter start: honour ``DETOK_PLUGIN``
    (``common.startup.arm_at_start``): when TGI's serving module is imported, install (on;
    :func:`install` says so) or say off."""
    arm_at_start(_HOOK, tell=_tell, stock="TGI keeps its stock text")
