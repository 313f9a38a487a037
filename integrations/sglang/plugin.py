"""The SGLang plugin: the ``sglang.srt.plugins`` entry point, behind the switch.

SGLang runs every general plugin's entry point in each process it starts (the server's
main process, the scheduler, the detokenizer, a data-parallel controller), through
``sglang.srt.plugins.load_plugins()``. :func:`register` then patches the two seams
(``scheduler``: stop strings; ``detokenizer``: the text), and wraps the detokenizer's and
the scheduler's ``init_tokenizer`` so that each process builds its tokenizer's table as it
loads the tokenizer (``common.tables``), when the switch is on:

* ``DETOK_PLUGIN=1`` (or ``true``/``yes``/``on``) switches it on; ``DETOK_PLUGIN=0`` keeps
  stock SGLang even when ``SGLANG_PLUGINS`` names the plugin; any other value keeps stock
  SGLang with a warning naming it (``common.switch``);
* unset or empty: on when ``SGLANG_PLUGINS`` names ``detok_plugin`` (SGLang then loads only
  the plugins it names), off otherwise (installed is not switched on). ``SGLANG_PLUGINS``
  set without ``detok_plugin``: SGLang never calls :func:`register`;
* with ``SGLANG_RUST_SERVER=1`` SGLang's Rust server detokenizes, in Rust: the plugin stays
  off and says so.

Each process says in one line what the switch did there: ``on (...)``, ``off (...)`` or
``NOT switched on (...)`` with the reason. The seams are private SGLang API
(``_framework``): on a version not in ``VERIFIED_SGLANG_VERSIONS`` a warning names it, and
the plugin patches only when every contract check passes (otherwise one error line lists
them, and SGLang stays stock).

>>> Settings.from_env({"DETOK_PLUGIN": "1"}).enabled
True
>>> Settings.from_env({"SGLANG_PLUGINS": "other,detok_plugin"}).source
'SGLANG_PLUGINS names detok_plugin'
>>> Settings.from_env({}).enabled
False
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Mapping

from ..common.patches import PATCHES
from ..common.startup import say
from ..common.switch import Switch
from ..common.tables import warming
from . import _framework, detokenizer, parsers, scheduler

__all__ = ["PLUGIN_NAME", "Settings", "is_registered", "register", "unregister"]

#: The logger every line goes through (SGLang configures the root logger in each process).
LOGGER = "sglang.detok_plugin"

#: The entry-point name in ``[project.entry-points."sglang.srt.plugins"]``.
PLUGIN_NAME = "detok_plugin"

#: What every line that keeps stock says SGLang keeps.
_STOCK = "SGLang keeps its stock stop-string check and detokenizer"


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """Whether the plugin is on, and which variable said so (``problem``: a mistaken value)."""

    enabled: bool
    source: str
    problem: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``DETOK_PLUGIN`` (``common.switch``) and, when it is unset, ``SGLANG_PLUGINS``."""
        switch = Switch.from_env(environ)
        if switch.state != "unset":
            return cls(switch.on, switch.source, switch.problem)
        allowed = (os.environ if environ is None else environ).get(_framework.PLUGINS_FLAG) or ""
        if PLUGIN_NAME in {name.strip() for name in allowed.split(",")}:
            return cls(True, f"{_framework.PLUGINS_FLAG} names {PLUGIN_NAME}")
        return cls(False, f"neither DETOK_PLUGIN=1 nor {_framework.PLUGINS_FLAG} naming {PLUGIN_NAME} is set")


_said: set[str] = set()
_said_lock = threading.Lock()


def _say_once(level: int, line: str) -> None:
    """A start-up line, at ``level`` the first time this process says it (DEBUG after)."""
    with _said_lock:
        first = line not in _said
        _said.add(line)
    log = logging.getLogger(LOGGER)
    if not first:
        log.debug("%s", line)
        return
    line = f"[{_framework.process_name()}] {line}"
    if log.isEnabledFor(level):
        say(LOGGER, level, line)  # through SGLang's logging where it is set up, else stderr
        return
    # SGLang loads plugins before it sets up its logging, under a handler at WARNING in
    # some processes: an INFO line would vanish there, so it goes to stderr as it is.
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


def register() -> bool:
    """The ``sglang.srt.plugins`` entry point: patch SGLang's stop-string check and
    detokenizer step when the switch is on. Returns whether both are ours afterwards.
    Safe to call more than once, in every process; never raises (SGLang only logs a
    plugin that raises, and would go on half-patched)."""
    try:
        return _register()
    except Exception as exc:  # a bug of ours: stock SGLang rather than a half-patched one
        unregister()
        _say_once(logging.ERROR, f"detok-plugin: NOT switched on: {exc!r}; {_STOCK}")
        return False


def _register() -> bool:
    settings = Settings.from_env()
    if not settings.enabled:
        level = logging.INFO if settings.problem is None else logging.WARNING
        _say_once(level, f"detok-plugin: off ({settings.source}); {_STOCK}")
        return False
    if _framework.rust_server():
        flag = _framework.RUST_SERVER_FLAG
        _say_once(
            logging.WARNING,
            f"detok-plugin: NOT switched on ({settings.source}): {flag}=1, so SGLang's Rust server detokenizes, "
            f"in Rust, where detok-plugin cannot act; {_STOCK} (unset {flag} to use the plugin)",
        )
        return False
    version = _framework.sglang_version()
    verified = _framework.VERIFIED_SGLANG_VERSIONS
    if version.split("+")[0] not in verified:
        _say_once(
            logging.WARNING,
            f"detok-plugin: SGLang {version} is not a version detok-plugin has verified ({', '.join(sorted(verified))}); "
            "checking the contract before switching it on",
        )
    problems = _framework.contract_problems()
    if problems:
        _say_once(
            logging.ERROR,
            f"detok-plugin: NOT switched on ({settings.source}): SGLang {version} breaks the contract: "
            f"{'; '.join(problems)}. {_STOCK}.",
        )
        return False
    scheduler.install()
    detokenizer.install()
    _build_tables_at_start()
    parsers.install(_say_once)  # the detok_* chat parsers, in the server's own process
    _say_once(
        logging.INFO,
        f"detok-plugin: on ({settings.source}), replacing SGLang {version}'s stop-string check "
        "(Req._check_str_based_finish, Req.check_match_stop_str_prefix) and detokenizer step "
        "(DetokenizerManager._decode_batch_token_id_output)",
    )
    return True


def _loaders() -> list[object]:
    """The classes whose ``init_tokenizer`` loads a process's tokenizer: the detokenizer's,
    and the scheduler's in its own process."""
    return [c for c in (_framework.seams().DetokenizerManager, _framework.scheduler_class()) if c is not None]


def _build_tables_at_start() -> None:
    """Each process's tokenizer table built as the process loads its tokenizer
    (``init_tokenizer``, before the scheduler loads the model), in the background
    (``common.tables``): not in the first request, which with ``--skip-server-warmup`` would
    otherwise build it on the scheduler's or the detokenizer's loop. An SGLang without the
    method leaves the build to the first stream."""
    where = f"[{_framework.process_name()}] "
    with PATCHES.lock:
        for owner in _loaders():
            stock = getattr(owner, "init_tokenizer", None)
            if stock is not None and not PATCHES.is_ours(owner, "init_tokenizer"):
                PATCHES.install(owner, "init_tokenizer", warming(stock, logging.getLogger(LOGGER), where))


def unregister() -> bool:
    """Put SGLang's stock methods back; returns whether any of ours was installed."""
    try:
        _framework.seams()
    except ImportError:
        return False
    for owner in _loaders():
        PATCHES.uninstall(owner, "init_tokenizer")
    return any([scheduler.uninstall(), detokenizer.uninstall(), parsers.uninstall()])


def is_registered() -> bool:
    """Whether both seams are ours right now."""
    return scheduler.is_installed() and detokenizer.is_installed()
