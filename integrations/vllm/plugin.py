"""The vLLM plugin: the ``vllm.general_plugins`` entry point, behind the switch.

:func:`register` swaps ``IncrementalDetokenizer.from_new_request`` for a factory that
returns a :class:`~.detokenizer.VllmDetokenizer` whenever the request has a tokenizer,
starts building the tokenizer's table when vLLM builds its ``OutputProcessor``
(``common.tables``: at start-up, not in the first request), and registers the ``detok_*``
chat parsers (``chat_registry``). The switch, read in one place
(:meth:`Settings.from_env`):

* ``DETOK_PLUGIN=1`` (or ``true``/``yes``/``on``) switches it on; ``DETOK_PLUGIN=0``
  (or ``false``/``no``/``off``) keeps stock vLLM even when the plugin is named below; any
  other value keeps stock vLLM with a warning that names it (``common.switch``);
* otherwise (unset or empty) it is on when ``VLLM_PLUGINS`` names ``detok_plugin`` (vLLM
  then loads only the plugins it names), and off when ``VLLM_PLUGINS`` is unset too (vLLM
  loads every installed plugin then; being installed is not consent);
* with ``VLLM_USE_RUST_FRONTEND=1``, ``vllm serve`` answers HTTP from vLLM's Rust frontend,
  where no Python plugin acts: the plugin stays off and says so.

Each vLLM process says in one line what the switch did there: ``on (...)``, ``off (...)``
(INFO; a mistaken value as a WARNING), or ``NOT switched on (...)`` with the reason. The
``detok_*`` parser names are checked at vLLM's argument validation in every case
(``parser_names``): naming one where the plugin cannot act stops the server before its
model loads, with the reason and ``DETOK_PLUGIN=1``.

The contract is private vLLM API (``_framework``). :func:`register` checks it on every
start-up; on a vLLM version not in ``VERIFIED_VLLM_VERSIONS`` it logs a warning naming the
version, and it patches only when every check passes (otherwise it logs an error and vLLM
stays stock). :func:`unregister` restores the stock factory.

>>> Settings.from_env({"DETOK_PLUGIN": "1"}).enabled
True
>>> Settings.from_env({"VLLM_PLUGINS": "lora_filesystem_resolver,detok_plugin"}).source
'VLLM_PLUGINS names detok_plugin'
>>> Settings.from_env({}).enabled
False
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from ..common.patches import PATCHES
from ..common.switch import Switch
from ..common.tables import warming
from . import _framework, parser_names
from .detokenizer import VllmDetokenizer, detokenizer_is_ours, stock_detokenizer
from .parser_names import Refusal

__all__ = ["PLUGIN_NAME", "Settings", "is_registered", "register", "unregister"]

# A child of vLLM's own "vllm" logger, so that vLLM's logging configuration (its handler,
# format and VLLM_LOGGING_LEVEL) applies: under vLLM's default logging only the "vllm"
# hierarchy has a handler, and a record from any other logger at INFO is dropped.
logger = logging.getLogger("vllm.detok_plugin")

#: The entry-point name in ``[project.entry-points."vllm.general_plugins"]``.
PLUGIN_NAME = "detok_plugin"


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """Whether the plugin is on, and which variable said so (``problem``: a mistaken value)."""

    enabled: bool
    source: str
    problem: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``DETOK_PLUGIN`` (``common.switch``) and, when it is unset, ``VLLM_PLUGINS``."""
        switch = Switch.from_env(environ)
        if switch.state != "unset":
            # A mistaken value stays off with a warning (in register): raising here would
            # stop vLLM at start-up, since load_general_plugins does not catch.
            return cls(switch.on, switch.source, switch.problem)
        # vLLM splits VLLM_PLUGINS on "," and compares names exactly (vllm/envs.py).
        allowed = (os.environ if environ is None else environ).get("VLLM_PLUGINS")
        if allowed is not None and PLUGIN_NAME in allowed.split(","):
            return cls(True, f"VLLM_PLUGINS names {PLUGIN_NAME}")
        return cls(False, "neither DETOK_PLUGIN=1 nor VLLM_PLUGINS naming detok_plugin is set")


def _factory() -> tuple[type, Any]:
    """vLLM's ``IncrementalDetokenizer``, and the factory we install on it."""
    return _framework.detokenizer_api()[0].IncrementalDetokenizer, _OURS


def _from_new_request(cls: Any, tokenizer: Any, request: Any) -> Any:
    """The patched factory: our adapter for every request that has a tokenizer."""
    params = request.sampling_params
    if tokenizer is None or params is None or request.resumable:
        # No tokenizer (detokenize=False, skip_tokenizer_init) means no text at all; a
        # resumable (streaming-input) request keeps one detokenizer across several
        # finished chunks, which a DetokenizerState does not model: both stay stock.
        return stock_detokenizer(tokenizer, request)
    try:
        return _adapter(cls)(tokenizer, request)
    except Exception as exc:  # a bug: this request stays stock rather than fail
        logger.error("detok-plugin: request %s stays stock: %r", request.request_id, exc, exc_info=exc)
        return stock_detokenizer(tokenizer, request)


def _startup_log(level: int, msg: str, *args: Any) -> None:
    """Log a start-up line where vLLM's own log shows it, once vLLM has set up logging.

    vLLM's API server loads general plugins before it configures logging: at that moment
    the "vllm" logger has no handler, and Python drops a record below WARNING. An INFO line
    (the "on" line) then waits until vLLM's next ``vllm.logger.configure_logging`` call
    (every entry point makes one; the wrapper that waits for it puts vLLM's function back
    on that call), then goes out through vLLM's handler. Other lines go out at once:
    warnings and errors reach stderr through Python's last-resort handler, and a reason for
    staying stock must never wait on a call that may not come; DEBUG lines (a line said
    before in this process) are not worth touching vLLM for.
    """
    if level != logging.INFO or logging.getLogger("vllm").handlers:
        logger.log(level, msg, *args)
        return
    with _Startup.lock:
        _Startup.pending.append((level, msg, args))
        if _Startup.wrapped is not None:
            return
        vllm_logger: Any = _framework.logger_module()
        configure = getattr(vllm_logger, "configure_logging", None)
        if configure is None:  # no hook to wait for: say it now, as Python's logging allows
            _Startup.flush()
            return

        def configure_then_flush(*a: Any, **kw: Any) -> Any:
            try:
                return configure(*a, **kw)
            finally:
                with _Startup.lock:
                    if getattr(vllm_logger, "configure_logging", None) is configure_then_flush:
                        vllm_logger.configure_logging = configure
                    _Startup.wrapped = None
                    _Startup.flush()

        _Startup.wrapped = configure_then_flush
        vllm_logger.configure_logging = configure_then_flush


class _StartupState:
    """Start-up lines waiting for vLLM's logging (see :func:`_startup_log`)."""

    __slots__ = ("lock", "pending", "said", "wrapped")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pending: list[tuple[int, str, tuple[Any, ...]]] = []
        self.wrapped: Any = None
        self.said: set[str] = set()  # lines said once per process (_say_once)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for level, msg, args in pending:
            logger.log(level, msg, *args)


_Startup = _StartupState()


@functools.cache
def _adapter(base: type) -> type:
    """VllmDetokenizer, also an instance of vLLM's ``IncrementalDetokenizer`` for isinstance.

    Our methods come first in the MRO, so vLLM's base contributes only its type (and a
    ``__dict__`` its instances have: the base has no ``__slots__``); its ``__init__`` is
    never called.
    """
    return type(
        "VllmDetokenizer", (VllmDetokenizer, base),
        {"__slots__": (), "__module__": "detok_plugin.integrations.vllm", "__doc__": VllmDetokenizer.__doc__},
    )


def register() -> bool:
    """The ``vllm.general_plugins`` entry point: install the adapter when the switch is on.

    Returns whether the adapter is installed afterwards. Safe to call more than once and in
    every process (vLLM loads general plugins in each of its processes). Each process says
    in one line what the switch did: on, off (and why), or not switched on (and why). In
    every case the ``detok_*`` parser names are checked at vLLM's argument validation
    (``parser_names``): a server that names one where the plugin cannot act stops before
    its model loads, with that reason.
    """
    settings = Settings.from_env()
    if not settings.enabled:
        level = logging.INFO if settings.problem is None else logging.WARNING
        _say_once(level, f"detok-plugin: off ({settings.source}); {_STOCK}")
        parser_names.guard(Refusal(f"detok-plugin is off ({settings.source})", "start vLLM with DETOK_PLUGIN=1"))
        return False
    if _framework.rust_frontend():
        flag = _framework.RUST_FRONTEND_FLAG
        _say_once(
            logging.WARNING,
            f"detok-plugin: NOT switched on ({settings.source}): {flag}=1, so `vllm serve` answers HTTP from "
            f"vLLM's Rust frontend (vllm-rs), which detokenizes and parses in Rust, where detok-plugin cannot "
            f"act; this server runs stock vLLM (unset {flag} to use the plugin)",
        )
        parser_names.guard(Refusal(f"{flag}=1 serves the chat API from vLLM's Rust frontend", f"unset {flag}"))
        return False
    _framework.detokenizer_api()
    parser_names.guard(_register_chat_parsers())
    version = _framework.vllm_version()
    verified = _framework.VERIFIED_VLLM_VERSIONS
    if version.split("+")[0] not in verified:
        _startup_log(
            logging.WARNING,
            "detok-plugin: vLLM %s is not a version detok-plugin has verified (%s); "
            "checking the detokenizer contract before switching it on",
            version,
            ", ".join(sorted(verified)),
        )
    cls, ours = _factory()
    problems = _framework.contract_problems(ours)
    if problems:
        _say_once(
            logging.ERROR,
            f"detok-plugin: NOT switched on ({settings.source}): vLLM {version} breaks the detokenizer "
            f"contract: {'; '.join(problems)}. {_STOCK}.",
        )
        return False
    with PATCHES.lock:
        patched_now = not PATCHES.is_ours(cls, "from_new_request")
        if patched_now:
            PATCHES.install(cls, "from_new_request", ours)
        processor = _framework.detokenizer_api()[1].OutputProcessor
        if not PATCHES.is_ours(processor, "__init__"):
            # Its own __init__ or an inherited one: a vLLM that moved it still starts.
            PATCHES.install(processor, "__init__", warming(processor.__init__, logger))
    # Once per process: vLLM calls every general plugin in each of its processes, and a
    # second register() in one process changes nothing.
    level = logging.INFO if patched_now else logging.DEBUG
    _startup_log(level, "detok-plugin: on (%s), replacing vLLM %s's incremental detokenizer", settings.source, version)
    return True


#: What every line that keeps stock says vLLM keeps.
_STOCK = "vLLM keeps its stock detokenizer"


def _say_once(level: int, line: str) -> None:
    """A start-up line, at ``level`` the first time this process says it (DEBUG after)."""
    with _Startup.lock:
        first = line not in _Startup.said
        _Startup.said.add(line)
    _startup_log(level if first else logging.DEBUG, "%s", line)


def _register_chat_parsers() -> Refusal | None:
    """The ``detok_*`` chat parsers (``chat_registry``): inert until a server names them.
    Returns why they cannot run on this vLLM (logged), or None."""
    try:
        from .chat_registry import register_chat_parsers
    except ImportError as exc:  # a vLLM without the unified parser (before 0.32)
        _startup_log(logging.WARNING, "detok-plugin: no detok_* chat parsers on this vLLM (%s)", exc)
        return Refusal(f"this vLLM has no unified chat parser for them ({exc})", "use vLLM 0.32 or 0.33")
    problems = register_chat_parsers()
    if not problems:
        return None
    return Refusal(f"this vLLM's chat layer does not fit them ({'; '.join(problems)})", "use vLLM 0.32 or 0.33")


def unregister() -> bool:
    """Restore vLLM's stock factory (and parser composition); returns whether ours was installed."""
    from .chat_registry import unregister_chat_parsers

    parser_names.unguard()
    unregister_chat_parsers()
    cls, _ = _factory()
    PATCHES.uninstall(_framework.detokenizer_api()[1].OutputProcessor, "__init__")
    return PATCHES.uninstall(cls, "from_new_request")


def is_registered() -> bool:
    """Whether vLLM's ``IncrementalDetokenizer.from_new_request`` is ours right now."""
    return detokenizer_is_ours()


#: The factory we install (one object, so that ``is_ours`` can tell it).
_OURS = classmethod(_from_new_request)
