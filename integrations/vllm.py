"""vLLM: replace the v1 incremental detokenizer with detok-plugin, behind a flag.

vLLM's ``OutputProcessor`` builds one detokenizer per request through
``vllm.v1.engine.detokenizer.IncrementalDetokenizer.from_new_request`` and then calls
four things on it each engine step::

    update(new_token_ids, stop_terminated) -> matched stop string | None
    get_next_output_text(finished, delta) -> str
    output_token_ids                        (list of the request's output ids)
    num_output_tokens() -> int

:func:`register` (the ``vllm.general_plugins`` entry point) swaps that factory for one that
returns a :class:`VllmDetokenizer` over a :class:`detok_plugin.ServingStream` whenever
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
import functools
import importlib.metadata
import inspect
import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from detok_plugin.integrations._reasoning_stream import ReasoningAwareStream, stream_tags
from detok_plugin.integrations._vllm_handover import StockHandover

from detok_plugin import ServingStream, TokenIdError

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

# A child of vLLM's own "vllm" logger, so that vLLM's logging configuration (its handler,
# format and VLLM_LOGGING_LEVEL) applies: under vLLM's default logging only the "vllm"
# hierarchy has a handler, and a record from any other logger at INFO is dropped.
logger = logging.getLogger("vllm.detok_plugin")

#: The entry-point name in ``[project.entry-points."vllm.general_plugins"]``.
PLUGIN_NAME = "detok_plugin"

#: vLLM releases whose detokenizer contract this shim was tested against.
VERIFIED_VLLM_VERSIONS = frozenset({"0.32.0", "0.33.0"})

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
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
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
    """vLLM's per-request detokenizer contract over a :class:`detok_plugin.ServingStream`.

    Invariants, for the text joined over ``get_next_output_text(..., delta=True)`` calls:

    1. it equals ``tokenizer.decode(prompt + out)[len(tokenizer.decode(prompt)):]`` with
       the request's ``skip_special_tokens``, cut where vLLM cuts at a stop string, and
       without the text of a stop token that ended the stream (unless
       ``include_stop_str_in_output``);
    2. nothing is taken back, and nothing settled is held except a genuine partial stop.

    The engine core, not the detokenizer, ends a stream on EOS and ``stop_token_ids`` (and
    enforces ``min_tokens`` for them); it says so through ``stop_terminated``. So only stop
    strings are matched here. ``path`` is the core's decoder path (``byte_level``,
    ``sentencepiece`` or ``generic``).

    Released text is kept by the request's output kind, which fixes how vLLM asks for it
    (``RequestState._new_completion_output``: ``delta`` is ``output_kind == DELTA``). DELTA:
    one string of what is not yet sent, asked for every step, so it stays one step's text.
    CUMULATIVE and FINAL_ONLY: a list of pieces, folded into one string when asked. O(1)
    amortized per id either way. The other kind of call is answered exactly too, by
    slower means (see :meth:`get_next_output_text`).

    ``output_token_ids`` is the ids vLLM keeps: every id of a step, the stop token included,
    or those up to the one that completed a stop string.

    Nothing raises into vLLM's loop: should the stream raise anyway (a bug), the request is
    handed over to vLLM's stock detokenizer, logged (``_vllm_handover``).
    """

    # What a step reads comes first.
    __slots__ = (
        "_stream", "token_ids", "_stock", "_unsent", "_pieces", "_text", "_folded", "_delta_from",
        "_stop_terminated", "_closed", "_include_stop", "_tokenizer", "_request",
    )

    def __init__(self, tokenizer: Any, request: Any, *, delta: bool | None = None) -> None:
        params = request.sampling_params
        stop = params.stop
        self._include_stop = bool(params.include_stop_str_in_output)
        if delta is None:
            delta = getattr(params.output_kind, "name", None) == "DELTA"
        # The verified table is cached per tokenizer object and the stop automaton per stop
        # tuple, so setup per request is the prompt's decoder state.
        # A detok chat parser asked for its reasoning or tool tags (docs/vllm.md, "Chat
        # API"): then stop strings are cut outside reasoning (vllm-project/vllm#53066) and
        # tool-call bodies only.
        tags = stream_tags(params)
        self._stream = (
            functools.partial(ReasoningAwareStream.from_tokenizer, tags=tags)
            if tags is not None
            else ServingStream.from_tokenizer
        )(
            tokenizer,
            prompt_ids=request.prompt_token_ids or (),
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
            stop_token_ids=(),
            eos_token_ids=(),
            include_stop_str_in_output=self._include_stop,
            min_tokens=params.min_tokens,
            request_id=request.request_id,
            on_unknown_id=_log_unknown_id,
        )
        self._tokenizer = tokenizer  # kept for a cumulative call on a DELTA request
        self._request = request
        # The stream's own list of the ids it took, which is what vLLM keeps, read here and
        # never changed here; but for a stop token the stream is not fed, which goes on a
        # copy at the stream's end (see _update).
        self.token_ids: list[int] = self._stream.token_ids
        self._stock: StockHandover | None = None  # set once the stream raised
        # DELTA: released since the last delta call. None on other kinds, which keep pieces
        # (so ``_unsent is not None`` is how the adapter tells a DELTA request).
        self._unsent: str | None = "" if delta else None
        self._pieces: list[str] = []  # not DELTA: every released piece
        self._text = ""  # not DELTA: the pieces folded so far
        self._folded = 0
        self._delta_from = 0  # the characters delta calls returned so far
        self._stop_terminated = False  # whether a step said stop_terminated
        self._closed = False

    # What stock vLLM's detokenizers expose besides the four calls, with the same meanings
    # (vllm/v1/engine/detokenizer.py: BaseIncrementalDetokenizer and its subclasses), for
    # code and tests that read them. None is on the per-step path.

    @property
    def request_id(self) -> str:
        return self._request.request_id  # type: ignore[no-any-return]

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def output_text(self) -> str:
        """All text released so far (stock: all text decoded so far, cut at a stop). Held
        text (an unfinished character, a genuine partial stop) is not in it until it is
        released. O(1) on CUMULATIVE and FINAL_ONLY requests; O(N) on DELTA requests,
        whose sent text is not kept (rebuilt from the ids)."""
        return self._output_text(False, delta=False)

    @property
    def stop(self) -> list[str]:
        stop = self._request.sampling_params.stop
        return [stop] if isinstance(stop, str) else list(stop or ())

    @property
    def min_tokens(self) -> int:
        return self._request.sampling_params.min_tokens  # type: ignore[no-any-return]

    @property
    def include_stop_str_in_output(self) -> bool:
        return self._include_stop

    @property
    def stop_buffer_length(self) -> int:
        """Stock's constant hold with stop strings (``max(len(stop)) - 1``, 0 when the
        output includes the stop). The plugin holds only a genuine partial match, at most
        this many characters."""
        stop = self.stop
        return max(map(len, stop)) - 1 if stop and not self.include_stop_str_in_output else 0

    @property
    def skip_special_tokens(self) -> bool:
        return self._request.sampling_params.skip_special_tokens  # type: ignore[no-any-return]

    @property
    def spaces_between_special_tokens(self) -> bool:
        return self._request.sampling_params.spaces_between_special_tokens  # type: ignore[no-any-return]

    @property
    def path(self) -> str:
        return self._stream.path

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
        if not stop_terminated and len(new_token_ids) == 1 and self._stock is None:
            # One id, no stop token: the stream's push_text (content only, no Delta built).
            stream = self._stream
            before = len(self.token_ids)
            try:
                text = stream.push_text(new_token_ids[0])
            except Exception as exc:
                return self._hand_over(exc, before, new_token_ids, stop_terminated)
            if text:
                if self._unsent is not None:
                    self._unsent += text
                else:
                    self._pieces.append(text)
            if stream.finish_reason is not None:  # only a stop string ends it here
                return stream.stop_reason  # type: ignore[return-value]
            return None
        return self._update(new_token_ids, stop_terminated)

    def _update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """update() of a step with several ids or a stop token, or after a hand-over."""
        if self._stock is not None:
            stop = self._stock.update(new_token_ids, stop_terminated)
            self.token_ids = self._stock.token_ids
            return stop
        if not new_token_ids:
            return None
        before = len(self.token_ids)
        try:
            return self._push(new_token_ids, stop_terminated)
        except Exception as exc:
            return self._hand_over(exc, before, new_token_ids, stop_terminated)

    def _push(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        self._stop_terminated = self._stop_terminated or stop_terminated
        unfed = stop_terminated and not self._include_stop
        fed = new_token_ids[:-1] if unfed else new_token_ids
        if fed:
            delta = self._stream.push(fed)
            if delta.text:
                self._keep(delta.text)
            if delta.finish_reason == "stop" and isinstance(delta.stop_reason, str):
                # vLLM keeps the ids up to the one completing the stop: the stream's list.
                return delta.stop_reason
        if unfed:
            # The stop token ends the request and is kept, but the stream was not fed it.
            self.token_ids = [*self._stream.token_ids, new_token_ids[-1]]
        return None

    def _keep(self, text: str) -> None:
        if self._unsent is not None:
            self._unsent += text
        else:
            self._pieces.append(text)

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The new text since the last delta call (``delta``), or all text so far."""
        text = self._unsent
        if finished or not delta or text is None:
            return self._output_text(finished, delta)
        self._unsent = ""  # the step of a live DELTA request: what vLLM streams
        self._delta_from += len(text)
        return text

    def _output_text(self, finished: bool, delta: bool) -> str:
        if finished and not self._closed and self._stock is None:
            self._close()
        if self._stock is not None:  # handed over: the stream is not called again
            return self._stock.text(finished, delta)
        text = self._unsent
        if text is not None:
            if not delta:
                # A cumulative call on a DELTA request (vLLM makes none): what was sent is
                # not kept, so replay the ids through a fresh adapter; the core gives the
                # same text whatever the steps (a tested property).
                return self._replay() + text
            if text:
                self._unsent = ""
                self._delta_from += len(text)
            return text
        self._fold()
        if not delta:
            return self._text
        # A delta call on a cumulative request (vLLM makes none): from where the last ended.
        start = self._delta_from
        self._delta_from = len(self._text)
        return self._text[start:]

    def _close(self) -> None:
        """Release what the stream holds at the end (a stop string closed it already, or not)."""
        self._closed = True
        if self._stream.finished:
            return
        try:
            tail = self._stream.finish().text
        except Exception as exc:
            fed = len(self._stream.token_ids)  # all but a stop token not fed to it
            self._hand_over(exc, fed, self.token_ids[fed:], self._stop_terminated)
            return
        if tail:
            self._keep(tail)

    def _fold(self) -> None:
        pieces = self._pieces
        if self._folded != len(pieces):
            self._text += "".join(pieces[self._folded :])
            self._folded = len(pieces)

    def _hand_over(self, exc: Exception, before: int, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """The stream raised: vLLM's stock detokenizer serves the rest of the request
        (``_vllm_handover``), starting from the ids before the failing step, then that step.
        Text the stream released stays released, vLLM not yet given it or not."""
        _log_hand_over(self.request_id, exc)
        self._fold()
        if self._unsent is not None:  # DELTA: what was sent is not kept, only counted
            released, pending = "", self._unsent
        else:
            released, pending = self._text, self._text[self._delta_from :]
        self._unsent = None  # every later text call goes through _output_text
        tokenizer, request = self._tokenizer, self._request
        self._stock = StockHandover.start(
            lambda: _stock_detokenizer(tokenizer, request),
            self.token_ids[:before],
            released=released,
            pending=pending,
            sent=self._delta_from + len(pending),
            request_id=self.request_id,
        )
        return self._update(new_token_ids, stop_terminated)

    def _replay(self) -> str:
        """All text the delta calls returned so far, rebuilt from the ids: O(N), for the
        call vLLM never makes on a DELTA request."""
        fresh = VllmDetokenizer(self._tokenizer, self._request, delta=False)
        if self.token_ids:
            fresh.update(list(self.token_ids), self._stop_terminated)
        text = fresh.get_next_output_text(self._closed, delta=False)
        unsent = self._unsent or ""
        return text[: len(text) - len(unsent)] if unsent else text


def _stock_detokenizer(tokenizer: Any, request: Any) -> Any:
    """vLLM's own detokenizer for ``request``, whether or not the plugin is installed."""
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    stock = _Patch.stock
    if stock is None:  # not installed (an adapter built by hand), or uninstalled since
        return IncrementalDetokenizer.from_new_request(tokenizer, request)
    return stock.__func__(IncrementalDetokenizer, tokenizer, request)


def _log_hand_over(request_id: str, exc: Exception) -> None:
    logger.error(
        "detok-plugin: request %s: the stream raised %r; vLLM's stock detokenizer serves the "
        "rest of this request (please report this with the traceback)",
        request_id,
        exc,
        exc_info=exc,
    )


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

    __slots__ = ("lock", "stock", "ours", "adapter")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stock: Any = None  # the classmethod object from IncrementalDetokenizer.__dict__
        self.ours: Any = None
        # VllmDetokenizer as a subclass of vLLM's IncrementalDetokenizer too (built when
        # patching, since this module imports no vLLM), so isinstance checks hold.
        self.adapter: Any = VllmDetokenizer


_Patch = _PatchState()


@functools.cache  # an ImportError is not cached: the next call tries again
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
    try:
        return _Patch.adapter(tokenizer, request)
    except Exception as exc:  # a bug: this request stays stock rather than fail
        logger.error("detok-plugin: request %s stays stock: %r", request.request_id, exc, exc_info=exc)
        return _Patch.stock.__func__(cls, tokenizer, request)


def _startup_log(level: int, msg: str, *args: Any) -> None:
    """Log a start-up line where vLLM's own log shows it, once vLLM has set up logging.

    vLLM's API server loads general plugins before it configures logging: at that moment
    the "vllm" logger has no handler, and Python drops a record below WARNING. An INFO line
    (the "on" line) then waits until vLLM's next ``vllm.logger.configure_logging`` call
    (every entry point makes one; the wrapper that waits for it puts vLLM's function back
    on that call), then goes out through vLLM's handler. Other lines go out at once:
    warnings and errors reach stderr through Python's last-resort handler, and a reason for
    staying stock must never wait on a call that may not come; DEBUG lines (the plugin
    off) are not worth touching vLLM for.
    """
    if level != logging.INFO or logging.getLogger("vllm").handlers:
        logger.log(level, msg, *args)
        return
    with _Startup.lock:
        _Startup.pending.append((level, msg, args))
        if _Startup.wrapped is not None:
            return
        try:
            import vllm.logger as vllm_logger
        except ImportError:
            vllm_logger = None
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

    __slots__ = ("lock", "pending", "wrapped")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pending: list[tuple[int, str, tuple[Any, ...]]] = []
        self.wrapped: Any = None

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for level, msg, args in pending:
            logger.log(level, msg, *args)


_Startup = _StartupState()


def _as_vllm_class(base: type) -> type:
    """VllmDetokenizer, also an instance of vLLM's ``IncrementalDetokenizer`` for isinstance.

    Our methods come first in the MRO, so vLLM's base contributes only its type (and a
    ``__dict__`` its instances have: the base has no ``__slots__``); its ``__init__`` is
    never called.
    """
    return type(
        "VllmDetokenizer", (VllmDetokenizer, base),
        {"__slots__": (), "__module__": __name__, "__doc__": VllmDetokenizer.__doc__},
    )


def register() -> bool:
    """The ``vllm.general_plugins`` entry point: install the adapter when the flag is on.

    Returns whether the adapter is installed afterwards. Safe to call more than once and in
    every process (vLLM loads general plugins in each of its processes).
    """
    settings = Settings.from_env()
    if not settings.enabled:
        level = logging.WARNING if settings.source.endswith("ignored") else logging.DEBUG
        _startup_log(level, "detok-plugin: off (%s); vLLM keeps its stock detokenizer", settings.source)
        return False
    detokenizer, _ = _import_vllm()
    _register_chat_parsers()
    version = _vllm_version()
    if version.split("+")[0] not in VERIFIED_VLLM_VERSIONS:
        _startup_log(
            logging.WARNING,
            "detok-plugin: vLLM %s is not a version detok-plugin has verified (%s); "
            "checking the detokenizer contract before switching it on",
            version,
            ", ".join(sorted(VERIFIED_VLLM_VERSIONS)),
        )
    problems = contract_problems()
    if problems:
        _startup_log(
            logging.ERROR,
            "detok-plugin: NOT switched on (%s): vLLM %s breaks the detokenizer contract: %s. "
            "vLLM keeps its stock detokenizer.",
            settings.source,
            version,
            "; ".join(problems),
        )
        return False
    cls = detokenizer.IncrementalDetokenizer
    with _Patch.lock:
        patched_now = _Patch.ours is None or cls.__dict__.get("from_new_request") is not _Patch.ours
        if patched_now:
            _Patch.stock = cls.__dict__["from_new_request"]
            _Patch.ours = classmethod(_from_new_request)
            _Patch.adapter = _as_vllm_class(cls)
            cls.from_new_request = _Patch.ours
    # Once per process: vLLM calls every general plugin in each of its processes, and a
    # second register() in one process changes nothing.
    level = logging.INFO if patched_now else logging.DEBUG
    _startup_log(level, "detok-plugin: on (%s), replacing vLLM %s's incremental detokenizer", settings.source, version)
    return True


def _register_chat_parsers() -> None:
    """The ``detok_*`` chat parsers (``vllm_chat``): inert until a server names them."""
    try:
        from detok_plugin.integrations.vllm_chat import register_chat_parsers
    except ImportError as exc:  # a vLLM without the unified parser (before 0.32)
        _startup_log(logging.WARNING, "detok-plugin: no detok_* chat parsers on this vLLM (%s)", exc)
        return
    register_chat_parsers()


def unregister() -> bool:
    """Restore vLLM's stock factory (and parser composition); returns whether ours was installed."""
    chat = sys.modules.get("detok_plugin.integrations.vllm_chat")
    if chat is not None:
        chat.unregister_chat_parsers()
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
