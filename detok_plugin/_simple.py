"""``IncrementalDetokenizer``: the simple contract, one id in, new text out."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from ._state import DetokenizerState

__all__ = ["IncrementalDetokenizer"]


class IncrementalDetokenizer:
    """Stream one sequence's text, one token id at a time.

    The joined output of ``push`` calls and ``flush`` equals
    ``tokenizer.decode(prompt_ids + out, skip_special_tokens=...)[len(tokenizer.decode(prompt_ids, ...)):]``,
    and every character leaves in the push of the token that completes it.

    Why not decode each token alone: byte-level tokens often end inside a UTF-8
    character, and alone they decode to U+FFFD. 🫨 is three Qwen3 tokens:

    >>> from detok_plugin._tables import TokenTable
    >>> table = TokenTable("byte_level", (b"\\xf0\\x9f", b"\\xab", b"\\xa8"), frozenset())
    >>> [bytes(p).decode("utf-8", "replace") for p in table.pieces]   # per-token decode
    ['�', '�', '�']
    >>> d = IncrementalDetokenizer(table, [])
    >>> [d.push(0), d.push(1), d.push(2), d.flush()]
    ['', '', '🫨', '']

    It is :class:`DetokenizerState` without stops or channels, through its
    :meth:`~DetokenizerState.push_text` verb (no Delta built per token), whose shortcut
    :func:`_plain_push` takes without the checks no such stream needs.
    """

    __slots__ = ("_state", "path", "push")

    #: ``push(token_id) -> str``: add one token id; return the text it settles (often
    #: ``""``). Bound at construction (:func:`_plain_push`): a wrapper method would add a
    #: call to every token.
    push: Callable[[int], str]

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = False) -> None:
        self._state = DetokenizerState.from_tokenizer(
            tokenizer, prompt_ids=prompt_ids, skip_special_tokens=skip_special_tokens, eos_token_ids=(), keep_log=False
        )
        self.path = self._state.path
        self.push = _plain_push(self._state)

    def flush(self) -> str:
        """End the stream and return whatever was held (an incomplete tail as U+FFFD)."""
        return self._state.finish().text



def _plain_push(state: DetokenizerState) -> Callable[[int], str]:
    """``state.push_text`` for a stream with no stops, stop ids, ``max_tokens``, log or tags.

    ``push_text``'s shortcut then releases the decoder's text for the id and changes nothing
    but the ids: no stop can start or end, no id ends the stream, nothing is logged. So this
    takes the shortcut's ids (the state live with nothing of the prompt to skip, ``_hot``; an
    int id in the table) with those checks dropped, and hands every other id to
    ``push_text`` itself, which raises on a bad id or a finished stream. Per id on Qwen3's
    emoji stream, where most ids are pieces of a split character: about 0.6x of the time
    ``push_text`` takes (docs/benchmarks.md).
    """
    checked = state.push_text
    vocab = state._vocab  # noqa: SLF001 (one package)
    if vocab is None or state._stop_ids or state._first is not None or state._keep_log or state._limit != sys.maxsize:  # noqa: SLF001
        return checked  # the generic path, or options IncrementalDetokenizer never sets
    dec = state._dec  # noqa: SLF001
    quick, feed, append, size = dec.quick, dec.feed_one, state.token_ids.append, state._size  # noqa: SLF001

    def push(token_id: int) -> str:
        if state._hot and token_id.__class__ is int and 0 <= token_id < size:  # noqa: SLF001
            if dec.idle and (text := quick[token_id]) is not None:
                append(token_id)
                return text
            if vocab[token_id] is not None:
                text = feed(token_id)
                append(token_id)
                return text
        return checked(token_id)

    return push
