"""Reading a tokenizer into its :class:`TokenTable`: which family its decoder is, each
id's piece, the check against the tokenizer's own ``decode`` on a fixed sample, and the
cache that builds each tokenizer's table once (``build_table``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ._tables import TokenTable, decode_with_table

__all__ = ["build_table", "eos_token_ids_of"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def _backend_of(tokenizer: Any) -> Any | None:
    """The ``tokenizers.Tokenizer`` behind a transformers tokenizer, or the object itself."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend
    if all(hasattr(tokenizer, a) for a in ("get_vocab", "get_added_tokens_decoder", "decoder", "decode")):
        return tokenizer
    return None


def _applies_cleanup(tokenizer: Any, backend: Any) -> bool:
    """Whether transformers' decode rewrites spaces after the backend decode (5.x rule)."""
    if tokenizer is backend or not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    is_bpe = type(backend.model).__name__ == "BPE"
    force = getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    return not is_bpe or bool(force)


def _sentencepiece_shape(decoder: dict[str, Any]) -> tuple[str, bool] | None:
    """(replacement char, strips one leading space) for Replace+ByteFallback+Fuse[+Strip]."""
    if decoder.get("type") != "Sequence":
        return None
    steps = decoder.get("decoders", [])
    kinds = [d.get("type") for d in steps]
    if kinds not in (["Replace", "ByteFallback", "Fuse"], ["Replace", "ByteFallback", "Fuse", "Strip"]):
        return None
    rep = steps[0]
    if rep.get("content") != " " or set(rep.get("pattern", {})) != {"String"}:
        return None
    strip = False
    if len(steps) == 4:
        s = steps[3]
        if s.get("content") != " " or s.get("stop", 0) != 0 or s.get("start") not in (0, 1):
            return None
        strip = s.get("start") == 1
    return rep["pattern"]["String"], strip


def eos_token_ids_of(tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's EOS id or ids (several where the model has several)."""
    v = getattr(tokenizer, "eos_token_id", None)
    if isinstance(v, int):
        return (v,)
    if isinstance(v, (list, tuple)):
        return tuple(dict.fromkeys(int(x) for x in v))
    return ()


def _try_build(tokenizer: Any) -> tuple[TokenTable | None, str]:
    """The table for ``tokenizer``'s backend decoder, or ``(None, why not)``."""
    backend = _backend_of(tokenizer)
    if backend is None:
        return None, "no tokenizers backend (decode-only tokenizer)"
    if _applies_cleanup(tokenizer, backend):
        return None, "decode applies clean_up_tokenization_spaces"
    if backend.decoder is None:
        return None, "backend has no decoder"
    try:
        decoder = json.loads(backend.decoder.__getstate__())
    except Exception as exc:  # a backend without a serialisable decoder
        return None, f"decoder not readable ({type(exc).__name__})"
    vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
    added = backend.get_added_tokens_decoder()
    common: dict[str, Any] = {
        "name": getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__,
        "eos_token_ids": eos_token_ids_of(tokenizer),
        "added_tokens": tuple(sorted((i, t.content, bool(t.special)) for i, t in added.items())),
    }
    special = frozenset(i for i, t in added.items() if t.special)
    if decoder.get("type") == "ByteLevel":
        return TokenTable("byte_level", _byte_level_pieces(vocab), special, **common), "decoder is ByteLevel"
    shape = _sentencepiece_shape(decoder)
    if shape is None:
        return None, f"decoder {decoder.get('type')!r} has no table path"
    marker, strip = shape
    texts, byte_values = _sentencepiece_pieces(vocab, marker)
    table = TokenTable(
        "sentencepiece", texts, special, byte_values=byte_values, strip_leading_space=strip, **common
    )
    return table, "decoder is Replace+ByteFallback+Fuse" + ("+Strip" if strip else "")


def _byte_level_pieces(vocab: dict[str, int]) -> tuple[bytes | None, ...]:
    """Each token's bytes through GPT-2's byte map (None: a hole in the id space)."""
    pieces: list[bytes | None] = [None] * (max(vocab.values()) + 1 if vocab else 0)
    for tok, i in vocab.items():
        try:
            pieces[i] = bytes(_UNICODE_TO_BYTE[c] for c in tok)
        except KeyError:  # a character outside the map: tokenizers keeps the raw UTF-8
            pieces[i] = tok.encode("utf-8")
    return tuple(pieces)


def _sentencepiece_pieces(vocab: dict[str, int], marker: str) -> tuple[tuple[str | None, ...], tuple[int, ...]]:
    """Each token's text with ``marker`` as a space, and the byte of each ``<0xNN>`` piece
    (-1 for the others)."""
    size = max(vocab.values()) + 1 if vocab else 0
    texts: list[str | None] = [None] * size
    byte_values = [-1] * size
    for tok, i in vocab.items():
        t = tok.replace(marker, " ")
        texts[i] = t
        if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            with contextlib.suppress(ValueError):
                byte_values[i] = int(t[3:5], 16)
    return tuple(texts), tuple(byte_values)


def _verify(table: TokenTable, decode: Callable[..., str]) -> str | None:
    """Compare the table's decode with the tokenizer's own on a fixed sample; None if equal."""
    if table.vocab_size == 0 or all(p is None for p in table.pieces):
        return "empty vocabulary"
    for ids in _verification_sample(table):
        for skip in (False, True):
            want = decode(ids, skip_special_tokens=skip)
            got = decode_with_table(table, ids, skip_special_tokens=skip)
            if want != got:
                return f"table decode differs from tokenizer.decode on {ids} (skip_special_tokens={skip})"
    return None


def _verification_sample(table: TokenTable) -> list[list[int]]:
    """Every added token alone and between random neighbours, runs of byte pieces, and
    random id sequences; the same sample every time (a fixed seed)."""
    rng = random.Random(20261121)
    valid = [i for i in range(table.vocab_size) if table.pieces[i] is not None]
    cases: list[list[int]] = [[i] for i, _, _ in table.added_tokens[:512]]
    cases += [[rng.choice(valid), i, rng.choice(valid)] for i, _, _ in table.added_tokens[:512]]
    if table.family == "sentencepiece":
        bytes_ids = [i for i, b in enumerate(table.byte_values) if b >= 0]
        if bytes_ids:
            cases += [[rng.choice(bytes_ids) for _ in range(rng.randint(1, 6))] for _ in range(32)]
    cases += [[rng.choice(valid) for _ in range(rng.randint(1, 12))] for _ in range(96)]
    return cases


_cache_lock = threading.Lock()  # held while a table is built: each is built once
# Each tokenizer's table by the tokenizer's id, read without the lock (a request's opening
# asks once): an entry counts only while its weak reference returns that very tokenizer,
# and goes with the tokenizer.
_by_id: dict[int, tuple[weakref.ref[Any], tuple[TokenTable | None, str]]] = {}
# Tokenizers that take no weak reference, kept alive here: at most 32.
_strong_cache: dict[int, tuple[Any, tuple[TokenTable | None, str]]] = {}


def build_table(tokenizer: Any) -> tuple[TokenTable | None, str]:
    """The verified table for ``tokenizer`` (cached), or ``(None, why)`` for the generic path."""
    hit = _cached(tokenizer)
    if hit is not None:
        return hit
    if isinstance(tokenizer, TokenTable):
        return tokenizer, "prebuilt table"
    with _cache_lock:
        hit = _cached(tokenizer)  # another thread may have built it meanwhile
        if hit is not None:
            return hit
        table, why = _try_build(tokenizer)
        if table is not None:
            mismatch = _verify(table, tokenizer.decode)
            if mismatch is not None:
                table, why = None, mismatch
        result = (table, why)
        _keep(tokenizer, result)
        return result


def _cached(tokenizer: Any) -> tuple[TokenTable | None, str] | None:
    key = id(tokenizer)
    entry = _by_id.get(key)
    if entry is not None and entry[0]() is tokenizer:
        return entry[1]
    kept = _strong_cache.get(key)
    return kept[1] if kept is not None and kept[0] is tokenizer else None


def _keep(tokenizer: Any, result: tuple[TokenTable | None, str]) -> None:
    key = id(tokenizer)
    try:
        _by_id[key] = (weakref.ref(tokenizer, functools.partial(_drop, key)), result)
    except TypeError:  # no weak reference
        if len(_strong_cache) >= 32:
            _strong_cache.pop(next(iter(_strong_cache)))
        _strong_cache[key] = (tokenizer, result)


def _drop(key: int, ref: weakref.ref[Any]) -> None:
    """A tokenizer went: its entry goes (unless the id already names a newer one's)."""
    entry = _by_id.get(key)
    if entry is not None and entry[0] is ref:
        _by_id.pop(key, None)
