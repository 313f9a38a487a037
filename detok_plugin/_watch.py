"""A scheduler's per-step stop check over one :class:`ServingStream`: ``ServingStream.watch``.

A scheduler that keeps each request's output ids and asks after every step whether a stop
string ended it (SGLang's ``Req._check_str_based_finish``) needs no text, only the stream's
answer; and it asks on every step of every request, so the common step should cost one call
and one lookup. :func:`check_for` makes that call: ``check(appended)``, after the scheduler
appended ``appended`` ids, takes the common steps itself and hands every other to the
caller's ``otherwise``, which follows the ids (``ServingStream.follow``) and answers:

* one id that leaves the stream at rest (``ServingStream.follow``'s first shortcut): one
  lookup, then the append; False;
* one id whose boundary move is remembered (a stop's first character, a partial stop going
  on or given up, the decoder idle: its second shortcut where no stop can complete): the
  move; ``holding(held)`` when the stream starts or stops holding (a scheduler holds the
  request's unsent ids meanwhile); False.

The check keeps its place in the ids as an iterator over them, not a count: a step makes no
int (a count past 256 would), an id is never taken twice, and an output the scheduler cut
or replaced runs the iterator dry, so that step goes to ``otherwise``; after ``otherwise``
it is set where the stream is. An ``appended`` of 1 is believed, as the scheduler's own
checks of the last ``appended`` ids believe it: one too few would leave the stream a step
behind until the next step ``otherwise`` takes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from ._matcher import Step

__all__ = ["Watched", "check_for"]


class Watched(Protocol):
    """What the check reads of the stream (``ServingStream``): its ids taken, its held
    text, its at-rest texts and its remembered boundary moves."""

    token_ids: list[int]
    held: str
    _rest: dict[int, str | None] | None

    def _remembered(self, token_id: int) -> Step | None: ...

    def _moved(self, step: Step) -> str: ...


def check_for(
    stream: Watched, ids: Sequence[int], otherwise: Callable[[int], Any], holding: Callable[[str], Any]
) -> Callable[[int], Any]:
    """The check over ``ids`` (a list or an ``array``, whose iterators can be placed)."""
    taken, remembered, moved = stream.token_ids, stream._remembered, stream._moved  # noqa: SLF001
    new: Iterator[int] = iter(ids[:0])  # dry: the first step is otherwise's, which places it

    def check(appended: int, /) -> Any:
        nonlocal new
        if appended == 1:
            for token_id in new:  # the id appended, if any
                rest = stream._rest  # noqa: SLF001
                if rest is not None and rest.get(token_id) is not None and token_id.__class__ is int:
                    taken.append(token_id)  # at rest
                    return False
                step = remembered(token_id)
                if step is not None:  # a remembered move: no stop completes
                    if (step[2] == "") is not (stream.held == ""):  # step[2]: the text it holds
                        holding(step[2])
                    taken.append(token_id)
                    moved(step)
                    return False
                break
        answer = otherwise(appended)
        new = iter(ids)
        new.__setstate__(len(taken))  # type: ignore[attr-defined]
        return answer

    return check
