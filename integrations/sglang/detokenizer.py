"""SGLang's detokenizer step over one :class:`detok_plugin.ServingStream` per request.

SGLang's ``DetokenizerManager._decode_batch_token_id_output(recv_obj) -> list[str]`` turns
one batch of the scheduler's token ids into one text delta per request id (``rid``). The
first payload of a request carries up to 5 prompt ids as context (``read_offsets[i]`` of
them), then output ids; later payloads carry output ids only. Stock re-decodes a window per
step (twice, batched) and, on a finished request, cuts at the first occurrence of the
matched stop string (``finished_reasons[i]["matched"]``; kept with ``no_stop_trim``) or
drops a matched stop token.

Here each request's ids go through a ``ServingStream`` with the request's text flags and the
context ids as its prompt: each id's text leaves the moment its characters are complete,
once, and the finished request's last delta is what the full decode adds, cut at the stop as
stock cuts it (the same ``trim_matched_stop`` rules: a stop token dropped unless
``no_stop_trim`` or a tool-close token; a stop string cut at its first occurrence). The
streams live in a dictionary of the same capacity as stock's ``decode_status``
(the oldest evicted first) and leave it when the request finishes, as stock's states do.

What stays SGLang's: a request whose first payload carries text already decoded
(``decoded_texts[i]``), and a request whose stream raised (a bug: it is handed over to stock,
logged, with the text it already sent counted as sent). Nothing raises into SGLang's loop.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence
from typing import Any

from detok_plugin import ServingStream, TokenIdError

from ..common.patches import PATCHES
from . import _framework

__all__ = ["RequestText", "decode_batch_token_id_output", "install", "is_installed", "uninstall"]

logger = logging.getLogger("sglang.detok_plugin")

_SEAM = "_decode_batch_token_id_output"

#: The fields of ``BatchTokenIDOutput`` a step reads (and stock's step reads).
FIELDS = (
    "rids", "decoded_texts", "decode_ids", "read_offsets", "finished_reasons", "no_stop_trim",
    "skip_special_tokens", "spaces_between_special_tokens",
)


class RequestText:
    """One request's text: its stream, the context ids, and the pieces sent so far."""

    __slots__ = ("stream", "push", "taken", "context", "pieces")

    def __init__(self, tokenizer: Any, recv_obj: Any, i: int) -> None:
        ids = recv_obj.decode_ids[i]
        self.context = list(ids[: recv_obj.read_offsets[i]])
        self.stream = ServingStream.from_tokenizer(
            tokenizer,
            prompt_ids=self.context,
            skip_special_tokens=bool(recv_obj.skip_special_tokens[i]),
            spaces_between_special_tokens=bool(recv_obj.spaces_between_special_tokens[i]),
            stop=(),
            stop_token_ids=(),
            eos_token_ids=(),
            request_id=str(recv_obj.rids[i]),
            on_unknown_id=_log_unknown_id,
        )
        self.push = self.stream.push_text
        self.taken = self.stream.token_ids  # the output ids taken (the stream's own list)
        self.pieces: list[str] = []

    def step(self, ids: Sequence[int]) -> str:
        """A live request's ids: the text they complete."""
        push = self.push
        text = push(ids[0]) if len(ids) == 1 else "".join([push(i) for i in ids])
        if text:
            self.pieces.append(text)
        return text

    def close(self, manager: Any, ids: Sequence[int], reason: dict[str, Any], no_stop_trim: bool) -> str:
        """A finished request's last ids: the rest of its text, cut at the stop as stock cuts."""
        matched = reason.get("matched")
        if isinstance(matched, int) and len(ids) > 0:
            ids = manager.trim_matched_stop(list(ids), reason, no_stop_trim)  # drops the stop token, or keeps it
        sent = len(self.pieces)
        try:
            text = self.step(ids) if len(ids) > 0 else ""
            tail = self.stream.finish().text
        except Exception:
            del self.pieces[sent:]  # not sent: stock sends it (the hand-over)
            raise
        if not isinstance(matched, str):
            return text + tail
        sent_len = sum(map(len, self.pieces)) - len(text)
        whole = "".join(self.pieces) + tail
        pos = whole.find(matched)
        if pos < 0:
            return text + tail
        end = pos + len(matched) if no_stop_trim else pos
        return whole[sent_len:end] if end > sent_len else ""

    def stock_status(self, status_cls: Any, taken: int) -> Any:
        """Stock's ``DecodeStatus`` for this request as it stands: the context and the
        ``taken`` output ids, the text sent counted as sent (stock's own "pending" rule then
        sends only what is new)."""
        sent = "".join(self.pieces)
        return status_cls(
            decoded_text="",
            decode_ids=[*self.context, *self.stream.token_ids[:taken]],
            surr_offset=0,
            read_offset=len(self.context),
            sent_offset=len(sent),
        )


#: A request id handed to stock (its ``DecodeStatus`` is in stock's ``decode_status``).
_STOCK_SERVES: Any = object()

#: The manager's attribute that holds its texts, by rid (:class:`Texts`).
TEXTS = "_detok_plugin_texts"


class Texts(dict[str, Any]):
    """Texts by rid, evicted as stock evicts its ``decode_status`` (a ``LimitedCapacityDict``
    of ``SGLANG_DETOKENIZER_MAX_STATES``: at capacity, the oldest goes first); a plain dict
    underneath, whose ``get`` costs what a dict's does."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self and len(self) >= self.capacity:
            del self[next(iter(self))]
        super().__setitem__(key, value)


def _texts(manager: Any) -> Texts:
    texts = Texts(_framework.seams().max_states)
    setattr(manager, TEXTS, texts)
    return texts


def decode_batch_token_id_output(self: Any, recv_obj: Any) -> list[str]:
    """``DetokenizerManager._decode_batch_token_id_output``: one delta per rid, in order.
    The common row (one id of a live request the plugin serves) is taken inline: a batch
    of that one row here (a lightly loaded server steps one request), else in the loop of
    ``_rows``; every other row after it (``_slow_rows``)."""
    try:
        texts = self._detok_plugin_texts
    except AttributeError:
        texts = _texts(self)
    if len(recv_obj.rids) == 1:  # one request in the batch (a server under light load)
        text = texts.get(recv_obj.rids[0])
        ids = recv_obj.decode_ids[0]
        if text.__class__ is RequestText and recv_obj.finished_reasons[0] is None and len(ids) == 1:
            before = len(text.taken)
            try:
                piece = text.push(ids[0])
            except Exception as exc:
                _hand_over(self, texts, text, recv_obj, 0, exc, before)  # the loop below: stock's
            else:
                if piece:
                    text.pieces.append(piece)
                return [piece]
    return _rows(self, recv_obj, texts)


def _rows(manager: Any, recv_obj: Any, texts: Any) -> list[str]:
    """A batch's rows: the common one inline, every other after the loop."""
    out: list[str] = []  # its length is the row's index
    slow: list[int] | None = None
    for rid, ids, reason in zip(recv_obj.rids, recv_obj.decode_ids, recv_obj.finished_reasons):
        text = texts.get(rid)
        if text.__class__ is RequestText and reason is None and len(ids) == 1:
            before = len(text.taken)
            try:
                piece = text.push(ids[0])
            except Exception as exc:
                _hand_over(manager, texts, text, recv_obj, len(out), exc, before)
            else:
                if piece:
                    text.pieces.append(piece)
                out.append(piece)
                continue
        if slow is None:
            slow = []
        slow.append(len(out))
        out.append("")
    if slow is not None:
        _slow_rows(manager, recv_obj, texts, slow, out)
    return out


def _slow_rows(manager: Any, recv_obj: Any, texts: Any, rows: list[int], out: list[str]) -> None:
    """Every row the common step did not take: a new rid, several ids, a finished request,
    a request stock serves, a stream that raised (handed over)."""
    stock_rows: list[int] = []
    for i in rows:
        rid = recv_obj.rids[i]
        text = texts.get(rid)
        ids = recv_obj.decode_ids[i]
        if text is None and manager.tokenizer is not None:
            text = _open(manager.tokenizer, recv_obj, i, texts)
            ids = ids[recv_obj.read_offsets[i] :]
        if text is None or text is _STOCK_SERVES:
            if text is _STOCK_SERVES and recv_obj.finished_reasons[i] is not None:
                del texts[rid]
            stock_rows.append(i)
            continue
        before = len(text.taken)
        try:
            out[i] = _advance(manager, recv_obj, texts, text, ids, i)
        except Exception as exc:
            stock_rows.append(i)
            _hand_over(manager, texts, text, recv_obj, i, exc, before)
    if stock_rows:
        _fill_from_stock(manager, recv_obj, stock_rows, out)


def _advance(manager: Any, recv_obj: Any, texts: Any, text: RequestText, ids: Sequence[int], i: int) -> str:
    reason = recv_obj.finished_reasons[i]
    if reason is None:
        return text.step(ids)
    del texts[recv_obj.rids[i]]
    return text.close(manager, ids, reason, recv_obj.no_stop_trim[i])


def _open(tokenizer: Any, recv_obj: Any, i: int, texts: Any) -> Any:
    """A new rid's text; None where stock serves it (marked so in ``texts``)."""
    rid = recv_obj.rids[i]
    if recv_obj.decoded_texts[i]:  # text decoded before this detokenizer saw the request
        if recv_obj.finished_reasons[i] is None:
            texts[rid] = _STOCK_SERVES
        return None
    try:
        text = RequestText(tokenizer, recv_obj, i)
    except Exception as exc:  # a bug: this request stays stock rather than fail
        logger.error("detok-plugin: request %s stays SGLang's stock detokenizer: %r", rid, exc, exc_info=exc)
        if recv_obj.finished_reasons[i] is None:
            texts[rid] = _STOCK_SERVES
        return None
    texts[rid] = text
    return text


def _hand_over(manager: Any, texts: Any, text: RequestText, recv_obj: Any, i: int, exc: Exception, before: int) -> None:
    """The stream raised: stock's detokenizer serves the rest of this request, from the
    ``before`` output ids it took before this payload; this payload then goes through stock
    (``_fill_from_stock``)."""
    rid = recv_obj.rids[i]
    logger.error(
        "detok-plugin: request %s: the stream raised %r; SGLang's stock detokenizer serves the rest of this "
        "request (please report this with the traceback)",
        rid,
        exc,
        exc_info=exc,
    )
    manager.decode_status[rid] = text.stock_status(_framework.seams().DecodeStatus, before)
    if recv_obj.finished_reasons[i] is None:
        texts[rid] = _STOCK_SERVES


def _fill_from_stock(manager: Any, recv_obj: Any, rows: list[int], out: list[str]) -> None:
    """Stock's step for the rows it serves (a batch of those rows only), into ``out``."""
    if len(rows) == len(recv_obj.rids):
        out[:] = _stock(manager, recv_obj)
        return
    part = types.SimpleNamespace(**{name: [getattr(recv_obj, name)[i] for i in rows] for name in FIELDS})
    for i, text in zip(rows, _stock(manager, part)):
        out[i] = text


def _stock(manager: Any, recv_obj: Any) -> list[str]:
    fn = _STOCK.get(_SEAM)
    if fn is None:
        cls = _framework.seams().DetokenizerManager
        fn = PATCHES.stock(cls, _SEAM) or getattr(cls, _SEAM)
    return fn(manager, recv_obj)  # type: ignore[no-any-return]


_STOCK: dict[str, Any] = {}


def _log_unknown_id(exc: TokenIdError) -> None:
    # An id past the tokenizer: stock maps it to id 0 before decoding; the plugin renders it
    # as the tokenizer's decode does (nothing), logged.
    logger.warning("detok-plugin: %s; the text skips it, as the tokenizer's decode does", exc)


def install() -> bool:
    """Patch SGLang's detokenizer step; returns whether it was not ours before."""
    cls = _framework.seams().DetokenizerManager
    with PATCHES.lock:
        fresh = not PATCHES.is_ours(cls, _SEAM)
        if fresh:
            PATCHES.install(cls, _SEAM, decode_batch_token_id_output)
        _STOCK[_SEAM] = PATCHES.stock(cls, _SEAM)
    return fresh


def uninstall() -> bool:
    _STOCK.clear()
    return PATCHES.uninstall(_framework.seams().DetokenizerManager, _SEAM)


def is_installed() -> bool:
    return PATCHES.is_ours(_framework.seams().DetokenizerManager, _SEAM)
