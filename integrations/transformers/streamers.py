"""``DetokStreamer``: transformers' ``TextStreamer`` contract over the core (see the package
docstring for why, and ``iterators`` for the queue-backed streamers)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from detok_plugin import Delta, DetokenizerState, TagSet, TokenIdError

from . import _framework

__all__ = ["DetokStreamer", "Reasoning"]

Reasoning = Literal["separate", "strip", "inline"]

# Stock TextStreamer's own message for batch input: a drop-in refuses with the same words.
BATCH_ERROR = "TextStreamer only supports batch size 1"
# Decode options the core reproduces from its token tables; anything else is honoured by
# calling the tokenizer's own decode (the core's generic path).
_CORE_DECODE_KWARGS = frozenset({"skip_special_tokens", "spaces_between_special_tokens"})
_log = logging.getLogger("detok_plugin.integrations.transformers")


class _DecodeWith:
    """A tokenizer view whose ``decode`` always applies the streamer's extra decode kwargs.

    The core reproduces ``skip_special_tokens`` (and ``spaces_between_special_tokens``)
    from its tables; any other decode option (``clean_up_tokenization_spaces=...``) is
    honoured by decoding with the tokenizer itself, which this view makes the core do:
    it has ``decode`` but no vocabulary, so the core takes its generic window path.
    """

    __slots__ = ("_tokenizer", "_kwargs", "clean_up_tokenization_spaces", "eos_token_id")

    def __init__(self, tokenizer: Any, kwargs: dict[str, Any]) -> None:
        self._tokenizer = tokenizer
        self._kwargs = kwargs
        self.clean_up_tokenization_spaces = bool(
            kwargs.get("clean_up_tokenization_spaces", getattr(tokenizer, "clean_up_tokenization_spaces", False))
        )
        self.eos_token_id = getattr(tokenizer, "eos_token_id", None)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text: str = self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, **self._kwargs)
        return text

    def __len__(self) -> int:
        return len(self._tokenizer)


def _merge(deltas: Sequence[Delta]) -> Delta:
    """One Delta for several pushes (the criteria may push before ``put`` arrives)."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    return Delta(
        "".join(d.text for d in deltas),
        "".join(d.reasoning for d in deltas),
        tuple(t for d in deltas for t in d.tool_calls),
        last.finish_reason,
        last.stop_reason,
        sum(d.consumed for d in deltas),
    )


class DetokStreamer:
    """``TextStreamer`` with exact, prompt text: prints each character when its token arrives.

    Same constructor and contract as ``transformers.TextStreamer``: ``generate()`` calls
    ``put`` with the prompt (2-D), then with each step's tokens, then ``end()``; the text
    goes to the overridable ``on_finalized_text(text, stream_end=False)``, once per ``put``
    (often ``""``) and once at ``end()``. Batch input (more than one row) raises the same
    ``ValueError`` as ``TextStreamer``. After ``end()`` the streamer is ready for another
    ``generate()``.

    What differs is the text: each ``put`` pushes its ids into one
    :class:`~detok_plugin.DetokenizerState`, so the joined text is exactly
    ``tokenizer.decode(ids, **decode_kwargs)`` (the generated ids alone with
    ``skip_prompt=True``, the prompt and the generated ids otherwise), each character
    leaves in the ``put`` of the token that completes it, and nothing is re-decoded.

    Optional, keyword-only: ``stop`` (strings that end the stream; the text from the stop
    on is cut; pair with :class:`DetokStopCriteria` to end ``generate()`` there too),
    ``tags`` (a :class:`~detok_plugin.TagSet` or preset name such as ``"qwen3"``) and
    ``reasoning`` (``"separate"``, ``"strip"`` or ``"inline"``, as in the core). Strings carry
    the content channel only: with ``tags`` and ``reasoning="separate"`` the reasoning and
    tool-call text reach :meth:`on_finalized_delta`, not ``on_finalized_text``.

    With ``tags`` and ``skip_prompt=True`` the prompt is given to the state as context, so
    a chat template that ends inside ``<think>`` starts the stream in reasoning. On a
    SentencePiece tokenizer the first character can then be the space that
    ``decode(generated ids)`` strips (the full decode keeps it).

    An id the tokenizer does not define (a model whose embedding is padded past the
    tokenizer samples one) renders as the decode renders it, ``""``, as stock goes on; the
    first of a stream is logged (WARNING). A negative id raises ``TokenIdError`` and a
    value that is no integer ``TokenTypeError``, where stock's decode fails too.
    """

    _state: DetokenizerState | None
    _prompt_len: int | None
    _seen: int
    _fed: int

    def __new__(cls, *args: Any, **kwargs: Any) -> DetokStreamer:
        # An instance of transformers' BaseStreamer too, where transformers is installed
        # (see _with_base_streamer): the class statement cannot name BaseStreamer, since
        # this module must import without transformers (the DETOK_PLUGIN start-up hook).
        # Made here: setting __class__ in __init__ cost twice as much per request.
        return object.__new__(_BASED.get(cls) or _with_base_streamer(cls))  # type: ignore[no-any-return]

    def __init__(
        self,
        tokenizer: Any,
        skip_prompt: bool = False,
        *,
        stop: str | Iterable[str] | None = (),
        tags: TagSet | str | None = None,
        reasoning: Reasoning = "separate",
        **decode_kwargs: Any,
    ) -> None:
        # The stock attributes, under their stock names.
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.decode_kwargs = decode_kwargs
        self.token_cache: list[int] = []  # the ids of the current stream (stock: since the last newline)
        self.print_len = 0  # characters released so far in the current stream
        self.next_tokens_are_prompt = True
        # Ours.
        self.stop: tuple[str, ...] = (stop,) if isinstance(stop, str) else tuple(stop or ())
        self.tags: TagSet | None = TagSet.preset(tags) if isinstance(tags, str) else tags
        self.reasoning: Reasoning = reasoning
        self.finish_reason: str | None = None  # "stop" once a stop string ended the stream
        self.stop_reason: str | int | None = None
        # Options the core cannot reproduce from its tables send every decode through the
        # tokenizer itself (the generic path), with all options but skip_special_tokens,
        # which the core passes on its own.
        if decode_kwargs and not _CORE_DECODE_KWARGS.issuperset(decode_kwargs):
            extra = {k: v for k, v in decode_kwargs.items() if k != "skip_special_tokens"}
            self._source: Any = _DecodeWith(tokenizer, extra)
        else:
            self._source = tokenizer
        self._options: dict[str, Any] = {
            "skip_special_tokens": bool(decode_kwargs.get("skip_special_tokens", False)),
            "spaces_between_special_tokens": bool(decode_kwargs.get("spaces_between_special_tokens", True)),
            "stop": self.stop,
            "tags": self.tags,
            "reasoning": reasoning,
            # generate() stops at EOS itself, and decode shows the EOS token's text unless
            # skip_special_tokens drops it: the stream must not treat EOS as a stop.
            "eos_token_ids": (),
        }
        # Open the first stream now: bad options fail here, not in generate()'s thread, and
        # the token table is built (and cached by the core) before the first token. The
        # first put() takes this state unless its prompt is context (see _open).
        self._ready: DetokenizerState | None = DetokenizerState.from_tokenizer(self._source, **self._options)
        self.path: str = self._ready.path
        self._reset()

    # --- the streamer protocol ---------------------------------------------------------

    def put(self, value: Any) -> None:
        """Receive the prompt (first call) or new token ids, and release the settled text."""
        shape = tuple(value.shape)
        if len(shape) > 1 and shape[0] > 1:
            raise ValueError(BATCH_ERROR)
        if self._prompt_len is not None:
            # Ids the stopping criteria already pushed (it sees each step first) are skipped.
            ids = _ids(value, shape)
            start = self._seen
            self._seen += len(ids)
            fresh = ids[max(0, self._fed - start) :]
            self._fed = max(self._fed, self._seen)
            self._push(fresh)
        elif self._open(value, shape):
            return  # a skipped prompt releases nothing
        self._release(stream_end=False)

    def end(self) -> None:
        """Release everything held (an incomplete tail as the decode renders it) and close."""
        state = self._state
        if state is not None and not state.finished:
            self._pending.append(state.finish())
        self._release(stream_end=True)
        self.token_cache = []
        self.print_len = 0
        self.next_tokens_are_prompt = True
        self._reset()

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        """Print the new text; at the end of the stream, also a newline (as ``TextStreamer``)."""
        print(text, flush=True, end="" if not stream_end else None)

    def on_finalized_delta(self, delta: Delta, stream_end: bool = False) -> None:
        """Typed hook: every release as a :class:`~detok_plugin.Delta`, once per ``put``.

        The default passes ``delta.text`` to :meth:`on_finalized_text`; override it to see
        reasoning and tool calls as well.
        """
        self.on_finalized_text(delta.text, stream_end)

    # --- internals ---------------------------------------------------------------------

    def _reset(self) -> None:
        self._state = None
        self._prompt_len = None
        self._seen = 0  # generated ids received through put()
        self._fed = 0  # generated ids pushed into the state (by put() or the criteria)
        self._pending: list[Delta] = []
        self._unknown_logged = False

    def _open(self, prompt: Any, shape: tuple[int, ...]) -> bool:
        """Start a stream at its first ``put``, the prompt; True when the prompt is skipped.

        The state the constructor opened serves the first stream unless the prompt is its
        context (``tags`` with ``skip_prompt``: a template may end inside ``<think>``), and a
        skipped prompt without ``tags`` is never copied out of its tensor: only its length
        is kept (where :class:`DetokStopCriteria` finds the generated ids)."""
        self._prompt_len = shape[-1] if shape else 1
        self.finish_reason = self.stop_reason = None
        skip = self.skip_prompt and self.next_tokens_are_prompt
        context = _ids(prompt, shape) if skip and self.tags is not None else ()
        state, self._ready = self._ready, None
        if state is None or context:
            state = DetokenizerState.from_tokenizer(self._source, prompt_ids=context, **self._options)
        self._state = state
        if skip:
            self.next_tokens_are_prompt = False
            return True
        # Not skipped: the prompt is the start of the stream's text.
        self._push(_ids(prompt, shape))
        return False

    def _push(self, ids: list[int]) -> None:
        while ids:
            state = self._state
            if state is None or state.finished:
                return  # after a stop string, later ids are cut (as the core does)
            try:
                self._took(state.push(ids), ids)
                return
            except TokenIdError as exc:
                if exc.token_id < 0:
                    raise  # stock's decode fails on it too (OverflowError)
                unknown = exc
            k = ids.index(unknown.token_id)  # the first bad id: the push applied none
            if k:
                self._took(state.push(ids[:k]), ids[:k])
            if not state.finished:
                self._unknown_id(unknown)
            ids = ids[k + 1 :]

    def _took(self, delta: Delta, ids: list[int]) -> None:
        self.token_cache.extend(ids[: delta.consumed])
        self._pending.append(delta)
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason

    def _unknown_id(self, exc: TokenIdError) -> None:
        """An id the tokenizer does not define (a padded vocabulary's): counted, rendered as
        the decode renders it (``""``), as stock ``TextStreamer`` goes on; logged once a stream."""
        self.token_cache.append(exc.token_id)
        if not self._unknown_logged:
            self._unknown_logged = True
            _log.warning("detok-plugin: %s; it renders as the decode renders it (later ones in this stream are not logged)", exc)

    def _release(self, *, stream_end: bool) -> None:
        delta = _merge(self._pending) if self._pending else Delta()
        self._pending = []
        self.print_len += len(delta.text)
        self.on_finalized_delta(delta, stream_end)

    def _sync(self, input_ids: Any) -> bool:
        """Push the ids in ``input_ids`` (batch, seq) that the state has not seen; True once
        a stop string has ended the stream. Called by :class:`DetokStopCriteria`."""
        if input_ids.shape[0] != 1:
            raise ValueError(BATCH_ERROR)
        if self._prompt_len is None:
            raise RuntimeError(
                "DetokStopCriteria saw tokens before its streamer saw the prompt: pass the "
                "same streamer to generate(streamer=...) as to DetokStopCriteria(streamer)"
            )
        state = self._state
        if state is not None and not state.finished:
            fresh = input_ids[0, self._prompt_len + self._fed :].tolist()
            self._fed += len(fresh)
            self._push(fresh)
        return self.finish_reason == "stop"


# inspect.signature(cls) reads a class's own __new__ before its __init__: through
# __wrapped__, DetokStreamer (and a subclass with no __init__ of its own) shows its
# constructor's arguments, not __new__'s (*args, **kwargs).
DetokStreamer.__new__.__wrapped__ = DetokStreamer.__init__  # type: ignore[attr-defined]


def _ids(value: Any, shape: tuple[int, ...]) -> list[int]:
    """The ids of one ``put``: its one row (``(1, n)``, checked by the caller), its
    ``(n,)`` ids, or the one id of a 0-d tensor, as a list."""
    ids = (value[0] if len(shape) > 1 else value).tolist()
    return [ids] if isinstance(ids, int) else ids


def _with_base_streamer(cls: type[Any]) -> type[Any]:
    """``cls``, or where transformers is installed a subclass of it and of transformers'
    ``BaseStreamer`` (same name and qualified name), so that ``isinstance(s, BaseStreamer)``
    holds for our streamers as for stock ones. One per class, made at its first instance;
    :meth:`DetokStreamer.__new__` makes every instance one of it: BaseStreamer adds nothing
    but its type (no slots, no state; its ``put``/``end`` come after ours)."""
    made = _BASED.get(cls)
    if made is None:
        base = _framework.base_streamer()
        if base is None or issubclass(cls, base):
            made = cls
        else:
            made = type(cls.__name__, (cls, base), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
        made = _BASED.setdefault(cls, made)
    return made


_BASED: dict[type[Any], type[Any]] = {}  # _with_base_streamer's classes; setdefault keeps one per class
