"""The TGI shim inside TGI's step: the criteria subclass and the ``generate_token`` wrapper.

Nothing here imports TGI: :func:`criteria_class` takes TGI's ``StoppingCriteria`` as the
base, and :func:`wrap_generate_token` takes a stock ``generate_token``. ``patching.install()``
puts them in place. What one step does, for the requests whose criteria are ours:

1. :func:`prepare` (before the stock step): a request seen for the first time gets its
   stream, built from the prompt ids its batch holds; on failure it stays stock (logged
   once). It returns ``{request id: criteria}`` for the step.
2. The stock step calls the criteria once per id (several with speculation, stopping at
   the first that ends the request): the criteria is the request's :class:`RequestText`,
   which counts ``current_tokens`` as stock does and asks the stream whether the id ends
   the request, and why.
3. :func:`rewrite` (after it): each ``Generation`` of ours gets the texts of its ids,
   ``is_special`` only where a special id's text is ``""`` (the chat stream drops a special
   token's text), and, when the request ended, ``generated_text.text`` = the joined texts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ._framework import STOCK_ATTR, log
from .request import RequestText, Settings, open_stream

__all__ = ["criteria_class", "prepare", "prompt_of", "rewrite", "wrap_generate_token"]

#: Marks a wrapped ``generate_token`` and keeps the stock one.


class _Ours(RequestText):
    """What the criteria subclass adds to TGI's ``StoppingCriteria`` (see :func:`criteria_class`).

    The criteria *is* the request's :class:`RequestText`: TGI's step calls it per id and
    :class:`RequestText`'s ``__call__`` answers, one Python call over the core's. Its
    ``stream`` is ``None`` until the first step builds it, and for good when the request is
    stock (it could not be built, or the core raised: logged); then TGI's own
    ``__call__`` answers. ``detok_pending`` is True until that first step tried.
    """

    # Set by criteria_class on the subclass.
    _stock_call: Callable[..., tuple[bool, int | None]]
    settings: Settings
    # Ours, per instance (from_stock).
    detok_pending: bool
    detok_stops: tuple[str, ...]
    detok_tokenizer: Any
    detok_id: Any  # the request's id (TGI's Request.id), set by prepare
    # TGI's, per instance (copied from the stock instance).
    eos_token_ids: set[int]
    ignore_eos_token: bool

    def _without_stream(self, last_token: Any, last_output: str) -> tuple[bool, int | None]:
        return self._stock_call(last_token, last_output)  # a stock request

    def _failed(self, exc: Exception, last_token: Any, last_output: str) -> tuple[bool, int | None]:
        # never raise in TGI's loop: this request goes on stock
        log("ERROR", f"detok-plugin: request {self.request_id}: {exc!r}; it goes on with TGI's stock text")
        self.stream = None
        return self._stock_call(last_token, last_output)

    def detok_build(self, prompt_ids: list[int], request_id: Any) -> None:
        """Build this request's stream (step 1); a failure leaves it stock, logged."""
        self.detok_pending = False
        eos = () if self.ignore_eos_token else tuple(self.eos_token_ids)
        try:
            stream = open_stream(
                self.detok_tokenizer,
                prompt_ids,
                stop_sequences=self.detok_stops,
                eos_token_ids=eos,
                settings=self.settings,
                request_id=str(request_id),
            )
        except Exception as exc:
            log("WARNING", f"detok-plugin: request {request_id} stays stock: {exc!r}")
        else:
            self._start(stream, str(request_id))
        self.detok_id = request_id
        self.detok_tokenizer = None  # the stream holds what it needs


def criteria_class(base: type, settings: Settings) -> type:
    """TGI's ``StoppingCriteria`` with the core behind ``__call__`` (an instance of ``base``).

    Built from a stock instance by :meth:`from_stock`, so TGI's own ``from_pb`` keeps
    deciding the counters and EOS ids; the subclass adds the request's text.
    """

    def from_stock(cls: Any, stock: Any, stops: tuple[str, ...], tokenizer: Any) -> Any:
        self = cls.__new__(cls)
        fields = dict(stock.__dict__)
        # TGI's counters live in RequestText's slots (no stale copy in __dict__).
        self.current_tokens = fields.pop("current_tokens")
        self.max_new_tokens = fields.pop("max_new_tokens")
        self.__dict__.update(fields)
        self.stream = None
        self.request_id = None
        self.detok_pending = True
        self.detok_stops = stops
        self.detok_tokenizer = tokenizer
        self.detok_id = None
        return self

    return type(
        "DetokStoppingCriteria",
        (_Ours, base),
        {
            "__module__": "detok_plugin.integrations.tgi",
            "__doc__": f"TGI's StoppingCriteria with detok-plugin's text. {_Ours.__doc__}",
            "_stock_call": base.__call__,
            "settings": settings,
            "from_stock": classmethod(from_stock),
        },
    )


def prompt_of(batch: Any, i: int) -> list[int]:
    """The prompt ids of request ``i`` as its batch holds them before its first step.

    Causal, Mamba and Idefics batches keep a left-padded column per request
    (``all_input_ids[i]``, the last ``input_lengths[i]`` are the prompt); flash batches a
    list; seq2seq batches the decoder's ids (``all_decoder_input_ids``).
    """
    ids = getattr(batch, "all_decoder_input_ids", None)
    lengths = getattr(batch, "decoder_input_lengths", None)
    if ids is None:
        ids, lengths = batch.all_input_ids, getattr(batch, "input_lengths", None)
    row = ids[i]
    if isinstance(row, list):
        return list(row)
    flat: list[int] = row.reshape(-1).tolist()
    if lengths is not None:
        flat = flat[len(flat) - int(lengths[i]):]
    return flat


def prepare(batch: Any, cls: Any) -> dict[Any, Any]:
    """Step 1: build new requests' streams; ``{request id: criteria}`` for ours.

    The common step (every request ours and built) is one comprehension; a request seen
    for the first time, or one that is stock, sends the step through the loop."""
    criterias = batch.stopping_criterias
    ours = {c.detok_id: c for c in criterias if c.__class__ is cls and c.stream is not None}
    if len(ours) == len(criterias):
        return ours
    criteria: Any
    for i, criteria in enumerate(criterias):
        if criteria.__class__ is not cls or not criteria.detok_pending:
            continue
        request_id = batch.requests[i].id  # a request's first step
        try:
            prompt = prompt_of(batch, i)
        except Exception as exc:
            criteria.detok_pending = False
            log("WARNING", f"detok-plugin: request {request_id} stays stock: no prompt ids ({exc!r})")
            continue
        criteria.detok_build(prompt, request_id)
        if criteria.stream is not None:
            ours[request_id] = criteria
    return ours


def rewrite(generations: list[Any], ours: dict[Any, Any]) -> None:
    """Step 3: the core's texts into each of our requests' ``Generation``.

    A request's texts for this step are those its criteria took since the last step
    (``texts[sent:]``). The common record, one id, gets its text in place in the list
    TGI's step built for that record alone. ``is_special`` is rebuilt only where a special
    id carries text (rare: a special id's own text is ``""``; it carries text only when
    releasing what was held), so most steps keep TGI's list as it is."""
    get = ours.get
    for generation in generations:
        criteria = get(generation.request_id)
        if criteria is None or criteria.stream is None:
            continue
        tokens = generation.tokens
        sent, mine, theirs = criteria.sent, criteria.texts, tokens.texts
        if len(mine) == sent + 1 and len(theirs) == 1 == len(tokens.token_ids):
            criteria.sent = sent + 1
            theirs[0] = text = mine[sent]
            if text and tokens.is_special[0]:
                tokens.is_special = [False]
        elif not _rewrite_several(generation, criteria):
            continue
        if generation.generated_text is not None:
            generation.generated_text.text = criteria.text


def _rewrite_several(generation: Any, criteria: Any) -> bool:
    """:func:`rewrite` of a record with several ids (a speculative step), or whose count
    of ids disagrees with the texts taken (logged; TGI's texts stay): whether it was
    rewritten."""
    texts = criteria.texts[criteria.sent :]
    criteria.sent += len(texts)
    tokens = generation.tokens
    if len(texts) != len(tokens.token_ids):
        log("ERROR", f"detok-plugin: request {generation.request_id}: {len(texts)} texts for "
            f"{len(tokens.token_ids)} ids; the step keeps TGI's texts")
        return False
    tokens.texts = texts
    if True in tokens.is_special and any(texts):
        tokens.is_special = [special and not text for special, text in zip(tokens.is_special, texts)]
    return True


def wrap_generate_token(stock: Callable[..., Any], cls: type) -> Callable[..., Any]:
    """``stock`` with steps 1 and 3 around it; never raises more than ``stock`` does."""

    @functools.wraps(stock)
    def generate_token(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            ours = prepare(batch, cls)
        except Exception as exc:
            log("ERROR", f"detok-plugin: {exc!r} before a step; the step's texts are TGI's")
            ours = {}
        result = stock(self, batch, *args, **kwargs)
        if ours:
            try:
                rewrite(result[0], ours)
            except Exception as exc:
                log("ERROR", f"detok-plugin: {exc!r} after a step; the step's texts are TGI's")
        return result

    setattr(generate_token, STOCK_ATTR, stock)
    return generate_token
