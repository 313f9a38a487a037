"""Stop strings in SGLang's scheduler, over one :class:`detok_plugin.ServingStream` per request.

SGLang's scheduler checks stop strings on each request after every step
(``Req.update_finish_state`` calls ``Req._check_str_based_finish``) by decoding only the last
``len(encode(stop)) + 1`` output ids, with the tokenizer's default flags; and its output
streamer holds a streaming request's unsent ids while the tail of that decode ends with the
start of a stop (``Req.check_match_stop_str_prefix``). So a stop the model spells in more
tokens than its own encoding (one token per character, a CJK stop in byte tokens) is never
seen: it leaks into the text and generation runs on; and a stop visible only across a
special token the request skips is missed.

Here each request with stop strings gets a ``ServingStream`` (:func:`open_stream`, on the
request's first check, kept on the request) with the request's stops and text flags
(``skip_special_tokens``, ``spaces_between_special_tokens``) and the prompt ids SGLang's
detokenizer decodes before the output (its last ``INIT_INCREMENTAL_DETOKENIZATION_OFFSET``,
5), fed each output id once: the stop is looked for in the very text the client is sent, and
the setup costs the same for any prompt length. ``_check_str_based_finish`` sets SGLang's
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

__all__ = ["check_match_stop_str_prefix", "check_str_based_finish", "install", "open_stream", "uninstall"]

logger = logging.getLogger("sglang.detok_plugin")

#: The request attribute that holds its watch (None: SGLang's stock check serves it).
WATCH = "_detok_plugin_stops"

_CHECK = "_check_str_based_finish"
_PREFIX = "check_match_stop_str_prefix"


def open_stream(req: Any) -> ServingStream:
    """A request's stop stream: its stops, its text flags, the prompt ids its text follows."""
    params = req.sampling_params
    prompt = req.origin_input_ids_unpadded or ()
    start = max(len(prompt) - _framework.seams().context, 0)  # what SGLang's detokenizer decodes
    return ServingStream.from_tokenizer(
        req.tokenizer,
        prompt_ids=prompt[start:],
        skip_special_tokens=bool(params.skip_special_tokens),
        spaces_between_special_tokens=bool(params.spaces_between_special_tokens),
        stop=tuple(params.stop_strs),
        stop_token_ids=(),
        eos_token_ids=(),
        request_id=str(req.rid),
        on_unknown_id=_log_unknown_id,
    )


def _watch(req: Any) -> ServingStream | None:
    """A request's first call: its stream, or None where SGLang's stock check serves it."""
    stream = None
    params = req.sampling_params
    if params.stop_strs and not params.stop_regex_strs and req.tokenizer is not None:
        try:
            stream = open_stream(req)
        except Exception as exc:  # a bug: this request stays stock rather than fail
            logger.error("detok-plugin: request %s: stop strings stay SGLang's stock check: %r", req.rid, exc, exc_info=exc)
    setattr(req, WATCH, stream)
    return stream


def _catch_up(req: Any, stream: ServingStream) -> ServingStream | None:
    """``stream`` fed every output id it has not taken (none once a stop completed); the
    request's stream from now on: a fresh one where SGLang dropped output ids (a retracted
    request), None (stock from now on) if it raised."""
    ids = req.output_ids
    try:
        if len(ids) < len(stream.token_ids) and stream.finish_reason is None:
            fresh = _watch(req)
            return None if fresh is None else _catch_up(req, fresh)
        push = stream.push_text
        for i in range(len(stream.token_ids), len(ids)):
            if stream.finish_reason is not None:
                break
            push(ids[i])
    except Exception as exc:
        _hand_over(req, exc)
        return None
    return stream


def check_str_based_finish(self: Any, new_accepted_len: int = 1) -> bool:
    """``Req._check_str_based_finish``: whether a stop string completed in this step's ids
    (then SGLang's ``FINISH_MATCHED_STR`` and ``finished_len`` are set, as stock sets them)."""
    stream: ServingStream | None
    try:
        stream = self._detok_plugin_stops
    except AttributeError:
        stream = _watch(self)
    if stream is None:  # no stop strings, a stop regex, no tokenizer: stock's check
        return _STOCK[_CHECK](self, new_accepted_len)  # type: ignore[no-any-return]
    ids = self.output_ids
    taken = stream.token_ids
    if len(ids) == len(taken) + 1 and stream.finish_reason is None:  # the common step: one new id
        try:
            stream.push_text(ids[-1])
        except Exception as exc:
            _hand_over(self, exc)
            return _STOCK[_CHECK](self, new_accepted_len)  # type: ignore[no-any-return]
    elif len(ids) != len(taken):
        caught = _catch_up(self, stream)
        if caught is None:
            return _STOCK[_CHECK](self, new_accepted_len)  # type: ignore[no-any-return]
        stream = caught
    if stream.finish_reason != "stop":
        return False
    self.finished_reason = _STOCK["FINISH_MATCHED_STR"](matched=stream.stop_reason)
    self.finished_len = len(stream.token_ids)
    return True


def check_match_stop_str_prefix(self: Any) -> bool:
    """``Req.check_match_stop_str_prefix``: hold the unsent ids while the stream holds a
    genuine partial stop (or a stop it completed, not yet reported)."""
    stream: ServingStream | None
    try:
        stream = self._detok_plugin_stops
    except AttributeError:
        stream = _watch(self)
    if stream is not None and len(self.output_ids) != len(stream.token_ids) and stream.finish_reason is None:
        stream = _catch_up(self, stream)
    if stream is None:
        return _STOCK[_PREFIX](self)  # type: ignore[no-any-return]
    return stream.held != "" or stream.finish_reason is not None


class _StockMethods(dict[str, Any]):
    """SGLang's own methods, read when ours went in (the hot path reads this dict only);
    read from the class where ours were never installed (called by hand)."""

    def __missing__(self, name: str) -> Any:
        seams = _framework.seams()
        if name == "FINISH_MATCHED_STR":
            self[name] = seams.FINISH_MATCHED_STR
            return seams.FINISH_MATCHED_STR
        return PATCHES.stock(seams.Req, name) or getattr(seams.Req, name)


_STOCK = _StockMethods()


def _stock(name: str) -> Any:
    return _STOCK[name]


def _hand_over(req: Any, exc: Exception) -> None:
    setattr(req, WATCH, None)
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
        _STOCK["FINISH_MATCHED_STR"] = _framework.seams().FINISH_MATCHED_STR
    return fresh


def uninstall() -> bool:
    req = _framework.seams().Req
    _STOCK.clear()
    return any([PATCHES.uninstall(req, name) for name in OURS])


def is_installed() -> bool:
    req = _framework.seams().Req
    return all(PATCHES.is_ours(req, name) for name in OURS)
