"""vLLM: replace the v1 incremental detokenizer with detok-plugin, behind a flag.

vLLM's ``OutputProcessor`` builds one detokenizer per request through
``vllm.v1.engine.detokenizer.IncrementalDetokenizer.from_new_request`` and then calls
four things on it each engine step::

    update(new_token_ids, stop_terminated) -> matched stop string | None
    get_next_output_text(finished, delta) -> str
    output_token_ids                        (list of the request's output ids)
    num_output_tokens() -> int

:func:`register` (the ``vllm.general_plugins`` entry point) swaps that factory for one that
returns a :class:`VllmDetokenizer` over a :class:`detok_plugin.DetokenizerState` whenever
the request has a tokenizer. Three things change for clients, all visible only in streams:

1. no U+FFFD from a character split across tokens or steps, and none taken back later;
2. text near a stop string is held only while it is a genuine prefix of a stop string
   (stock vLLM holds ``max(len(stop)) - 1`` characters at every step);
3. text that stock vLLM loses (bytes held when the stream ends, a prompt ending inside a
   character) follows the full decode instead.

The switch, read in one place (:meth:`Settings.from_env`):

* ``DETOK_PLUGIN=1`` (or ``true``/``yes``/``on``) switches it on; ``DETOK_PLUGIN=0``
  (or ``false``/``no``/``off``) keeps stock vLLM even when the plugin is named below; any
  other value logs a warning and keeps stock vLLM;
* otherwise (unset or empty) it is on when ``VLLM_PLUGINS`` names ``detok_plugin`` (vLLM
  then loads only the plugins it names), and off when ``VLLM_PLUGINS`` is unset too (vLLM
  loads every installed plugin then; being installed is not consent).

The contract above is private vLLM API. :func:`register` checks it on every start-up; on a
vLLM version not in :data:`VERIFIED_VLLM_VERSIONS` it logs a warning naming the version,
and it patches only when every check passes (otherwise it logs an error and vLLM stays
stock). :func:`unregister` restores the stock factory.

>>> Settings.from_env({"DETOK_PLUGIN": "1"}).enabled
True
>>> Settings.from_env({"VLLM_PLUGINS": "lora_filesystem_resolver,detok_plugin"}).source
'VLLM_PLUGINS names detok_plugin'
>>> Settings.from_env({}).enabled
False
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from detok_plugin import Delta, DetokenizerState, IncrementalDetokenizer, TokenIdError

__all__ = [
    "PLUGIN_NAME",
    "VERIFIED_VLLM_VERSIONS",
    "Settings",
    "VllmDetokenizer",
    "contract_problems",
    "is_registered",
    "register",
    "unregister",
]

logger = logging.getLogger(__name__)

#: The entry-point name in ``[project.entry-points."vllm.general_plugins"]``.
PLUGIN_NAME = "detok_plugin"

#: vLLM releases whose detokenizer contract this shim was tested against.
VERIFIED_VLLM_VERSIONS = frozenset({"0.33.0"})

_INSTALL_HINT = "pip install detok-plugin[vllm]"
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})


# --- the switch -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """Whether the plugin is on, and which variable said so."""

    enabled: bool
    source: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """Read ``DETOK_PLUGIN`` and ``VLLM_PLUGINS`` (the only place either is read)."""
        env = os.environ if environ is None else environ
        raw = env.get("DETOK_PLUGIN", "").strip().lower()
        if raw in _ON:
            return cls(True, f"DETOK_PLUGIN={env['DETOK_PLUGIN']}")
        if raw in _OFF:
            return cls(False, f"DETOK_PLUGIN={env['DETOK_PLUGIN']}")
        if raw:
            # As the transformers shim does: warn (in register) and stay off; raising here
            # would stop vLLM at start-up, since load_general_plugins does not catch.
            return cls(
                False,
                f"DETOK_PLUGIN={env['DETOK_PLUGIN']!r} is not one of 1/0/true/false/yes/no/on/off; ignored",
            )
        # vLLM splits VLLM_PLUGINS on "," and compares names exactly (vllm/envs.py).
        allowed = env.get("VLLM_PLUGINS")
        if allowed is not None and PLUGIN_NAME in allowed.split(","):
            return cls(True, f"VLLM_PLUGINS names {PLUGIN_NAME}")
        return cls(False, "neither DETOK_PLUGIN=1 nor VLLM_PLUGINS naming detok_plugin is set")


# --- the adapter ----------------------------------------------------------------------


class VllmDetokenizer:
    """vLLM's per-request detokenizer contract over the core.

    Invariants, for the text joined over ``get_next_output_text(..., delta=True)`` calls:

    1. it equals ``tokenizer.decode(prompt + out)[len(tokenizer.decode(prompt)):]`` with
       the request's ``skip_special_tokens``, cut where vLLM cuts at a stop string, and
       without the text of a stop token that ended the stream (unless
       ``include_stop_str_in_output``);
    2. nothing is taken back, and nothing settled is held except a genuine partial stop.

    The engine core, not the detokenizer, ends a stream on EOS and ``stop_token_ids`` (and
    enforces ``min_tokens`` for them); it says so through ``stop_terminated``. So only stop
    strings are matched here. ``path`` says which core object streams the text: a
    :class:`detok_plugin.IncrementalDetokenizer` when the request has no stop strings (a
    str per id, the cheapest path), else a :class:`detok_plugin.DetokenizerState`.
    """

    __slots__ = (
        "request_id", "token_ids", "path", "_state", "_simple", "_include_stop",
        "_pieces", "_sent", "_text", "_folded", "_closed", "_push_text",
    )

    def __init__(self, tokenizer: Any, request: Any) -> None:
        params = request.sampling_params
        self.request_id: str = request.request_id
        self.token_ids: list[int] = []
        self._include_stop = bool(params.include_stop_str_in_output)
        stop = params.stop
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        prompt = request.prompt_token_ids or ()
        # Both core objects reuse the verified table cached per tokenizer object, so setup
        # per request is the prompt's decoder state and the stop automaton (cached too).
        self._simple: IncrementalDetokenizer | None = None
        self._state: DetokenizerState | None = None
        if not stops and params.spaces_between_special_tokens:
            self._simple = IncrementalDetokenizer(
                tokenizer, prompt, skip_special_tokens=params.skip_special_tokens
            )
            self.path = "IncrementalDetokenizer"
        else:
            self._state = DetokenizerState.from_tokenizer(
                tokenizer,
                prompt_ids=prompt,
                skip_special_tokens=params.skip_special_tokens,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
                stop=stops,
                stop_token_ids=(),
                eos_token_ids=(),
                include_stop_str_in_output=self._include_stop,
                min_tokens=params.min_tokens,
                request_id=request.request_id,
                keep_log=False,  # the adapter keeps the released text itself
            )
            self.path = "DetokenizerState"
        # One id in, content out, no Delta built: the per-step hot path of update().
        self._push_text = self._simple.push if self._simple is not None else self._state.push_text  # type: ignore[union-attr]
        # Released text, one piece per id or push that released any: DELTA joins the
        # unsent tail, CUMULATIVE folds new pieces into one string. O(1) amortized per id.
        self._pieces: list[str] = []
        self._sent = 0
        self._text = ""
        self._folded = 0
        self._closed = False

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids

    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Take one engine step's ids; return the stop string they completed, or None.

        1. A step that ``stop_terminated`` ends with the stop token or EOS: its text is
           left out unless ``include_stop_str_in_output``, but the id is kept, as vLLM does.
        2. When a stop string completes inside a multi-token step, the ids after the one
           that completed it are dropped from ``output_token_ids``; the caller trims the
           step's own copy by comparing ``num_output_tokens()`` before and after.
        """
        if not new_token_ids:
            return None
        if not stop_terminated and len(new_token_ids) == 1:
            # The common step: one id, no stop token. Same effect as the general path.
            tid = new_token_ids[0]
            try:
                text = self._push_text(tid)
            except TokenIdError as exc:
                _log_unknown_id(exc)
                text = ""
            if text:
                self._pieces.append(text)
            self.token_ids.append(tid)
            state = self._state
            if state is not None and state.finish_reason == "stop" and isinstance(state.stop_reason, str):
                return state.stop_reason
            return None
        fed = new_token_ids[:-1] if stop_terminated and not self._include_stop else new_token_ids
        simple = self._simple
        if simple is not None:
            pieces = self._pieces
            for token_id in fed:
                try:
                    text = simple.push(token_id)
                except TokenIdError as exc:
                    _log_unknown_id(exc)
                    continue
                if text:
                    pieces.append(text)
        elif fed:
            delta = self._push(fed[0] if len(fed) == 1 else fed)
            if delta.text:
                self._pieces.append(delta.text)
            if delta.finish_reason == "stop" and isinstance(delta.stop_reason, str):
                self.token_ids.extend(new_token_ids[: delta.consumed])
                return delta.stop_reason
        self.token_ids.extend(new_token_ids)
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The new text since the last delta call (``delta``), or all text so far."""
        if finished and not self._closed:
            self._closed = True
            tail = self._simple.flush() if self._simple is not None else self._state.finish().text  # type: ignore[union-attr]
            if tail:
                self._pieces.append(tail)
        pieces = self._pieces
        if delta:
            start = self._sent
            if start == len(pieces):
                return ""
            self._sent = len(pieces)
            return pieces[start] if start + 1 == len(pieces) else "".join(pieces[start:])
        if self._folded != len(pieces):
            self._text += "".join(pieces[self._folded :])
            self._folded = len(pieces)
        return self._text

    def _push(self, ids: int | Sequence[int]) -> Delta:
        assert self._state is not None
        try:
            return self._state.push(ids)
        except TokenIdError as exc:
            # Push the step without the id the decode skips; consumed maps back onto it.
            _log_unknown_id(exc)
            batch = [ids] if isinstance(ids, int) else list(ids)
            kept = [k for k, i in enumerate(batch) if i != exc.token_id]
            delta = self._push([batch[k] for k in kept])
            if delta.finish_reason is None:
                return dataclasses.replace(delta, consumed=len(batch))
            return dataclasses.replace(delta, consumed=kept[delta.consumed - 1] + 1 if delta.consumed else 0)


def _log_unknown_id(exc: TokenIdError) -> None:
    # An id past the tokenizer (a model's padded vocabulary can sample one). The tokenizer's
    # decode skips it, and vLLM's stock path logs it and goes on (vllm-project/vllm#21951);
    # raising would fail every request on the server. The id stays in output_token_ids.
    logger.warning("detok-plugin: %s; the text skips it, as the tokenizer's decode does", exc)


# --- the patch ------------------------------------------------------------------------


class _PatchState:
    """The stock factory while ours is installed: one per process, guarded by ``lock``.

    Instance attributes on purpose: a ``classmethod`` stored on a class would bind.
    """

    __slots__ = ("lock", "stock", "ours")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stock: Any = None  # the classmethod object from IncrementalDetokenizer.__dict__
        self.ours: Any = None


_Patch = _PatchState()


def _import_vllm() -> tuple[Any, Any]:
    try:
        from vllm.v1.engine import detokenizer, output_processor
    except ImportError as exc:
        raise ImportError(
            f"detok_plugin.integrations.vllm needs vLLM: {_INSTALL_HINT} ({exc})"
        ) from exc
    return detokenizer, output_processor


def _vllm_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def contract_problems() -> list[str]:
    """Every way the installed vLLM differs from the contract the adapter keeps; [] if none."""
    detokenizer, output_processor = _import_vllm()
    problems: list[str] = []
    cls = getattr(detokenizer, "IncrementalDetokenizer", None)
    if cls is None:
        return ["vllm.v1.engine.detokenizer.IncrementalDetokenizer is gone"]
    if getattr(output_processor, "IncrementalDetokenizer", None) is not cls:
        problems.append("vllm.v1.engine.output_processor no longer builds detokenizers through IncrementalDetokenizer")
    factory = cls.__dict__.get("from_new_request")
    if not isinstance(factory, classmethod):
        problems.append("IncrementalDetokenizer.from_new_request is not a classmethod")
    elif factory is not _Patch.ours and _params(factory.__func__) != ["cls", "tokenizer", "request"]:
        problems.append(f"from_new_request takes {_params(factory.__func__)}, not (cls, tokenizer, request)")
    wanted = {
        "update": ["self", "new_token_ids", "stop_terminated"],
        "get_next_output_text": ["self", "finished", "delta"],
        "num_output_tokens": ["self"],
    }
    for name, params in wanted.items():
        fn = getattr(cls, name, None)
        if fn is None or _params(fn) != params:
            problems.append(f"IncrementalDetokenizer.{name} is not ({', '.join(params)})")
    if not isinstance(inspect.getattr_static(cls, "output_token_ids", None), property):
        problems.append("IncrementalDetokenizer.output_token_ids is not a property")
    try:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.engine import EngineCoreRequest
    except ImportError as exc:
        return problems + [f"cannot import SamplingParams or EngineCoreRequest ({exc})"]
    sp = SamplingParams()
    for name in (
        "stop", "include_stop_str_in_output", "min_tokens", "skip_special_tokens",
        "spaces_between_special_tokens", "detokenize", "output_kind",
    ):
        if not hasattr(sp, name):
            problems.append(f"SamplingParams has no {name}")
    fields = getattr(EngineCoreRequest, "__struct_fields__", ())
    for name in ("request_id", "prompt_token_ids", "sampling_params", "resumable"):
        if name not in fields:
            problems.append(f"EngineCoreRequest has no {name}")
    return problems


def _from_new_request(cls: Any, tokenizer: Any, request: Any) -> Any:
    """The patched factory: our adapter for every request that has a tokenizer."""
    params = request.sampling_params
    if tokenizer is None or params is None or request.resumable:
        # No tokenizer (detokenize=False, skip_tokenizer_init) means no text at all; a
        # resumable (streaming-input) request keeps one detokenizer across several
        # finished chunks, which a DetokenizerState does not model: both stay stock.
        return _Patch.stock.__func__(cls, tokenizer, request)
    return VllmDetokenizer(tokenizer, request)


def register() -> bool:
    """The ``vllm.general_plugins`` entry point: install the adapter when the flag is on.

    Returns whether the adapter is installed afterwards. Safe to call more than once and in
    every process (vLLM loads general plugins in each of its processes).
    """
    settings = Settings.from_env()
    if not settings.enabled:
        log = logger.warning if settings.source.endswith("ignored") else logger.debug
        log("detok-plugin: off (%s); vLLM keeps its stock detokenizer", settings.source)
        return False
    detokenizer, _ = _import_vllm()
    version = _vllm_version()
    if version.split("+")[0] not in VERIFIED_VLLM_VERSIONS:
        logger.warning(
            "detok-plugin: vLLM %s is not a version detok-plugin has verified (%s); "
            "checking the detokenizer contract before switching it on",
            version,
            ", ".join(sorted(VERIFIED_VLLM_VERSIONS)),
        )
    problems = contract_problems()
    if problems:
        logger.error(
            "detok-plugin: NOT switched on (%s): vLLM %s breaks the detokenizer contract: %s. "
            "vLLM keeps its stock detokenizer.",
            settings.source,
            version,
            "; ".join(problems),
        )
        return False
    cls = detokenizer.IncrementalDetokenizer
    with _Patch.lock:
        if _Patch.ours is None or cls.__dict__.get("from_new_request") is not _Patch.ours:
            _Patch.stock = cls.__dict__["from_new_request"]
            _Patch.ours = classmethod(_from_new_request)
            cls.from_new_request = _Patch.ours
    logger.info("detok-plugin: on (%s), replacing vLLM %s's incremental detokenizer", settings.source, version)
    return True


def unregister() -> bool:
    """Restore vLLM's stock factory; returns whether ours was installed."""
    detokenizer, _ = _import_vllm()
    cls = detokenizer.IncrementalDetokenizer
    with _Patch.lock:
        if _Patch.ours is None or cls.__dict__.get("from_new_request") is not _Patch.ours:
            return False
        cls.from_new_request = _Patch.stock
        _Patch.stock = _Patch.ours = None
    return True


def is_registered() -> bool:
    """Whether vLLM's ``IncrementalDetokenizer.from_new_request`` is ours right now."""
    detokenizer, _ = _import_vllm()
    return _Patch.ours is not None and detokenizer.IncrementalDetokenizer.__dict__.get("from_new_request") is _Patch.ours
