"""``IncrementalDetokenizer``: the simple contract, one id in, new text out."""

from __future__ import annotations

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
    :meth:`~DetokenizerState.push_text` verb (no Delta built per token).
    """

    __slots__ = ("_state", "path", "push")

    #: ``push(token_id) -> str``: add one token id; return the text it settles (often
    #: ``""``). It is the state's own ``push_text``, bound at construction: a wrapper method
    #: would add a call to every token.
    push: Callable[[int], str]

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = False) -> None:
        self._state = DetokenizerState.from_tokenizer(
            tokenizer, prompt_ids=prompt_ids, skip_special_tokens=skip_special_tokens, eos_token_ids=(), keep_log=False
        )
        self.path = self._state.path
        self.push = self._state.push_text

    def flush(self) -> str:
        """End the stream and return whatever was held (an incomplete tail as U+FFFD)."""
        return self._state.finish().text

