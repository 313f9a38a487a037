"""TGI: put the core into ``text-generation-server`` (TGI's Python shard), behind a flag.

Stock TGI turns ids into text in two places, both wrong in ways users have reported:

* each step, ``Model.decode_token`` re-decodes a prefix/read window and ships text only when
  it grew and does not end in U+FFFD, and ``utils.tokens.StoppingCriteria`` matches the
  regex ``stop + "$"`` over that streamed text: a stop that ends inside a token is missed
  (TGI #1039), the stop's text is streamed and kept (#1254, #1724), special-token text
  (``<|im_end|>``) is streamed;
* when a request ends, ``GeneratedText.text`` is ``decode_token`` over the last prompt id
  and the outputs, ``""`` when the output ends inside a character (#1235).

With the shim on, per request, a :class:`~detok_plugin.integrations._tgi_request.RequestText`
(over a :class:`detok_plugin.ServingStream`) does both. How it rides in TGI:

1. ``StoppingCriteria.from_pb`` is replaced by one that returns a subclass of TGI's
   ``StoppingCriteria`` (:func:`criteria_class`) with TGI's counters kept exact
   (``current_tokens``, ``max_new_tokens``, ``eos_token_ids``, ``ignore_eos_token``). TGI's
   batches carry it through ``filter`` and ``concatenate`` as they carry stock's, so the
   request's state moves and is freed with the request: there is no registry to leak.
2. ``generate_token`` of every ``Model`` class that defines it is wrapped: before the
   step, each new request's state is built from its prompt ids (a request whose state
   cannot be built stays stock, logged); during the step TGI calls the criteria once per
   id, which asks the core whether the id ends the request; after it, each ``Generation``
   gets the core's text per kept id (``tokens.texts``), ``is_special`` true only for a
   special id whose text is ``""``, and ``generated_text.text`` = the joined texts.
3. Nothing raises inside TGI's loop (a RuntimeError there kills the shard): unknown ids are
   logged and render as the tokenizer renders them; an unexpected error in a request's
   state is logged and that request goes on stock.

The switch: ``DETOK_PLUGIN=1`` in TGI's environment, through a one-line ``.pth`` start-up
hook that a regular install ships (editable installs: ``python -m
detok_plugin.integrations.tgi install-pth``). It imports nothing at start; it patches when
``text_generation_server.server`` (the serving module) is first imported, after TGI's CLI
has set up its logging, and says so in one line that TGI's launcher shows.
``DETOK_TGI_STOP`` and ``DETOK_TGI_STRIP_REASONING`` are the settings
(:class:`~detok_plugin.integrations._tgi_request.Settings`); :func:`install` and
:func:`uninstall` do it by hand.

The contract is private TGI API, and TGI's package version string says little (a source
build reports ``2.0.5-dev0``). :func:`install` checks the contract itself
(:func:`contract_problems`) and patches only when it holds; a contract whose source
fingerprint (:func:`contract_fingerprint`) is not in :data:`VERIFIED_CONTRACTS` is logged
as unverified.

>>> Settings.from_env({"DETOK_PLUGIN": "1"}).enabled
True
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import threading
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ._import_hook import PTH_ACTIONS, ImportHook, manage_pth
from ._tgi_request import (
    FINISH_EOS_TOKEN,
    FINISH_LENGTH,
    FINISH_STOP_SEQUENCE,
    Settings,
    log,
)
from ._tgi_step import STOCK_ATTR, criteria_class, wrap_generate_token

__all__ = [
    "ENV_FLAG",
    "PTH_LINE",
    "PTH_NAME",
    "VERIFIED_CONTRACTS",
    "Settings",
    "contract_fingerprint",
    "contract_problems",
    "criteria_class",
    "install",
    "installed",
    "uninstall",
]

#: The switch, read (with the settings) by :meth:`Settings.from_env` only.
ENV_FLAG = "DETOK_PLUGIN"

#: The ``.pth`` file and its one line: a dict lookup at interpreter start unless the flag is set.
PTH_NAME = "detok_plugin_tgi.pth"
PTH_LINE = (
    'import os; "DETOK_PLUGIN" in os.environ and '
    '__import__("detok_plugin.integrations.tgi", fromlist=["_startup"])._startup()'
)

#: The serving module: importing it is what TGI's ``serve`` does after setting up logging.
SERVER_MODULE = "text_generation_server.server"

#: Contract fingerprints this shim was tested against, and where they come from.
VERIFIED_CONTRACTS = {
    "967a91e4ac09b2d9": "TGI main at db931fcf (v3.3.7 + 1; TGI is in maintenance mode since 2025-12)",
}

_HINT = "text-generation-server is not installed: the TGI shim runs inside TGI's Python server"


# --- the contract ---------------------------------------------------------------------


def _tgi() -> tuple[ModuleType, ModuleType, ModuleType]:
    """TGI's ``utils.tokens``, ``models.types`` and ``models.model`` modules."""
    try:
        tokens = importlib.import_module("text_generation_server.utils.tokens")
        types = importlib.import_module("text_generation_server.models.types")
        model = importlib.import_module("text_generation_server.models.model")
    except ImportError as exc:
        raise ImportError(f"detok_plugin.integrations.tgi: {_HINT} ({exc})") from exc
    return tokens, types, model


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _generate_token_classes(base: type) -> list[type]:
    """``base`` and its loaded subclasses that define ``generate_token`` themselves."""
    found, todo, seen = [], [base], set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        fn = cls.__dict__.get("generate_token")
        if fn is not None and not getattr(fn, "__isabstractmethod__", False):
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def contract_problems() -> list[str]:
    """Every way the installed TGI differs from what the shim relies on; [] if none."""
    tokens, types, model = _tgi()
    problems: list[str] = []
    criteria = getattr(tokens, "StoppingCriteria", None)
    if criteria is None:
        return ["text_generation_server.utils.tokens.StoppingCriteria is gone"]
    factory = inspect.getattr_static(criteria, "from_pb", None)
    if not isinstance(factory, classmethod) or _params(factory.__func__) != ["cls", "pb", "tokenizer"]:
        problems.append("StoppingCriteria.from_pb is not a classmethod (cls, pb, tokenizer)")
    if _params(criteria.__call__) != ["self", "last_token", "last_output"]:
        problems.append("StoppingCriteria.__call__ is not (self, last_token, last_output)")
    init = _params(criteria.__init__)
    if init[:5] != ["self", "eos_token_ids", "stop_sequence_criterias", "max_new_tokens", "ignore_eos_token"]:
        problems.append(f"StoppingCriteria.__init__ takes {init}")
    for cls_name, fields in (("Tokens", ("token_ids", "logprobs", "texts", "is_special")),
                             ("GeneratedText", ("text", "generated_tokens", "finish_reason", "seed")),
                             ("Generation", ("request_id", "tokens", "generated_text"))):
        cls = getattr(types, cls_name, None)
        missing = [f for f in fields if f not in getattr(cls, "__dataclass_fields__", {})]
        if missing:
            problems.append(f"models.types.{cls_name} has no {', '.join(missing)}")
    pb = getattr(tokens, "FinishReason", None)
    codes = {"FINISH_REASON_LENGTH": FINISH_LENGTH, "FINISH_REASON_EOS_TOKEN": FINISH_EOS_TOKEN,
             "FINISH_REASON_STOP_SEQUENCE": FINISH_STOP_SEQUENCE}
    for name, value in codes.items():
        if getattr(pb, name, None) != value:
            problems.append(f"FinishReason.{name} is not {value}")
    base = getattr(model, "Model", None)
    if base is None:
        return problems + ["models.model.Model is gone"]
    for cls in _generate_token_classes(base):
        fn = _stock_of(cls.__dict__["generate_token"])
        if _params(fn)[:2] != ["self", "batch"]:
            problems.append(f"{cls.__qualname__}.generate_token is not (self, batch, ...)")
    return problems


def contract_fingerprint() -> str:
    """A short hash of the source of what the shim relies on in TGI (the criteria, the
    generation records, ``Model.decode_token`` and the non-flash ``CausalLM`` step)."""
    tokens, types, model = _tgi()
    parts = [tokens.StoppingCriteria, types.Tokens, types.GeneratedText, types.Generation,
             model.Model.decode_token]
    causal = importlib.import_module("text_generation_server.models.causal_lm")
    parts.append(_stock_of(causal.CausalLM.__dict__["generate_token"]))
    digest = hashlib.sha256()
    for part in parts:
        digest.update(inspect.getsource(part).encode())
    return digest.hexdigest()[:16]


def _stock_of(fn: Any) -> Any:
    """The stock function behind ``fn`` (``fn`` itself unless it is our wrapper)."""
    return getattr(fn, STOCK_ATTR, fn)


# --- switching it on ------------------------------------------------------------------


class _PatchState:
    """What :func:`install` replaced, to put back (one per process)."""

    __slots__ = ("lock", "criteria", "stock_from_pb", "wrapped")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.criteria: type | None = None  # our StoppingCriteria subclass while installed
        self.stock_from_pb: Any = None
        self.wrapped: list[type] = []


_Patch = _PatchState()


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
    tokens, _, model = _tgi()
    with _Patch.lock:
        if _Patch.criteria is not None:
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

        _Patch.stock_from_pb = stock_from_pb
        base.from_pb = classmethod(from_pb)
        target: Any
        for target in _generate_token_classes(model.Model):
            target.generate_token = wrap_generate_token(target.__dict__["generate_token"], cls)
            _Patch.wrapped.append(target)
        _Patch.criteria = cls
    stop = "kept" if settings.keep_stop else "excluded"
    reasoning = f", reasoning ({settings.strip_reasoning}) stripped" if settings.strip_reasoning else ""
    log("INFO", f"detok-plugin: on: TGI's token texts, stop strings and generated_text come from "
        f"detok-plugin (stop strings {stop}{reasoning}; {len(_Patch.wrapped)} model classes; "
        f"contract {fingerprint}{' verified' if verified else ' unverified'})")
    return True


def uninstall() -> bool:
    """Put TGI's stock ``from_pb`` and ``generate_token`` back (and disarm the start-up
    hook); returns whether anything was undone. Batches built while it was on keep their
    criteria, which go on working."""
    with _Patch.lock:
        undone = _HOOK.disarm()
        if _Patch.criteria is None:
            return undone
        tokens, _, _ = _tgi()
        tokens.StoppingCriteria.from_pb = _Patch.stock_from_pb
        target: Any
        for target in _Patch.wrapped:
            fn = target.__dict__.get("generate_token")
            if fn is not None and hasattr(fn, STOCK_ATTR):
                target.generate_token = getattr(fn, STOCK_ATTR)
        _Patch.wrapped.clear()
        _Patch.criteria = _Patch.stock_from_pb = None
        return True


def installed() -> bool:
    """Whether TGI's ``StoppingCriteria.from_pb`` is ours right now."""
    return _Patch.criteria is not None


# --- the start-up hook: DETOK_PLUGIN=1 ------------------------------------------------


def _install_quietly(_module: ModuleType | None = None) -> None:
    """install(), for the hook: a failure is logged, never raised into TGI's import."""
    try:
        install()
    except Exception as exc:
        log("ERROR", f"detok-plugin: NOT switched on: {exc!r}; TGI keeps its stock text")


#: Waits, costing nothing, for TGI's serving module, then installs (once).
_HOOK = ImportHook(SERVER_MODULE, _install_quietly)


def _startup() -> None:
    """Called by the ``.pth`` line at interpreter start: honour ``DETOK_PLUGIN``.

    On, it patches now if the serving module is loaded, else when it is first imported;
    off, nothing; an unknown value warns. It never raises (a ``.pth`` line that raises
    prints a traceback at every interpreter start).
    """
    try:
        settings = Settings.from_env()
        if not settings.enabled:
            for problem in settings.problems:
                warnings.warn(problem, stacklevel=2)
            return
        with _Patch.lock:
            _HOOK.arm()
    except Exception as exc:  # never break interpreter start
        warnings.warn(f"{ENV_FLAG}=1: could not arm the TGI shim: {exc!r}", stacklevel=2)


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m detok_plugin.integrations.tgi {install-pth,remove-pth,show-pth,check}``."""
    import argparse
    import sysconfig
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="python -m detok_plugin.integrations.tgi",
        description=f"Manage the one-line .pth file that makes {ENV_FLAG}=1 switch TGI's server to "
        "detok-plugin's text, or check the installed TGI's contract.",
    )
    parser.add_argument("action", choices=(*PTH_ACTIONS, "check"))
    parser.add_argument(
        "--site-dir", type=Path, default=Path(sysconfig.get_paths()["purelib"]),
        help="site-packages directory to write to (default: this interpreter's purelib)",
    )
    args = parser.parse_args(argv)
    target = args.site_dir / PTH_NAME
    if args.action == "check":
        problems = contract_problems()
        fingerprint = contract_fingerprint()
        print(f"contract {fingerprint}: {VERIFIED_CONTRACTS.get(fingerprint, 'not verified')}")
        print("\n".join(problems) if problems else "no problems: the shim can switch on")
        return 1 if problems else 0
    return manage_pth(args.action, target, PTH_LINE, f"{ENV_FLAG}=1 now switches TGI's server to detok-plugin's text")


if __name__ == "__main__":
    raise SystemExit(_main())
