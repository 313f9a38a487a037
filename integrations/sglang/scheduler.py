"""Stop strings in SGLang's scheduler, over one :class:`detok_plugin.ServingStream` per request.

SGLang's scheduler checks stop strings on each request after every step
(``Req.update_finish_state`` calls ``Req._check_str_based_finish``) by decoding only the last
``len(encode(stop)) + 1`` output ids, with the tokenizer's default flags; and its output
streamer holds a streaming request's unsent ids while the tail of that decode ends with the
start of a stop (``Req.check_match_stop_str_prefix``). So a stop the model spells in more
tokens than its own encoding (one token per character, a CJK stop in byte tokens) is never
seen: it leaks into the text and generation runs on; and a stop visible only across a
special token the request skips is missed.

Here each request with stop strings gets a ``ServingStream`` (:func:`open_stream`) with the
request's stops and text flags (``skip_special_tokens``, ``spaces_between_special_tokens``)
and the prompt ids SGLang's detokenizer decodes before the output (its last
``INIT_INCREMENTAL_DETOKENIZATION_OFFSET``, 5), fed each output id once
(``ServingStream.watch``, ``ServingStream.follow``): the stop is looked for in the very text
the client is sent, and the setup costs the same for any prompt length.
``_check_str_based_finish`` sets SGLang's ``FINISH_MATCHED_STR(matched=stop)`` and
``finished_len`` (the ids through the one that completed the stop) exactly when the text
first contains a stop; the prefix check holds the ids while, and only while, the stream
holds a genuine partial stop.

The dispatch: the class methods (ours) run once per request, on its first call, and bind
the request's own callables on it (``Req`` has no ``__slots__``), so that SGLang's calls
from then on land on them directly, with no lookup. A request with stop strings gets, as
its check, the stream's own (``ServingStream.watch`` of its ``output_ids``): the common
steps (one new id that leaves the stream at rest, or whose partial-stop move the stream
remembers) are that one call, and every other step goes on to :func:`_bind`'s
``otherwise``, which follows the ids and sets SGLang's finish. A request with neither stop
strings nor stop regexes gets :func:`_no_stop` and :data:`_holds_nothing`, which answer
what stock's methods answer for it (False), without reading its sampling params every
step. The check runs after every append SGLang makes (``update_finish_state``, before the
output streamer asks the prefix check), so the prefix check reads the stream as the check
left it: while the stream holds nothing it is :data:`_holds_nothing` (``bool``, whose call
runs no Python frame); a step that leaves a partial stop held (or ends at a stop) puts
:data:`_holds_partial` in its place, and the step that leaves it holding nothing again
puts :data:`_holds_nothing` back (``otherwise``, or the check's ``holding`` on a step it
took). The bound callables hold the request's ``output_ids`` and reach the request itself
through a weak reference: no reference cycle, so a finished request is freed the moment
SGLang drops it, as stock's is.

What stays SGLang's: stop regexes (a request with one is stock's whole, through the class
methods), stop token ids, EOS, length and grammar. A request whose output SGLang cut (a
retraction that drops its output ids, or replaces its ``output_ids``) gets a fresh stream
fed the ids it has. A stream that raises (a bug) hands its request back to SGLang's stock
check, logged. Requests started before ``unregister()`` keep their callables until they end.
"""

from __future__ import annotations

import logging
import weakref
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
    """A request's first call: binds its own callables; returns its stream, None where
    SGLang's stock methods serve it (``WATCH`` says which, from then on)."""
    stream = None
    _unbind(req)
    params = req.sampling_params
    if params.stop_regex_strs or req.tokenizer is None:
        pass  # stock's whole: the class methods dispatch to stock's
    elif not params.stop_strs:
        req._check_str_based_finish = _no_stop
        req.check_match_stop_str_prefix = _holds_nothing
    else:
        try:
            stream = open_stream(req)
        except Exception as exc:  # a bug: this request stays stock rather than fail
            logger.error("detok-plugin: request %s: stop strings stay SGLang's stock check: %r", req.rid, exc, exc_info=exc)
        else:
            _bind(req, stream)
    setattr(req, WATCH, stream)
    return stream


def _no_stop(new_accepted_len: int = 1) -> bool:
    """A request without stop strings or stop regexes: no string ends it (stock's answer)."""
    return False


#: ``check_match_stop_str_prefix`` of a request whose stream holds nothing (or that has no
#: stop strings): nothing to hold. ``bool()`` is False, and a call of it runs no Python frame.
_holds_nothing = bool

#: ``check_match_stop_str_prefix`` after a step that left the stream holding a partial stop
#: (or ended at a stop): hold the ids, until a step leaves the stream holding nothing again
#: and puts :data:`_holds_nothing` back (the check's ``holding``, or the shim's ``otherwise``).
_holds_partial = True.__bool__


def _bind(req: Any, stream: ServingStream) -> None:
    """Put the request's own check and prefix check on it, over ``stream``: the check is the
    stream's own (:meth:`ServingStream.watch` of the request's ``output_ids``), which takes
    the common steps itself (telling ``holding`` when a partial stop begins or ends) and
    hands every other to :func:`_bind`'s ``otherwise``."""
    ref = weakref.ref(req)
    ids = req.output_ids
    follow = stream.follow

    def otherwise(new_accepted_len: int) -> bool:
        """Every step the stream's check did not take: the ids followed; True (and SGLang's
        finish set) when a stop completed."""
        owner: Any = ref()  # alive: SGLang is calling its method
        if owner.output_ids is not ids:  # SGLang replaced the output (a retraction)
            return _rewatch(owner, new_accepted_len)
        try:
            quiet = follow(ids)
        except Exception as exc:
            return _hand_over(owner, exc, new_accepted_len)
        if quiet:
            owner.check_match_stop_str_prefix = _holds_nothing  # (again, after a partial stop)
            return False
        return _settle(owner, stream, new_accepted_len)

    def holding(held: str) -> None:
        """The stream started or stopped holding on a step its check took itself."""
        owner: Any = ref()  # alive: SGLang is calling its method
        owner.check_match_stop_str_prefix = _holds_partial if held else _holds_nothing

    req._check_str_based_finish = stream.watch(ids, otherwise, holding)
    req.check_match_stop_str_prefix = _holds_nothing


def _unbind(req: Any) -> None:
    """The request's own callables gone: the class methods (ours, then stock's) serve it."""
    vars(req).pop(_CHECK, None)
    vars(req).pop(_PREFIX, None)


def _settle(req: Any, stream: ServingStream, new_accepted_len: int) -> bool:
    """The check after a step that left the stream not quiet: a stop completed (SGLang's
    finish set), a partial stop held (the prefix check holds the ids until a step leaves
    the stream quiet again), or the output cut by SGLang (a fresh stream, fed what is left)."""
    if len(req.output_ids) < len(stream.token_ids):
        return _rewatch(req, new_accepted_len)
    req.check_match_stop_str_prefix = _holds_partial
    if stream.finish_reason != "stop":
        return False
    req.finished_reason = _STOCK["FINISH_MATCHED_STR"](matched=stream.stop_reason)
    req.finished_len = len(stream.token_ids)
    return True


def _rewatch(req: Any, new_accepted_len: int) -> bool:
    """SGLang cut or replaced the request's output: a fresh stream, fed what it has."""
    if _watch(req) is None:
        return _STOCK[_CHECK](req, new_accepted_len)  # type: ignore[no-any-return]
    return req._check_str_based_finish(new_accepted_len)  # type: ignore[no-any-return]


def check_str_based_finish(self: Any, new_accepted_len: int = 1) -> bool:
    """``Req._check_str_based_finish`` on the class: a request's first call (which binds
    its own callables, then asks them) and the requests stock serves."""
    if WATCH not in vars(self):
        _watch(self)
        if _CHECK in vars(self):
            return self._check_str_based_finish(new_accepted_len)  # type: ignore[no-any-return]
    return _STOCK[_CHECK](self, new_accepted_len)  # type: ignore[no-any-return]


def check_match_stop_str_prefix(self: Any) -> bool:
    """``Req.check_match_stop_str_prefix`` on the class: as :func:`check_str_based_finish`."""
    if WATCH not in vars(self):
        stream = _watch(self)
        if stream is not None:  # asked before the check ever ran: the stream catches up
            try:
                stream.follow(self.output_ids)
            except Exception as exc:
                _hand_over(self, exc, 0)
                return _STOCK[_PREFIX](self)  # type: ignore[no-any-return]
            return bool(stream.held) or stream.finish_reason is not None
        if _PREFIX in vars(self):
            return self.check_match_stop_str_prefix()  # type: ignore[no-any-return]
    return _STOCK[_PREFIX](self)  # type: ignore[no-any-return]


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


def _hand_over(req: Any, exc: Exception, new_accepted_len: int) -> bool:
    """The stream raised: SGLang's stock methods serve the rest of the request (its own
    callables removed, ``WATCH`` None); stock's check of this step."""
    setattr(req, WATCH, None)
    _unbind(req)
    logger.error(
        "detok-plugin: request %s: the stop-string stream raised %r; SGLang's stock check serves the rest "
        "of this request (please report this with the traceback)",
        req.rid,
        exc,
        exc_info=exc,
    )
    return _STOCK[_CHECK](req, new_accepted_len)  # type: ignore[no-any-return]


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
