"""One TGI request's text, as the core renders it: the part of the TGI shim that needs no TGI.

TGI's server asks two things of a request's text each step: the text of each new id (for
the stream) and, when the request ends, its whole text (``GeneratedText.text``); and it
asks its ``StoppingCriteria`` whether an id ends the request, and why (a ``FinishReason``).
:class:`RequestText` answers all three from one :class:`detok_plugin.ServingStream`:

1. ``push(id)`` takes one generated id and returns ``None`` while the request goes on, or
   TGI's finish code when it ends: a stop string completed (``FINISH_STOP_SEQUENCE``, also
   for a stop equal to a special token's text, matched on that token's id), an EOS id
   (``FINISH_EOS_TOKEN``, unless the request ignores EOS), or the ``max_new_tokens``-th id
   (``FINISH_LENGTH``; a stop or EOS on that same id wins, as the text shows).
2. ``texts`` holds the text of each id pushed, one per id; the last id of a request carries
   what ending released (a held partial stop that did not complete, bytes of an unfinished
   character rendered as the decode renders them). ``sent`` counts those the shim's step
   has already written into TGI's records (``step.rewrite``).
3. ``text`` is the joined texts: exactly ``decode(prompt + out)[len(decode(prompt)):]``
   with ``skip_special_tokens=True``, cut before the stop string (or, with
   ``keep_stop=True``, after it; never what follows it).

Nothing here raises on an id the tokenizer does not know: it is logged and renders as the
tokenizer's decode renders it (TGI's loop must not raise: a RuntimeError kills the shard).

>>> from detok_plugin import TokenTable
>>> table = TokenTable("byte_level", (b"\\xf0\\x9f", b"\\xab", b"\\xa8", b"Hi", b" ###"), frozenset())
>>> r = RequestText.build(table, (), stop_sequences=["###"], eos_token_ids=(), max_new_tokens=20)
>>> [r.push(i) for i in (3, 0, 1, 2, 4)] == [None, None, None, None, FINISH_STOP_SEQUENCE]
True
>>> r.texts, r.text
(['Hi', '', '', '🫨', ' '], 'Hi🫨 ')
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from detok_plugin import DetokenizerState, ServingStream, TagSet, TokenIdError

from ..common.switch import Switch
from ._framework import FINISH_EOS_TOKEN, FINISH_LENGTH, FINISH_STOP_SEQUENCE, log

__all__ = ["RequestText", "Settings", "open_stream", "special_stop_ids"]

_STOP_MODES = {"exclude": False, "keep": True}


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """The TGI shim's settings, read from the environment in one place (:meth:`from_env`).

    ``enabled``: ``DETOK_PLUGIN=1`` (``true``/``yes``/``on``). ``keep_stop``:
    ``DETOK_TGI_STOP=keep`` keeps a matched stop string at the end of the text (default
    ``exclude``: cut before it, as OpenAI and vLLM do). ``strip_reasoning``:
    ``DETOK_TGI_STRIP_REASONING=<TagSet preset>`` (``qwen3``, ``deepseek_r1``, ...) drops
    reasoning blocks from the text; unset, nothing is dropped. ``problems`` lists values
    that were not understood (each then keeps its default).

    >>> Settings.from_env({"DETOK_PLUGIN": "1", "DETOK_TGI_STOP": "keep"})
    Settings(enabled=True, keep_stop=True, strip_reasoning=None, problems=())
    """

    enabled: bool = False
    keep_stop: bool = False
    strip_reasoning: str | None = None
    problems: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``DETOK_PLUGIN``, ``DETOK_TGI_STOP`` and ``DETOK_TGI_STRIP_REASONING``."""
        env = os.environ if environ is None else environ
        problems = []
        switch = Switch.from_env(env)
        if switch.problem is not None:
            problems.append(switch.problem)
        stop = env.get("DETOK_TGI_STOP", "exclude").strip().lower() or "exclude"
        if stop not in _STOP_MODES:
            problems.append(f"DETOK_TGI_STOP={stop!r} is not 'exclude' or 'keep'; stops are excluded")
        reasoning = env.get("DETOK_TGI_STRIP_REASONING", "").strip() or None
        if reasoning is not None and reasoning not in TagSet.presets():
            problems.append(
                f"DETOK_TGI_STRIP_REASONING={reasoning!r} is not a preset ({', '.join(TagSet.presets())}); reasoning is kept"
            )
            reasoning = None
        return cls(switch.on, _STOP_MODES.get(stop, False), reasoning, tuple(problems))


class RequestText:
    """One request's text and stop decision over a :class:`ServingStream` (see the module).

    Its verb is TGI's ``StoppingCriteria``'s: ``r(id, text)`` takes one id (``text``, TGI's
    own text for it, is not read) and returns ``(False, None)`` while the request goes on,
    else ``(True, finish code)``; :meth:`push` is the same returning the code or ``None``.
    Its counters carry TGI's names (``current_tokens``, ``max_new_tokens``), so the TGI
    shim's criteria is this class mixed into TGI's ``StoppingCriteria``
    (``step.criteria_class``): each id TGI's step hands the criteria costs one Python
    call over the stream's. ``request_id`` names the request in log lines only.

    ``stream`` is None only in a subclass that has none (yet, or any more: the shim's
    criteria before its first step and after it fell back to TGI's stock text); calling
    then asks :meth:`_without_stream`, and an error from the stream goes to :meth:`_failed`
    (both raise here; the shim's criteria answers with TGI's stock criteria).
    """

    __slots__ = ("stream", "current_tokens", "max_new_tokens", "texts", "sent", "request_id")

    stream: Any
    current_tokens: int
    max_new_tokens: int
    texts: list[str]  # one per id taken
    sent: int  # how many of texts TGI's records have (step.rewrite)
    request_id: str | None

    def __init__(self, stream: Any, max_new_tokens: int, request_id: str | None = None) -> None:
        """Over ``stream`` (a :class:`ServingStream`, or anything with its verbs);
        :meth:`build` makes one from TGI's parameters."""
        self.current_tokens = 0
        self.max_new_tokens = max_new_tokens
        self._start(stream, request_id)

    def _start(self, stream: Any, request_id: str | None) -> None:
        self.stream = stream
        self.texts = []
        self.sent = 0
        self.request_id = request_id

    @classmethod
    def build(
        cls,
        tokenizer: Any,
        prompt_ids: Sequence[int],
        *,
        stop_sequences: Iterable[str],
        eos_token_ids: Iterable[int],
        max_new_tokens: int,
        settings: Settings = Settings(),
        request_id: str | None = None,
    ) -> RequestText:
        """Start a request's text: TGI's stopping parameters, the EOS ids its criteria use
        (empty when the request ignores EOS) and the prompt's ids."""
        stream = open_stream(tokenizer, prompt_ids, stop_sequences=stop_sequences,
                             eos_token_ids=eos_token_ids, settings=settings, request_id=request_id)
        return cls(stream, max_new_tokens, request_id)

    def __call__(self, last_token: Any, last_output: str = "") -> tuple[bool, int | None]:
        """Take one id (an int, or an integer scalar: TGI's CausalLM hands a 0-d tensor);
        ``(False, None)`` while the request goes on, else ``(True, finish code)``. Anything
        else (a float, a bool, a string) is refused by the stream, never truncated:
        :class:`~detok_plugin.TokenTypeError` naming it and its position, to :meth:`_failed`."""
        stream = self.stream
        if stream is None:
            return self._without_stream(last_token, last_output)
        self.current_tokens += 1
        try:
            text = stream.push_text(last_token if last_token.__class__ is int else _integer(last_token))
            if stream.finish_reason is None and self.current_tokens < self.max_new_tokens:
                self.texts.append(text)
                return (False, None)
            return (True, self._end(text))  # the stream's finish() runs here
        except Exception as exc:  # from the stream: this id is not counted
            self.current_tokens -= 1
            return self._failed(exc, last_token, last_output)

    def push(self, token_id: int) -> int | None:
        """Take one id; ``None`` while the request goes on, else TGI's finish code."""
        return self(token_id)[1]

    def _end(self, text: str) -> int:
        """The request ends on this id (its ``text``): release what the stream holds (after
        a stop, which already cut what followed it, finish() adds nothing); the code."""
        stream = self.stream
        reason = stream.finish_reason
        if reason is None:
            code = FINISH_LENGTH
        elif stream.stop_reason is not None:
            code = FINISH_STOP_SEQUENCE
        else:
            code = FINISH_LENGTH if reason == "length" else FINISH_EOS_TOKEN
        self.texts.append(text + stream.finish().text)
        return code

    def _without_stream(self, last_token: Any, last_output: str) -> tuple[bool, int | None]:
        raise ValueError(f"request {self.request_id}: no stream")

    def _failed(self, exc: Exception, last_token: Any, last_output: str) -> tuple[bool, int | None]:
        raise exc

    @property
    def text(self) -> str:
        """All the request's text so far (its ``generated_text`` once it has ended)."""
        return "".join(self.texts)

    @property
    def generated_tokens(self) -> int:
        """How many ids were taken (TGI's ``current_tokens``)."""
        return self.current_tokens

    @property
    def path(self) -> str:
        """The core's decoder path: ``byte_level``, ``sentencepiece`` or ``generic``."""
        return self.stream.path  # type: ignore[no-any-return]


def open_stream(
    tokenizer: Any,
    prompt_ids: Sequence[int],
    *,
    stop_sequences: Iterable[str],
    eos_token_ids: Iterable[int],
    settings: Settings = Settings(),
    request_id: str | None = None,
) -> Any:
    """A request's stream (:class:`ServingStream`, or with ``settings.strip_reasoning`` a
    :class:`DetokenizerState` behind its verbs) from TGI's stopping parameters."""
    stops = tuple(s for s in stop_sequences if s)
    options: dict[str, Any] = {
        "prompt_ids": prompt_ids,
        "skip_special_tokens": True,
        "stop": stops,
        "stop_token_ids": _known_stop_ids(tokenizer, stops),
        "eos_token_ids": tuple(eos_token_ids),
        "include_stop_str_in_output": settings.keep_stop,
        "request_id": request_id,
    }
    if settings.strip_reasoning is None:
        return ServingStream.from_tokenizer(tokenizer, on_unknown_id=_log_unknown_id, **options)
    return _StrippedStream(
        DetokenizerState.from_tokenizer(
            tokenizer, tags=settings.strip_reasoning, reasoning="strip", keep_log=False, **options
        )
    )


class _StrippedStream:
    """A :class:`DetokenizerState` with reasoning tags, behind :class:`ServingStream`'s
    verbs: ``push_text`` returns the content only (the reasoning block is dropped)."""

    __slots__ = ("_state",)

    def __init__(self, state: DetokenizerState) -> None:
        self._state = state

    def push_text(self, token_id: int) -> str:
        try:
            return self._state.push(token_id).text
        except TokenIdError as exc:
            if self._state.finished:
                raise
            _log_unknown_id(exc)
            return ""

    def finish(self) -> Any:
        return self._state.finish()

    @property
    def finish_reason(self) -> str | None:
        return self._state.finish_reason

    @property
    def stop_reason(self) -> str | int | None:
        return self._state.stop_reason

    @property
    def finished(self) -> bool:
        return self._state.finished

    @property
    def path(self) -> str:
        return self._state.path


def special_stop_ids(tokenizer: Any, stops: Sequence[str]) -> tuple[int, ...]:
    """The ids of special tokens whose text is one of ``stops``.

    A special token's text never reaches the text (``skip_special_tokens=True``), so a stop
    string such as ``"<|im_end|>"`` could never match as a string: it matches on the id.
    A stop the tokenizer cannot look up is no token's text: one with a lone surrogate (which
    a tokenizers-backed tokenizer cannot encode, and no token's text holds) is not asked,
    and a lookup that raises is read as no token; such a stop stays a plain stop string.

    >>> special_stop_ids(object(), ["<|im_end|>"])
    ()
    """
    if not stops:
        return ()
    to_id = getattr(tokenizer, "convert_tokens_to_ids", None)
    to_token = getattr(tokenizer, "convert_ids_to_tokens", None)
    if to_id is None or to_token is None:
        return ()
    ids = []
    special: frozenset[int] | None = None  # read only for a stop that is one token's text
    for stop in stops:
        tid = _token_of(to_id, to_token, stop)
        if tid is not None:
            if special is None:
                special = frozenset(getattr(tokenizer, "all_special_ids", None) or ())
            if tid in special:
                ids.append(tid)
    return tuple(ids)


@functools.lru_cache(maxsize=256)
def _cached_stop_ids(tokenizer: Any, stops: tuple[str, ...]) -> tuple[int, ...]:
    return special_stop_ids(tokenizer, stops)


def _known_stop_ids(tokenizer: Any, stops: tuple[str, ...]) -> tuple[int, ...]:
    """:func:`special_stop_ids`, asked once per tokenizer and stops (a tokenizer's lookups
    cost more than the rest of a request's setup); uncached for a tokenizer that cannot be
    a key."""
    if not stops:
        return ()
    try:
        return _cached_stop_ids(tokenizer, stops)
    except TypeError:  # unhashable
        return special_stop_ids(tokenizer, stops)


def _token_of(to_id: Any, to_token: Any, stop: str) -> int | None:
    """The id of the one token whose text is ``stop``, else None; never raises."""
    try:
        stop.encode("utf-8")  # UnicodeEncodeError (a ValueError) for a lone surrogate
        tid = to_id(stop)
        return tid if isinstance(tid, int) and to_token(tid) == stop else None
    except (ValueError, TypeError, KeyError, OverflowError):
        return None


def _integer(value: Any) -> Any:
    """An integer scalar (a 0-d tensor, a numpy integer) as its int, for the stream's
    shortcut; anything else as it is, for the stream to refuse with its typed error.
    Not ``int()``: it truncates ``1.5`` to 1 and reads ``True`` as 1 and ``"7"`` as 7."""
    if isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def _log_unknown_id(exc: TokenIdError) -> None:
    log("WARNING", f"detok-plugin: {exc}; it renders as the tokenizer renders it")
