"""What a stream hands back: ``Delta`` per call, ``Segment`` per piece of the log.

Both are records with named fields. ``Delta`` is a ``NamedTuple``: building one costs what
a tuple costs, which matters because a serving loop builds one per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from ._tags import ToolCall

__all__ = ["Channel", "Delta", "FinishReason", "Reasoning", "Segment", "Tools"]

FinishReason = Literal["stop", "length"]
Reasoning = Literal["separate", "strip", "inline"]
Tools = Literal["separate", "inline"]
Channel = Literal["content", "reasoning", "tool", "tag", "stop"]

# Channel numbers, as the stream and its log store them (index into CHANNEL_NAMES).
CONTENT, REASONING, TOOL, TAG, STOP = 0, 1, 2, 3, 4
CHANNEL_NAMES: tuple[Channel, ...] = ("content", "reasoning", "tool", "tag", "stop")


class Delta(NamedTuple):
    """What one ``push`` or ``finish`` released.

    ``text`` is content, ``reasoning`` the reasoning channel, ``tool_calls`` the tool-call
    channel. ``consumed`` is how many of the pushed ids were used: fewer than pushed when a
    stop completed inside a multi-token push, so the caller can drop the rest.

    >>> Delta("Hi", consumed=1).finished, Delta(finish_reason="stop").finished
    (False, True)
    """

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    consumed: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


#: One id pushed, nothing released, the stream goes on: the commonest Delta of a split
#: character, shared.
ONE_EMPTY = Delta(consumed=1)
#: ``finish()`` of a stream that holds nothing: the commonest end, shared.
ENDED_EMPTY = Delta()


_tuple_new = tuple.__new__

#: ``text_delta``'s Deltas, by text. A Delta is immutable, so one per text can be shared by
#: every stream, and a stream's texts repeat (they are mostly a tokenizer's pieces): a
#: lookup costs a fifth of building the tuple (docs/benchmarks.md). Bounded: past
#: ``TEXT_DELTAS_MAX`` texts, new ones are built and not kept. Nothing else is learnt.
TEXT_DELTAS: dict[str, Delta] = {"": ONE_EMPTY}
TEXT_DELTAS_MAX = 1 << 16


def text_delta(text: str) -> Delta:
    """``Delta(text, consumed=1)``: the shared one for ``text``, else built as the tuple it
    is (``Delta(...)`` goes through a Python ``__new__`` with defaults: twice the cost)."""
    delta = TEXT_DELTAS.get(text)
    if delta is None:
        delta = _tuple_new(Delta, (text, "", (), None, None, 1))
        if len(TEXT_DELTAS) < TEXT_DELTAS_MAX:
            TEXT_DELTAS[text] = delta
    return delta


def reasoning_delta(text: str) -> Delta:
    """``Delta(reasoning=text, consumed=1)``, built as the tuple it is."""
    return _tuple_new(Delta, ("", text, (), None, None, 1))


def tool_delta(call: ToolCall) -> Delta:
    """``Delta(tool_calls=(call,), consumed=1)``, built as the tuple it is."""
    return _tuple_new(Delta, ("", "", (call,), None, None, 1))


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of the lossless log: joined, the pieces are the full decode up to the stop."""

    channel: Channel
    text: str


class Out:
    """Accumulates one call's output, per channel, before it becomes a Delta."""

    __slots__ = ("text", "reasoning", "tools")

    def __init__(self) -> None:  # list displays: cheaper than dataclass default factories
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tools: list[ToolCall] = []

    def empty(self) -> bool:
        return not (self.text or self.reasoning or self.tools)
