"""Opening a stream: the family decoder for a tokenizer, primed with the prompt, and the
validation of ids (ints only, inside the vocabulary, not a hole in it).

Errors are typed and name the id and its position: 0 is the first output token, prompt
ids have negative positions (``-len(prompt)`` is the first).
"""

from __future__ import annotations

import inspect
import operator
from array import array
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ._decoders import ByteLevelStream, GenericStream, SentencePieceStream, StreamDecoder
from ._errors import TokenIdError, TokenTypeError, UnsupportedTokenizerError
from ._table_build import build_table, eos_token_ids_of
from ._tables import TokenTable, decode_with_table
from ._tags import TagSet

__all__ = ["Opened", "as_id", "check", "checked_ids", "checked_push", "open_decoder"]


# Opened(...) goes through a Python __new__ with nine arguments; a request's opening builds
# one, as the tuple it is.
_tuple_new = tuple.__new__


class Opened(NamedTuple):
    """A tokenizer's side of a new stream."""

    decoder: StreamDecoder  # primed with the prompt
    table: TokenTable | None  # None on the generic path
    vocab: tuple[Any, ...] | None  # the table's pieces (None marks a hole), or None
    size: int  # ids are below this
    prompt: list[int]  # the checked prompt
    skip_chars: int  # characters of the prompt's held tail the output starts after
    eos_token_ids: tuple[int, ...]  # the tokenizer's own
    why: str  # why this path
    tokenizer: Any

    def starts_in(self, tags: TagSet | None) -> bool:
        """The prompt's text ends in the reasoning open tag (templates ending ``<think>\\n``):
        the stream starts inside reasoning. Decoded with special tokens kept: the tag may be
        one."""
        if tags is None or not (tags.reasoning_open and tags.reasoning_close) or not self.prompt:
            return False
        tag = tags.reasoning_open.rstrip()  # a tag may end in a newline
        for count in (4, 16):
            tail_ids = self.prompt[-count:]
            tail = decode_with_table(self.table, tail_ids) if self.table is not None else self.tokenizer.decode(tail_ids)
            tail = tail.rstrip()
            # The ids' decode is the prompt's from its fourth character on: before that it
            # may start inside a character (up to 3 U+FFFD) or without a leading space.
            if len(tail) >= len(tag) + 3 or count >= len(self.prompt):
                break
        return tail.endswith(tag)


def open_decoder(
    tokenizer: Any, prompt_ids: Sequence[int], skip_special_tokens: bool, spaces_between: bool, request_id: str | None
) -> Opened:
    """The decoder for ``tokenizer``'s path (``build_table`` decides), primed with the
    checked prompt."""
    table, why = build_table(tokenizer)
    if table is not None:
        size = len(table.pieces)
        dec: StreamDecoder
        if table.family == "byte_level":
            dec = ByteLevelStream(table, skip_special_tokens=skip_special_tokens)
        else:
            dec = SentencePieceStream(table, skip_special_tokens=skip_special_tokens)
        if len(prompt_ids) == 0:  # nothing to check or prime (a streamer's skipped prompt)
            return _tuple_new(Opened, (dec, table, table.pieces, size, [], 0, table.eos_token_ids, why, tokenizer))
        prompt = _checked_prompt(prompt_ids, table.pieces if table.has_holes else None, size, request_id)
        dec.prime(prompt)
        # decode(prompt) renders a held tail as final: its characters stand where the
        # output's first characters will, so the output starts that many characters in.
        skip_chars = 0 if dec.idle else len(dec.peek_final())
        return _tuple_new(Opened, (dec, table, table.pieces, size, prompt, skip_chars, table.eos_token_ids, why, tokenizer))
    if not callable(getattr(tokenizer, "decode", None)):
        raise UnsupportedTokenizerError(
            f"{type(tokenizer).__name__} is not a transformers or tokenizers tokenizer, a "
            "TokenTable, or an object with decode(ids): detok-plugin cannot read it"
        )
    size = _vocab_size(tokenizer)
    prompt = _checked_prompt(prompt_ids, None, size, request_id)
    kwargs: dict[str, Any] = {"skip_special_tokens": skip_special_tokens}
    if _takes_kwarg(tokenizer, "spaces_between_special_tokens"):
        kwargs["spaces_between_special_tokens"] = spaces_between

    def decode(ids: list[int], _d: Any = tokenizer.decode, _k: dict[str, Any] = kwargs) -> str:
        return str(_d(ids, **_k))

    cleanup = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    skipped = _skipped_ids(tokenizer, decode) if skip_special_tokens else frozenset()
    dec = GenericStream(decode, prompt, cleanup=cleanup, skipped=skipped)
    return Opened(dec, None, None, size, prompt, 0, eos_token_ids_of(tokenizer), why, tokenizer)


def as_id(value: Any, position: int, request_id: str | None) -> int:
    """``value`` as a token id: an int, or an integer scalar (numpy, torch); not a bool."""
    if type(value) is int:
        return value
    if isinstance(value, bool):
        raise TokenTypeError(value, position, request_id)
    try:
        return operator.index(value)
    except TypeError:
        raise TokenTypeError(value, position, request_id) from None


def check(tid: int, position: int, vocab: Sequence[Any] | None, size: int, request_id: str | None) -> None:
    """Raise :class:`TokenIdError` unless ``tid`` is below ``size`` and not a hole."""
    if not 0 <= tid < size or (vocab is not None and vocab[tid] is None):
        raise TokenIdError(tid, position, size, request_id)


def checked_ids(
    values: Sequence[Any], first_position: int, vocab: Sequence[Any] | None, size: int, request_id: str | None
) -> list[int]:
    """All of ``values`` as checked ids, or the error of the first bad one."""
    ids = [as_id(v, first_position + k, request_id) for k, v in enumerate(values)]
    for k, tid in enumerate(ids):
        check(tid, first_position + k, vocab, size, request_id)
    return ids


def checked_push(ids: Any, first_position: int, vocab: Sequence[Any] | None, size: int, request_id: str | None) -> list[int]:
    """The ids of one push (an id, or a sequence of them), validated before any is applied:
    a bad id anywhere raises, naming it and its position."""
    if type(ids) is int or (hasattr(ids, "__index__") and not isinstance(ids, bool)):
        batch: Sequence[Any] = (ids,)  # one id: an int, or an integer scalar (numpy, torch)
    elif isinstance(ids, (str, bytes, bool)) or not hasattr(ids, "__iter__"):
        raise TokenTypeError(ids, first_position, request_id)
    else:
        batch = ids if isinstance(ids, (list, tuple)) else list(ids)
    return checked_ids(batch, first_position, vocab, size, request_id)


def _checked_prompt(prompt_ids: Sequence[int], holes: Sequence[Any] | None, size: int, request_id: str | None) -> list[int]:
    """The prompt, validated in C when it is clean (``holes``: the pieces, when some id has
    none); otherwise id by id, so the error names the bad one."""
    if len(prompt_ids) == 0:
        return []
    plain = prompt_ids if isinstance(prompt_ids, list) else None  # read while opening only: not copied
    try:
        packed = array("I", prompt_ids)  # ints and __index__ objects, from 0 below 2**32, only
        clean = max(packed if plain is None else plain) < size  # max of a list of ints: no boxing
    except (TypeError, OverflowError):
        clean = False
    if clean and (holes is None or all(holes[t] is not None for t in set(packed))):
        return packed.tolist() if plain is None else plain
    return checked_ids(prompt_ids, -len(prompt_ids), holes, size, request_id)


def _vocab_size(tokenizer: Any) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        size = getattr(tokenizer, "vocab_size", None)
        if isinstance(size, int):
            return size
    return 1 << 62


def _skipped_ids(tokenizer: Any, decode: Callable[[list[int]], str]) -> frozenset[int]:
    """The ids that ``decode`` (with ``skip_special_tokens=True``) removes before its decoder
    runs, where the tokenizer says which: ``tokenizers`` drops its special added tokens,
    transformers' Python tokenizers their ``all_special_ids``. Checked with one decode
    (together they render nothing); empty where unknown, and then they stay in the window."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    try:
        if callable(getattr(backend, "get_added_tokens_decoder", None)):
            ids = [int(i) for i, t in backend.get_added_tokens_decoder().items() if t.special]
        else:
            ids = [int(i) for i in getattr(tokenizer, "all_special_ids", None) or ()]
        if ids and decode(ids) == "":
            return frozenset(ids)
    except Exception:  # a decode-only tokenizer's own notion of special: leave it to its decode
        pass
    return frozenset()


def _takes_kwarg(tokenizer: Any, name: str) -> bool:
    for fn in (getattr(tokenizer, "_decode", None), getattr(tokenizer, "decode", None)):
        if fn is None:
            continue
        try:
            if name in inspect.signature(fn).parameters:
                return True
        except (TypeError, ValueError):
            continue
    return False
