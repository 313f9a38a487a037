"""Exceptions raised by detok-plugin.

The tree::

    DetokError                      base of everything raised here
    ├── TokenIdError (ValueError)   an id outside the tokenizer's vocabulary
    ├── TokenTypeError (TypeError)  something that is not an int where an id belongs
    ├── StreamFinishedError         push() or finish() after finish()
    │   (RuntimeError)
    └── UnsupportedTokenizerError   an object that offers neither a vocabulary nor decode()
        (TypeError)

Each message names the offending value, its position in the stream (0 is the first
output token; prompt positions are negative) and the request when one was given.
"""

from __future__ import annotations

__all__ = [
    "DetokError",
    "StreamFinishedError",
    "TokenIdError",
    "TokenTypeError",
    "UnsupportedTokenizerError",
]


def _where(position: int | None, request_id: str | None) -> str:
    parts = []
    if position is not None:
        parts.append(f"at position {position}")
    if request_id is not None:
        parts.append(f"in request {request_id!r}")
    return (" " + " ".join(parts)) if parts else ""


class DetokError(Exception):
    """Base class of every error detok-plugin raises."""


class TokenIdError(DetokError, ValueError):
    """A token id outside ``[0, vocab_size)`` or a hole in the vocabulary."""

    def __init__(
        self, token_id: int, position: int | None, vocab_size: int, request_id: str | None = None
    ) -> None:
        self.token_id = token_id
        self.position = position
        self.vocab_size = vocab_size
        self.request_id = request_id
        super().__init__(
            f"token id {token_id}{_where(position, request_id)} is not in the tokenizer's "
            f"vocabulary (valid ids are 0..{vocab_size - 1} that the tokenizer defines)"
        )


class TokenTypeError(DetokError, TypeError):
    """A value that is not an integer token id."""

    def __init__(self, value: object, position: int | None, request_id: str | None = None) -> None:
        self.value = value
        self.position = position
        self.request_id = request_id
        super().__init__(
            f"token ids must be int, got {type(value).__name__} {value!r}"
            f"{_where(position, request_id)}"
        )


class StreamFinishedError(DetokError, RuntimeError):
    """A push or finish after the stream finished (finish() or a stop condition)."""

    def __init__(self, position: int, request_id: str | None = None, reason: str | None = None) -> None:
        self.position = position
        self.request_id = request_id
        self.reason = reason
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"the stream already finished{why}; nothing can be pushed{_where(position, request_id)}. "
            "Start a new DetokenizerState for a new request."
        )


class UnsupportedTokenizerError(DetokError, TypeError):
    """An object that is neither a transformers/tokenizers tokenizer nor has decode(ids)."""
