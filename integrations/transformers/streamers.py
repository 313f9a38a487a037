"""``DetokStreamer``: transformers' ``TextStreamer`` contract over the core (see the package
docstring for why, and ``iterators`` for the queue-backed streamers)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol, get_args

from detok_plugin import Delta, DetokenizerState, ServingStream, TagSet, TokenIdError, build_table

from . import _framework

__all__ = ["DetokStreamer", "Reasoning"]

Reasoning = Literal["separate", "strip", "inline"]

# Stock TextStreamer's own message for batch input: a drop-in refuses with the same words.
BATCH_ERROR = "TextStreamer only supports batch size 1"
# Decode options the core reproduces from its token tables; anything else is honoured by
# calling the tokenizer's own decode (the core's generic path).
_CORE_DECODE_KWARGS = frozenset({"skip_special_tokens", "spaces_between_special_tokens"})
_log = logging.getLogger("detok_plugin.integrations.transformers")
_NOTHING = Delta()  # a put that released nothing
_REASONINGS: tuple[str, ...] = get_args(Reasoning)


class _Stream(Protocol):
    """What a streamer asks of its stream: ``ServingStream`` (content only, the common
    case) or, with ``tags``, ``DetokenizerState`` (reasoning and tool calls as well)."""

    @property
    def finished(self) -> bool: ...

    finish_reason: Any
    stop_reason: str | int | None

    def push(self, ids: list[int]) -> Delta: ...

    def push_text(self, token_id: int) -> str: ...

    def finish(self) -> Delta: ...


class _UnknownIds:
    """One stream's ``on_unknown_id``: an id the tokenizer does not define renders as the
    decode renders it (``""``), the first of a stream logged (WARNING); a negative id
    raises, as stock's decode fails on it too (``OverflowError``)."""

    __slots__ = ("logged",)

    def __init__(self) -> None:
        self.logged = False

    def __call__(self, exc: TokenIdError) -> None:
        if exc.token_id < 0:
            raise exc
        if not self.logged:
            self.logged = True
            _log.warning("detok-plugin: %s; it renders as the decode renders it (later ones in this stream are not logged)", exc)


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


def _merge(first: Delta, then: Delta) -> Delta:
    """One Delta for two pushes' (the criteria may push before ``put`` arrives)."""
    return Delta(
        first.text + then.text,
        first.reasoning + then.reasoning,
        first.tool_calls + then.tool_calls,
        then.finish_reason,
        then.stop_reason,
        first.consumed + then.consumed,
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

    # What a stream starts with, as class attributes: read until a stream sets its own (a
    # streamer is built per request, and most of these are never set before its first id).
    finish_reason: str | None = None  # "stop" once a stop string ended the stream
    stop_reason: str | int | None = None
    _state: _Stream | None = None  # the stream's state, once opened (_start)
    _ready: _Stream | None = None  # a state the constructor opened, for the first stream
    _prompt_len: int | None = None  # set by the first put (the prompt)
    _seen = 0  # generated ids received through put()
    _fed = 0  # generated ids pushed into the state (by put() or the criteria)
    _pending: Delta | None = None  # what was pushed since the last release released
    _skip_special = False  # decode_kwargs' skip_special_tokens
    _spaces_between = True  # decode_kwargs' spaces_between_special_tokens

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
        if reasoning not in _REASONINGS:
            raise ValueError(f"reasoning must be 'separate', 'strip' or 'inline', not {reasoning!r}")
        self.reasoning: Reasoning = reasoning
        self._source: Any = tokenizer
        if decode_kwargs:
            self._skip_special = bool(decode_kwargs.get("skip_special_tokens", False))
            self._spaces_between = bool(decode_kwargs.get("spaces_between_special_tokens", True))
            # Options the core cannot reproduce from its tables send every decode through
            # the tokenizer itself (the generic path), with all options but
            # skip_special_tokens, which the core passes on its own.
            if not _CORE_DECODE_KWARGS.issuperset(decode_kwargs):
                extra = {k: v for k, v in decode_kwargs.items() if k != "skip_special_tokens"}
                self._source = _DecodeWith(tokenizer, extra)
        # The token table is built (and cached by the core) here, before the first token.
        table = build_table(self._source)[0]
        self.path: str = "generic" if table is None else table.family
        # Bad options fail here, not in generate()'s thread: a stream is opened with options
        # (stop strings, tags) no stream has opened with yet, and on the generic path (the
        # tokenizer itself is checked there); the first request takes that stream. Options
        # that opened once cannot fail on a table, so those streams open at their first
        # token: what a stream needs is known there (_start), and a streamer built and never
        # fed (or only its prompt, skipped) opens none.
        if table is None or not _opened_before((self.stop, self.tags)):
            self._ready = self._new_stream(())
            _remember((self.stop, self.tags))

    # --- the streamer protocol ---------------------------------------------------------

    def put(self, value: Any) -> None:
        """Receive the prompt (first call) or new token ids, and release the settled text."""
        shape = value.shape  # a tuple (torch.Size is one): not copied
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
            self._add(state.finish())
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
        self._seen = self._fed = 0
        self._pending = None

    def _new_stream(self, context: Sequence[int]) -> _Stream:
        """A stream with the streamer's options; with ``tags``, after ``context`` (the
        skipped prompt). generate() stops at EOS itself, and decode shows the EOS token's
        text unless skip_special_tokens drops it: the stream must not treat EOS as a stop."""
        self._unknown = _UnknownIds()
        if self.tags is None:
            # Content only: ServingStream, DetokenizerState's content at a serving loop's cost.
            return ServingStream.from_tokenizer(
                self._source, skip_special_tokens=self._skip_special, spaces_between_special_tokens=self._spaces_between,
                stop=self.stop, eos_token_ids=(), on_unknown_id=self._unknown,
            )
        return DetokenizerState.from_tokenizer(
            self._source, prompt_ids=context, skip_special_tokens=self._skip_special,
            spaces_between_special_tokens=self._spaces_between, stop=self.stop, tags=self.tags,
            reasoning=self.reasoning, eos_token_ids=(),
        )

    def _start(self, context: Sequence[int] = ()) -> _Stream:
        """The stream's state: the one the constructor opened, unless the prompt is its
        context; else a new one."""
        state, self._ready = self._ready, None
        if state is None or context:
            state = self._new_stream(context)
        self._state = state
        return state

    def _open(self, prompt: Any, shape: tuple[int, ...]) -> bool:
        """Start a stream at its first ``put``, the prompt; True when the prompt is skipped.

        A skipped prompt is context only with ``tags`` (a template may end inside
        ``<think>``): then the state opens here, after it. Otherwise a skipped prompt is
        never copied out of its tensor (only its length is kept, where
        :class:`DetokStopCriteria` finds the generated ids) and the state opens at the
        first generated id."""
        self._prompt_len = shape[-1] if shape else 1
        self.finish_reason = self.stop_reason = None
        if self.skip_prompt and self.next_tokens_are_prompt:
            self.next_tokens_are_prompt = False
            if self.tags is not None:
                self._start(_ids(prompt, shape))
            return True
        # Not skipped: the prompt is the start of the stream's text.
        self._push(_ids(prompt, shape))
        return False

    def _push(self, ids: list[int]) -> None:
        state = self._state
        if state is None:
            state = self._start()
        if len(ids) == 1 and self.tags is None:
            if not state.finished:
                self._took_one(state, ids[0])
            return
        while ids:
            if state.finished:
                return  # after a stop string, later ids are cut (as the core does)
            try:
                self._took(state.push(ids), ids)
                return
            except TokenIdError as exc:  # DetokenizerState's (ServingStream calls _unknown)
                self._unknown(exc)  # a negative id raises
                unknown = exc
            k = ids.index(unknown.token_id)  # the first bad id: the push applied none
            if k:
                self._took(state.push(ids[:k]), ids[:k])
            if not state.finished:
                self.token_cache.append(unknown.token_id)  # counted, rendered as ""
            ids = ids[k + 1 :]

    def _took_one(self, state: _Stream, token_id: int) -> None:
        """One id (a step's: the common put) on a content-only stream: its text alone
        (``push_text``; an unknown id's is ``""``, a negative one raises), in a Delta built
        as the tuple it is (``Delta(...)`` goes through a Python ``__new__``)."""
        text = state.push_text(token_id)
        if state.finish_reason is None and self._pending is None:
            self.token_cache.append(token_id)
            self._pending = Delta._make((text, "", (), None, None, 1))
        else:
            self._took(Delta(text, finish_reason=state.finish_reason, stop_reason=state.stop_reason, consumed=1), [token_id])

    def _took(self, delta: Delta, ids: list[int]) -> None:
        self.token_cache.extend(ids[: delta.consumed])
        self._add(delta)
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason

    def _add(self, delta: Delta) -> None:
        self._pending = delta if self._pending is None else _merge(self._pending, delta)

    def _release(self, *, stream_end: bool) -> None:
        delta = _NOTHING if self._pending is None else self._pending
        self._pending = None
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
        if state is None or not state.finished:  # None: no id yet (_push opens it)
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


def _opened_before(options: tuple[Any, ...]) -> bool:
    """A stream opened with these options (stop strings, tags) on a table: they cannot fail
    another one (nothing else a streamer passes can, on a table). Unhashable options never
    opened: the core refuses them, with its own error."""
    try:
        return options in _OPENED
    except TypeError:
        return False


def _remember(options: tuple[Any, ...]) -> None:
    if len(_OPENED) >= 256:  # option sets never seen before, streamer after streamer
        _OPENED.clear()
    _OPENED.add(options)  # hashable: the core opened a stream with them


_OPENED: set[tuple[Any, ...]] = set()  # the option sets _opened_before knows
