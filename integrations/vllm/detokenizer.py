"""``VllmDetokenizer``: vLLM's per-request detokenizer contract over the core.

vLLM's ``OutputProcessor`` builds one detokenizer per request through
``IncrementalDetokenizer.from_new_request`` and then calls four things on it each engine
step::

    update(new_token_ids, stop_terminated) -> matched stop string | None
    get_next_output_text(finished, delta) -> str
    output_token_ids                        (list of the request's output ids)
    num_output_tokens() -> int

The plugin (``plugin.register``) makes that factory return a :class:`VllmDetokenizer` over a
:class:`detok_plugin.ServingStream`, or, when a ``detok_*`` chat parser asked for the
request's tags (``xargs``) and the request has stop strings, a
:class:`detok_plugin.TaggedServingStream`: stop strings then cut outside reasoning and tool-call
bodies only.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, TypeAlias

from detok_plugin import ServingStream, TaggedServingStream, TokenIdError

from ..common.patches import PATCHES
from . import _framework
from .handover import StockHandover
from .xargs import stream_tags

__all__ = ["VllmDetokenizer", "detokenizer_is_ours", "stock_detokenizer"]

logger = logging.getLogger("vllm.detok_plugin")

_Stream: TypeAlias = ServingStream | TaggedServingStream

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

    Setup: ``add_request`` builds this in O(1), the prompt unread (only an empty stop string
    is refused there); the stream opens on the prompt at the request's first ids, where stock
    vLLM's ``DecodeStream(ids=prompt)`` decodes the prompt too. A request aborted before its
    first id never opens one.

    Nothing raises into vLLM's loop: should the stream raise anyway (a bug), the request is
    handed over to vLLM's stock detokenizer, logged (``handover``); a stream that cannot
    open serves no id, and the request stays stock from its first id.
    """

    # What a step reads comes first.
    __slots__ = (
        "_live", "token_ids", "_stock", "_unsent", "_pieces", "_text", "_folded", "_delta_from",
        "_stop_terminated", "_closed", "_include_stop", "_stops", "_opened", "_tokenizer", "_request",
    )

    def __init__(self, tokenizer: Any, request: Any, *, delta: bool | None = None) -> None:
        # vLLM builds this in add_request and calls it first at the request's first engine
        # step: the stream is opened there (_open), which is where its work on the prompt
        # lands in stock vLLM too (DecodeStream(ids=prompt) decodes the prompt at its first
        # step). Here only what is O(1) and what refuses the request's options.
        params = request.sampling_params
        stop = params.stop
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if "" in stops:
            # The core refuses it too (a stop ends after one character at least), as vLLM's
            # SamplingParams does: refused here, the request stays stock from add_request on.
            raise ValueError(f"request {request.request_id}: an empty stop string never ends a stream")
        self._stops = stops
        self._include_stop = bool(params.include_stop_str_in_output)
        if delta is None:
            delta = getattr(params.output_kind, "name", None) == "DELTA"
        self._tokenizer = tokenizer  # kept for the opening and a cumulative call on a DELTA request
        self._request = request
        self._opened: _Stream | None = None  # the stream, from the request's first ids on
        self._live: _Stream | None = None  # the same while it serves (None after a hand-over)
        # The ids vLLM keeps: from the opening on, the stream's own list of the ids it took,
        # read here and never changed here; but for a stop token the stream is not fed, which
        # goes on a copy at the stream's end (see _push).
        self.token_ids: list[int] = []
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

    def _open(self) -> _Stream:
        """The request's stream on its prompt, at its first ids (or a read of ``path``).

        vLLM changes neither the request's sampling parameters nor its prompt after
        ``add_request``, but for a streaming-input (``resumable``) request, which stays stock
        (``plugin._from_new_request``): what is read here is what add_request was given.
        """
        request, stops = self._request, self._stops
        params = request.sampling_params
        # The verified table is cached per tokenizer object and the stop automaton per stop
        # tuple, so the opening is the prompt's decoder state.
        # A detok chat parser asked for its reasoning or tool tags (docs/vllm.md, "Chat
        # API"): then stop strings are cut outside reasoning (vllm-project/vllm#53066) and
        # tool-call bodies only. Without stop strings the tags change nothing (they and the
        # bodies stay in the text, which is the decode either way): the plain stream, whose
        # opening and common id cost less.
        tags = stream_tags(params) if stops else None
        stream = (
            functools.partial(TaggedServingStream.from_tokenizer, tags=tags)
            if tags is not None
            else ServingStream.from_tokenizer
        )(
            self._tokenizer,
            prompt_ids=request.prompt_token_ids or (),
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            stop=stops,
            stop_token_ids=(),
            eos_token_ids=(),
            include_stop_str_in_output=self._include_stop,
            min_tokens=params.min_tokens,
            request_id=request.request_id,
            on_unknown_id=_log_unknown_id,
        )
        self._opened = stream
        if self._stock is None:  # not when a read of ``path`` opens it after a hand-over
            self._live = stream
            self.token_ids = stream.token_ids
        return stream

    @property
    def _stream(self) -> _Stream:
        """The request's stream, opened now if no step has opened it yet."""
        stream = self._opened
        return self._open() if stream is None else stream

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
        stream = self._live
        if stream is not None and not stop_terminated and len(new_token_ids) == 1:
            # One id, no stop token: the stream's push_text (content only, no Delta built).
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
        """update() of a step with several ids or a stop token, the request's first ids,
        or a step after a hand-over."""
        if self._stock is not None:
            stop = self._stock.update(new_token_ids, stop_terminated)
            self.token_ids = self._stock.token_ids
            return stop
        if not new_token_ids:
            return None
        stream = self._live
        if stream is None:  # the request's first ids: its stream opens now
            try:
                stream = self._open()
            except Exception as exc:  # a stream that cannot open serves no id: stock serves all
                logger.error("detok-plugin: request %s stays stock: %r", self.request_id, exc, exc_info=exc)
                return self._to_stock(0, new_token_ids, stop_terminated)
            return self.update(new_token_ids, stop_terminated)
        before = len(self.token_ids)
        try:
            return self._push(stream, new_token_ids, stop_terminated)
        except Exception as exc:
            return self._hand_over(exc, before, new_token_ids, stop_terminated)

    def _push(self, stream: _Stream, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        self._stop_terminated = self._stop_terminated or stop_terminated
        unfed = stop_terminated and not self._include_stop
        fed = new_token_ids[:-1] if unfed else new_token_ids
        if fed:
            delta = stream.push(fed)
            if delta.text:
                self._keep(delta.text)
            if delta.finish_reason == "stop" and isinstance(delta.stop_reason, str):
                # vLLM keeps the ids up to the one completing the stop: the stream's list.
                return delta.stop_reason
        if unfed:
            # The stop token ends the request and is kept, but the stream was not fed it.
            self.token_ids = [*stream.token_ids, new_token_ids[-1]]
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
        stream = self._opened
        if stream is None or stream.finished:  # never opened: no id, no text
            return
        try:
            # vLLM's own detokenizer never releases a trailing U+FFFD: a character that
            # max_tokens or an abort cut shows as nothing there, and so here (docs/design.md).
            tail = stream.finish(drop_incomplete=True).text
        except Exception as exc:
            fed = len(stream.token_ids)  # all but a stop token not fed to it
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
        (``handover``), starting from the ids before the failing step, then that step.
        Text the stream released stays released, vLLM not yet given it or not."""
        _log_hand_over(self.request_id, exc)
        return self._to_stock(before, new_token_ids, stop_terminated)

    def _to_stock(self, before: int, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """vLLM's stock detokenizer, fed the first ``before`` ids, serves the rest from
        ``new_token_ids`` on, after the text the stream released."""
        self._live = None
        self._fold()
        if self._unsent is not None:  # DELTA: what was sent is not kept, only counted
            released, pending = "", self._unsent
        else:
            released, pending = self._text, self._text[self._delta_from :]
        self._unsent = None  # every later text call goes through _output_text
        tokenizer, request = self._tokenizer, self._request
        self._stock = StockHandover.start(
            lambda: stock_detokenizer(tokenizer, request),
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

def stock_detokenizer(tokenizer: Any, request: Any) -> Any:
    """vLLM's own detokenizer for ``request``, whether or not the plugin is installed."""
    cls = _framework.detokenizer_api()[0].IncrementalDetokenizer
    stock = PATCHES.stock(cls, "from_new_request")
    if stock is None:  # not installed (an adapter built by hand), or uninstalled since
        return cls.from_new_request(tokenizer, request)
    return stock.__func__(cls, tokenizer, request)


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


def detokenizer_is_ours() -> bool:
    """Whether vLLM's ``IncrementalDetokenizer.from_new_request`` is the plugin's right now
    (then requests' detokenizers read the tags a chat parser asks for)."""
    return PATCHES.is_ours(_framework.detokenizer_api()[0].IncrementalDetokenizer, "from_new_request")
