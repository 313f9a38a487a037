"""Stop strings in SGLang's scheduler, over one :class:`detok_plugin.ServingStream` per request.

SGLang's scheduler checks stop strings on each request after every step
(``Req.update_finish_state`` calls ``Req._check_str_based_finish``) by decoding only the last
``len(encode(stop)) + 1`` output ids, with the tokenizer's default flags; and its output
streamer holds a streaming request's unsent ids while the tail of that decode ends with the
start of a stop (``Req.check_match_stop_str_prefix``). So a stop the model spells in more
tokens than its own encoding (one token per character, a CJK stop in byte tokens) is never
seen: it leaks into the text and generation runs on; and a stop visible only across a
special token the request skips is missed.

Here each request with stop strings gets a :class:`StopWatch`: a ``ServingStream`` with the
request's stops and text flags (``skip_special_tokens``, ``spaces_between_special_tokens``)
and its whole prompt, fed each output id once. ``_check_str_based_finish`` sets SGLang's
``FINISH_MATCHED_STR(matched=stop)`` and ``finished_len`` (the ids through the one that
completed the stop) exactly when the text first contains a stop; the prefix check holds the
ids while, and only while, the stream holds a genuine partial stop. What stays SGLang's:
requests without stop strings, stop regexes (a request with one is stock's whole), stop
token ids, EOS, length and grammar. A stream that raises (a bug) hands its request back to
SGLang's stock check, logged; the watch lives on the request, so it goes when SGLang drops
the request.
"""

from __future__ import annotations

import logging
from typing import Any

from detok_plugin import ServingStream, TokenIdError

from ..common.patches import PATCHES
from . import _framework

__all__ = ["StopWatch", "check_match_stop_str_prefix", "check_str_based_finish", "install", "uninstall"]

logger = logging.getLogger("sglang.detok_plugin")

#: The request attribute that holds its watch (None: SGLang's stock check serves it).
WATCH = "_detok_plugin_stops"

_CHECK = "_check_str_based_finish"
_PREFIX = "check_match_stop_str_prefix"


class StopWatch:
    """One request's stop strings: a stream fed the request's output ids once each."""

    __slots__ = ("stream", "fed", "finish_cls")

    def __init__(self, req: Any, finish_cls: Any) -> None:
        params = req.sampling_params
        self.stream = ServingStream.from_tokenizer(
            req.tokenizer,
            prompt_ids=list(req.origin_input_ids_unpadded or ()),
            skip_special_tokens=bool(params.skip_special_tokens),
            spaces_between_special_tokens=bool(params.spaces_between_special_tokens),
            stop=tuple(params.stop_strs),
            stop_token_ids=(),
            eos_token_ids=(),
            request_id=str(req.rid),
            on_unknown_id=_log_unknown_id,
        )
        self.fed = 0  # output ids fed so far
        self.finish_cls = finish_cls

    def catch_up(self, ids: Any) -> None:
        """Feed the output ids not fed yet (none once a stop completed)."""
        stream = self.stream
        n = len(ids)
        fed = self.fed
        if n == fed + 1 and stream.finish_reason is None:
            stream.push_text(ids[fed])
        elif n != fed and stream.finish_reason is None:
            if n < fed:  # SGLang dropped output ids (a retracted request re-prefilled from scratch)
                raise _Restart
            push = stream.push_text
            for i in range(fed, n):
                push(ids[i])
                if stream.finish_reason is not None:
                    break
        self.fed = n

    def finish(self, req: Any) -> bool:
        """Set SGLang's finish on ``req`` if a stop string completed; returns whether."""
        stream = self.stream
        if stream.finish_reason != "stop":
            return False
        req.finished_reason = self.finish_cls(matched=stream.stop_reason)
        req.finished_len = len(stream.token_ids)
        return True


class _Restart(Exception):
    """The request's output ids went back: a fresh watch replays them."""


def _watch(req: Any) -> StopWatch | None:
    """The request's watch, made on first use; None where SGLang's stock check serves it."""
    try:
        return req.__dict__[WATCH]  # type: ignore[no-any-return]
    except KeyError:
        pass
    watch = None
    params = req.sampling_params
    if params.stop_strs and not params.stop_regex_strs and req.tokenizer is not None:
        try:
            watch = StopWatch(req, _framework.seams().FINISH_MATCHED_STR)
        except Exception as exc:  # a bug: this request stays stock rather than fail
            logger.error("detok-plugin: request %s: stop strings stay SGLang's stock check: %r", req.rid, exc, exc_info=exc)
    req.__dict__[WATCH] = watch
    return watch


def _synced(req: Any) -> StopWatch | None:
    """The request's watch, fed every output id; None (and stock from now on) if it raised."""
    watch = _watch(req)
    if watch is None:
        return None
    try:
        watch.catch_up(req.output_ids)
    except _Restart:
        del req.__dict__[WATCH]
        return _synced(req)
    except Exception as exc:
        _hand_over(req, exc)
        return None
    return watch


def check_str_based_finish(self: Any, new_accepted_len: int = 1) -> bool:
    """``Req._check_str_based_finish``: whether a stop string completed in this step's ids."""
    watch = _synced(self)
    if watch is None:
        return _stock(_CHECK)(self, new_accepted_len)  # type: ignore[no-any-return]
    return watch.finish(self)


def check_match_stop_str_prefix(self: Any) -> bool:
    """``Req.check_match_stop_str_prefix``: hold the unsent ids while the stream holds a
    genuine partial stop (or a stop it completed, not yet reported)."""
    watch = _synced(self)
    if watch is None:
        return _stock(_PREFIX)(self)  # type: ignore[no-any-return]
    stream = watch.stream
    return bool(stream.held) or stream.finish_reason == "stop"


#: SGLang's own methods, read when ours went in (the hot path reads this dict only).
_STOCK: dict[str, Any] = {}


def _stock(name: str) -> Any:
    fn = _STOCK.get(name)
    if fn is None:  # not installed (called by hand), or uninstalled since
        req = _framework.seams().Req
        fn = PATCHES.stock(req, name) or getattr(req, name)
    return fn


def _hand_over(req: Any, exc: Exception) -> None:
    req.__dict__[WATCH] = None
    logger.error(
        "detok-plugin: request %s: the stop-string stream raised %r; SGLang's stock check serves the rest "
        "of this request (please report this with the traceback)",
        req.rid,
        exc,
        exc_info=exc,
    )


def _log_unknown_id(exc: TokenIdError) -> None:
    logger.warning("detok-plugin: %s; the text skips it, as the tokenizer's decode does", exc)


#: What we install, by name (one object each, so that ``is_ours`` can tell it).
OURS = {_CHECK: check_str_based_finish, _PREFIX: check_match_stop_str_prefix}


def install() -> bool:
    """Patch both methods of SGLang's ``Req``; returns whether they were not ours before."""
    req = _framework.seams().Req
    with PATCHES.lock:
        fresh = not all(PATCHES.is_ours(req, name) for name in OURS)
        for name, fn in OURS.items():
            if not PATCHES.is_ours(req, name):
                PATCHES.install(req, name, fn)
            _STOCK[name] = PATCHES.stock(req, name)
    return fresh


def uninstall() -> bool:
    req = _framework.seams().Req
    _STOCK.clear()
    return any([PATCHES.uninstall(req, name) for name in OURS])


def is_installed() -> bool:
    req = _framework.seams().Req
    return all(PATCHES.is_ours(req, name) for name in OURS)
