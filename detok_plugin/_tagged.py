"""``TaggedServingStream``: a serving loop's stream for a chat request whose reasoning and
tool calls stay in the text, with stop strings that cut content only.

A server that splits reasoning and tool calls from the answer after detokenizing (vLLM's
chat layer) needs the detokenizer's text to be the full decode, tags included, but a stop
string inside ``<think>`` must not end the request (vllm-project/vllm#53066), and one inside
a tool call's arguments is part of the call. :class:`TaggedServingStream` is the core with
the request's tags, ``reasoning="inline"`` and ``tools="inline"`` (tags and bodies stay in
the text) and ``stop_in_reasoning=False``: ``ServingStream``'s verbs, stops outside
reasoning and tool bodies only.

The common id takes a shortcut (:class:`RestTexts`): while the core stream is at rest in a
mode (``DetokenizerState._mode_at_rest``, the one definition of *at rest* for a stream with
tags), an id whose text the table knows alone and that holds no first character of that
mode's tags or stops is one lookup, as ``ServingStream``'s common id is; every other id goes
through the core. ``ChatStream`` takes the same shortcut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ._delta import TOOL
from ._errors import TokenIdError
from ._state import DetokenizerState
from ._table_build import build_table
from ._tables import TokenTable, learn_rest_text
from ._tags import TagSet

__all__ = ["RestTexts", "Step", "TaggedServingStream"]


class RestTexts:
    """A stream with tags' shortcut: per mode (content, reasoning, tool body), the ids
    whose text leaves whole while the stream is at rest in that mode.

    Exact by ``DetokenizerState._mode_at_rest``: at rest, an id that is no stop id or id tag
    and whose quick text (its text when the decoder holds nothing) holds no first character
    of the mode's patterns is appended and its text released to the mode's channel, and
    nothing else changes. The per-mode dicts are the table's shared ``rest_texts`` (keyed by
    the skip flag and the first characters, filled in as ids arrive, the rule
    ``ServingStream`` fills them by), so nothing is learnt per stream; stop ids and id tags
    are never taken (``text``).
    """

    __slots__ = ("by_mode", "_firsts", "_quick", "slow_ids")

    def __init__(self, by_mode: tuple[dict[int, str | None], ...], firsts: tuple[Any, ...], quick: tuple[str | None, ...], slow_ids: frozenset[int]) -> None:
        self.by_mode = by_mode
        self._firsts = firsts
        self._quick = quick
        self.slow_ids = slow_ids

    @classmethod
    def of(cls, tokenizer: Any, state: DetokenizerState, skip_special_tokens: bool) -> RestTexts | None:
        """The shortcut for ``state`` (built on ``tokenizer``), or None where there is none
        (the generic path, a log, ``max_tokens``)."""
        table = build_table(tokenizer)[0]
        if table is None or state._keep_log or state._max_tokens is not None:  # noqa: SLF001
            return None
        cfg = state._cfg  # noqa: SLF001
        # The same for every stream with these options on this table: built once (the
        # entry keeps its configuration, so the id in the key stays that one's).
        kept, rest = table.derive((cls, id(cfg), skip_special_tokens), lambda: (cfg, cls._build(table, state, skip_special_tokens)))
        return rest if kept is cfg else cls._build(table, state, skip_special_tokens)

    @classmethod
    def _build(cls, table: TokenTable, state: DetokenizerState, skip_special_tokens: bool) -> RestTexts:
        matchers = state._cfg.matchers  # noqa: SLF001
        firsts = tuple(m.find_first if m is not None else None for m in matchers)
        by_mode = tuple(table.rest_texts(skip_special_tokens, m.first.pattern if m is not None else None) for m in matchers)
        slow = frozenset(state._stop_ids) | frozenset(state._id_tags)  # noqa: SLF001
        return cls(by_mode, firsts, table.quick_texts(skip_special_tokens), slow)

    def learn(self, mode: int, token_id: int) -> str | None:
        """An id not yet in the mode's dict: its quick text if that holds no first
        character of the mode's patterns, else None, recorded either way (the table's rule,
        ``learn_rest_text``, which ``ServingStream`` fills its dict by)."""
        return learn_rest_text(self.by_mode[mode], self._quick, self._firsts[mode], token_id)


class Step(NamedTuple):
    """What a push or finish released: content text (reasoning and its tags inline)."""

    text: str
    finish_reason: str | None
    stop_reason: str | int | None


class TaggedServingStream:
    """``ServingStream``'s verbs (``push_text``, ``push``, ``finish``, ``finish_reason``,
    ``stop_reason``, ``token_ids``, ``finished``, ``path``) over a ``DetokenizerState``
    with reasoning and tool tags inline and stops that skip reasoning and tool bodies.

    The joined text is ``decode(prompt + out)[len(decode(prompt)):]``, cut at the first
    stop string that completes *outside* reasoning and tool-call bodies. ``token_ids`` is the
    core's list of the ids taken (up to the one that completed a stop): the shortcut and an
    unknown id append to it, as the core would.
    """

    # What the common id reads comes first.
    __slots__ = ("_rest", "_mode", "_rests", "_slow", "token_ids", "finish_reason", "stop_reason", "_state", "_on_unknown")

    def __init__(
        self, state: DetokenizerState, on_unknown_id: Callable[[TokenIdError], None] | None = None, rest: RestTexts | None = None
    ) -> None:
        self._state = state
        self.token_ids = state.token_ids  # one list: the core counts it (min_tokens)
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self._on_unknown = on_unknown_id
        self._rests = rest
        self._slow = rest.slow_ids if rest is not None else frozenset()
        self._mode = -1
        self._rest: dict[int, str | None] | None = None
        self._caught_up()

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, *, tags: TagSet, on_unknown_id: Callable[[TokenIdError], None] | None = None, **options: Any
    ) -> TaggedServingStream:
        """Start a stream; ``options`` are ``ServingStream.from_tokenizer``'s (prompt,
        skip flags, stops, ...)."""
        state = DetokenizerState.from_tokenizer(
            tokenizer, tags=tags, reasoning="inline", tools="inline", stop_in_reasoning=False, keep_log=False, **options
        )
        # Every mode's channel is the text here (reasoning and tools inline).
        return cls(state, on_unknown_id, RestTexts.of(tokenizer, state, bool(options.get("skip_special_tokens", False))))

    @property
    def finished(self) -> bool:
        return bool(self._state.finished)

    @property
    def path(self) -> str:
        return str(self._state.path)

    def push_text(self, token_id: int) -> str:
        """Add one id; return the text it released (reasoning included, inline)."""
        rest = self._rest
        if rest is not None and token_id.__class__ is int:  # not a bool, numpy or torch scalar
            # At rest (RestTexts): the common id is one lookup.
            text = rest.get(token_id)
            if text is None and token_id not in rest:  # an id not seen at rest in this mode yet
                text = self._rests.learn(self._mode, token_id)  # type: ignore[union-attr]
            if text is not None and token_id not in self._slow:
                self.token_ids.append(token_id)
                if self._mode == TOOL:  # the body the core reads a close tag against
                    self._state._rest_tool_text(text)  # noqa: SLF001
                return text
        state = self._state
        try:
            delta = state.push(token_id)
        except TokenIdError as exc:
            if self._on_unknown is None or state.finished:
                raise
            self._on_unknown(exc)
            # Counted (by the core too: min_tokens and max_tokens count it, as vLLM and
            # ServingStream do), rendered as the decode renders it.
            self.token_ids.append(token_id)
            return ""
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason
        self._caught_up()
        return str(delta.text)

    def _caught_up(self) -> None:
        """After a call into the core: whether it is at rest now, and in which mode."""
        rests = self._rests
        mode = self._state._mode_at_rest() if rests is not None else -1  # noqa: SLF001
        self._mode = mode
        self._rest = rests.by_mode[mode] if rests is not None and mode >= 0 else None

    def push(self, ids: Sequence[int]) -> Step:
        """Add several ids, one by one, up to a stop."""
        parts = []
        for token_id in ids:
            if self._state.finished:
                break
            parts.append(self.push_text(token_id))
        return Step("".join(parts), self.finish_reason, self.stop_reason)

    def finish(self, drop_incomplete: bool = False) -> Step:
        """End the stream: release what is held (``drop_incomplete``: as ServingStream.finish)."""
        text = "" if self._state.finished else self._state.finish(drop_incomplete).text
        self._rest = None
        return Step(text, self.finish_reason, self.stop_reason)
