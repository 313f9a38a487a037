"""Token tables: what each token id contributes to the decoded text, per tokenizer family.

A table is built once per tokenizer, verified against the tokenizer's own ``decode`` and
cached; every stream on that tokenizer shares it, across threads. What it is built from is
immutable; the memos that streams fill in as they run are filled so that any thread may
read them without a lock (``TokenTable``, "Sharing across threads").

Families:

* ``byte_level``: GPT-2's byte-to-unicode map (Qwen, DeepSeek, SmolLM2, Llama 3, ...).
  A token is a byte string; the text is ``b"".join(pieces).decode("utf-8", "replace")``,
  which is what ``tokenizers``' ``ByteLevel`` decoder computes (``from_utf8_lossy``).
* ``sentencepiece``: ``Replace(▁, " ") + ByteFallback + Fuse + Strip(" ", 1, 0)``
  (Llama 2, Mistral v1/v2/v3 SentencePiece). ``<0xNN>`` pieces are bytes; a run of byte
  pieces decodes as UTF-8 when the whole run is valid, otherwise to one U+FFFD per byte
  piece; one leading space of the whole text is stripped.

Anything else takes the generic, decode-based path (see ``_decoders.GenericStream``).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import random
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

__all__ = ["Family", "TokenTable", "build_table", "decode_with_table", "eos_token_ids_of", "learn_rest_text", "surrogate_prefix"]

Family = Literal["byte_level", "sentencepiece", "generic"]

_MAX_REST = 64  # rest_texts dicts per table: one per skip flag and set of stops' first characters

@dataclass(frozen=True, slots=True)
class TokenTable:
    """One tokenizer's id -> piece table, shared by every stream on it, across threads.

    ``pieces[i]`` is ``bytes`` (byte_level) or ``str`` with ``▁`` already replaced
    (sentencepiece); ``None`` marks a hole in the id space. ``byte_values[i]`` is the byte
    of a ``<0xNN>`` piece and -1 otherwise (sentencepiece only).

    Sharing across threads. The fields a table is built with (and ``texts``, ``splits``,
    ``has_holes``, derived from them at construction) are immutable. Three memos are not:
    ``joins`` (filled by ``_decoders.join``), the quick texts (:meth:`quick_texts`) and the
    rest texts (:meth:`rest_texts`, and each dict it hands out, filled by
    :func:`learn_rest_text`). They take no lock, so a read stays one dict lookup, and are
    safe to share because every fill keeps four rules:

    1. An entry is a pure function of its key and the immutable fields (a rest-texts
       dict's entries, of its own key too), so threads that fill one key write equal
       values and it does not matter whose write stays.
    2. The value is made whole first, then published by one dict operation (``d[k] = v``
       or ``d.setdefault(k, v)``) whose keys (``bytes``, ``int``, ``bool``, tuples of those,
       ``str`` and None) hash and compare in C, and whose dropped values free in C, running
       no Python code. Under the GIL that operation is therefore atomic; a free-threaded
       build makes each dict operation atomic itself (a per-dict lock for writes, reads that
       see an entry whole or not at all). A reader's ``get`` finds a whole entry or none,
       and with none it computes the same value itself. Values are immutable (``str``,
       tuples), except the rest-texts dicts, which are filled by these same rules.
    3. A bound is kept by ``clear()`` when full, itself one dict operation: a reader sees
       the entries before it or none, never part of them. The size check and the clear are
       two steps, so threads filling at that moment may each add one entry past the bound;
       it bounds memory, not correctness.
    4. A rest-texts dict dropped by such a clear stays valid for the streams that hold it
       (rule 1); a later stream with the same key gets a new one. ``quick_texts`` is never
       cleared, and ``setdefault`` gives every caller the one tuple that won.

    ``tests/test_tables_threads.py`` streams through one table from eight threads at once,
    with the bounds made small so that they are hit.
    """

    family: Literal["byte_level", "sentencepiece"]
    pieces: tuple[Any, ...]
    special_ids: frozenset[int]
    byte_values: tuple[int, ...] = ()
    strip_leading_space: bool = False
    name: str = ""
    eos_token_ids: tuple[int, ...] = ()
    added_tokens: tuple[tuple[int, str, bool], ...] = field(default=(), repr=False)
    #: byte_level: each piece decoded alone when it is valid UTF-8 by itself, else None.
    #: Most tokens are; a stream with no held bytes returns these without decoding.
    texts: tuple[str | None, ...] = field(default=(), repr=False, compare=False)
    #: byte_level: for a piece that is not valid alone, what it gives arriving when nothing
    #: is held: (settled text, held tail). Split characters start with no decode at all.
    splits: tuple[tuple[str, bytes] | None, ...] = field(default=(), repr=False, compare=False)
    #: Whether some id below ``vocab_size`` has no piece (derived; checked once here).
    has_holes: bool = field(default=False, init=False, repr=False, compare=False)
    #: The special added tokens' ids by their text (derived once here: a request's tags are
    #: looked up in it, and a vocabulary may have thousands of added tokens).
    special_ids_by_text: Mapping[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: byte_level: what a held tail followed by a piece decodes to, by those bytes: (settled
    #: text, held tail). A function of the bytes alone, shared by every stream on the table,
    #: filled in as split characters arrive (``_decoders.join``); at most ``JOINS_MAX``
    #: (give or take one entry per thread filling as it fills up; "Sharing across threads").
    joins: dict[bytes, tuple[str, bytes]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _quick: dict[bool, tuple[str | None, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _rest: dict[tuple[bool, str | None], dict[int, str | None]] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: What a stream's options derive from this table, shared by every stream with those
    #: options (the chat layer's per-mode shortcut, ``RestTexts``), by a key its builder
    #: makes; at most ``_MAX_REST`` (rules 2-4 of the class docstring: ``derive``).
    _derived: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "has_holes", None in self.pieces)
        by_text = {content: i for i, content, special in self.added_tokens if special}
        object.__setattr__(self, "special_ids_by_text", MappingProxyType(by_text))
        if self.family == "byte_level" and len(self.texts) != len(self.pieces):
            texts = tuple(_standalone(p) for p in self.pieces)
            object.__setattr__(self, "texts", texts)
            splits = tuple(
                _split(p) if t is None and p is not None else None for p, t in zip(self.pieces, texts)
            )
            object.__setattr__(self, "splits", splits)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def rest_texts(self, skip_special_tokens: bool, first: str | None) -> dict[int, str | None]:
        """The ids seen so far whose quick text holds no character that ``first`` (the
        pattern of the stops' first characters, ``Matcher.first``; None without stops)
        matches, with that text: what leaves for such an id when nothing is held and no
        stop is partly matched. Filled in by ``ServingStream`` as ids arrive, shared by
        every stream with the same skip flag and first characters, whatever the stops
        (so a stop set never seen before costs nothing). At most ``_MAX_REST`` per table
        (give or take one per thread filling at once); past that they start again, and
        streams keep the one they have, still exact (rules 3 and 4 of the class docstring:
        the clear and the new dict's ``setdefault`` are each one dict operation)."""
        key = (skip_special_tokens, first)
        got = self._rest.get(key)
        if got is None:
            if len(self._rest) >= _MAX_REST:
                self._rest.clear()
            got = self._rest.setdefault(key, {})
        return got

    def derive(self, key: Any, build: Callable[[], Any]) -> Any:
        """The object stored for ``key``, built by ``build`` (once, give or take threads
        racing: each may build, all get the one stored first); at most ``_MAX_REST``
        entries, past which they start again (a caller keeps the one it has)."""
        got = self._derived.get(key)
        if got is None:
            if len(self._derived) >= _MAX_REST:
                self._derived.clear()
            got = self._derived.setdefault(key, build())
        return got

    def quick_texts(self, skip_special_tokens: bool) -> tuple[str | None, ...]:
        """Per id, its text when it arrives with nothing held, or None where that depends on
        what is held (a byte-level piece that is not valid UTF-8 alone, a SentencePiece byte
        piece). Skipped special tokens are ``""``. Stored once per table and skip flag:
        built whole, then published by ``setdefault``, so threads that race to build it
        (each may) all return the one tuple stored first."""
        got = self._quick.get(skip_special_tokens)
        if got is None:
            if self.family == "byte_level":
                base = list(self.texts)
            else:
                base = [p if b < 0 else None for p, b in zip(self.pieces, self.byte_values)]
            if skip_special_tokens:
                for i in self.special_ids:
                    base[i] = ""
            got = self._quick.setdefault(skip_special_tokens, tuple(base))
        return got


def learn_rest_text(
    known: dict[int, str | None], quick: tuple[str | None, ...], first: Callable[[str], object] | None, token_id: int
) -> str | None:
    """``token_id``, not yet in ``known`` (a dict of :meth:`TokenTable.rest_texts`, whose
    ``quick_texts`` are ``quick``): its quick text when that holds no character ``first``
    finds (the stops' or a mode's first characters; None: there are none), else None;
    recorded in ``known`` either way, so a reader asks again only for an id not in it
    (``known.get(i)`` is None and ``i not in known``). The one rule every at-rest shortcut
    fills its dict by (``ServingStream``, and the chat layer's per-mode ``RestTexts``).
    ``known`` is shared across threads: the text is a function of the id and of the dict's
    key (callers pass the ``quick`` and ``first`` the key was made from), made first and
    stored by one assignment, so a reader finds it whole or not at all (``TokenTable``,
    "Sharing across threads")."""
    if not 0 <= token_id < len(quick):
        return None  # not recorded: the ids outside the table are unbounded
    text = quick[token_id]
    if text is not None and first is not None and first(text) is not None:
        text = None
    known[token_id] = text
    return text


def _standalone(piece: bytes | None) -> str | None:
    if piece is None:
        return None
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return None


def surrogate_prefix(held: bytes) -> bool:
    """ED A0..BF: the start of an encoded surrogate, certainly invalid UTF-8.

    CPython's UTF-8 decoder keeps these two bytes for a third (every other invalid prefix it
    rejects at once), while a full decode, Python's or Rust's ``from_utf8_lossy``, already
    renders each as U+FFFD. Checked by hand so certain invalid bytes leave at once.
    """
    return len(held) >= 2 and held[0] == 0xED and held[1] >= 0xA0


def _split(piece: bytes) -> tuple[str, bytes]:
    """(text, held tail) of ``piece`` decoded from a clean start, as the stream decodes it."""
    text, used = codecs.utf_8_decode(piece, "replace", False)
    tail = piece[used:]
    if surrogate_prefix(tail):
        return text + "\ufffd" * len(tail), b""
    return text, tail


def decode_with_table(table: TokenTable, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    """Decode ``ids`` in one go, exactly as the table's tokenizer would (the reference)."""
    skip = table.special_ids if skip_special_tokens else frozenset()
    kept = [i for i in ids if i not in skip]
    if table.family == "byte_level":
        return b"".join(table.pieces[i] for i in kept).decode("utf-8", "replace")
    out: list[str] = []
    run = bytearray()
    count = 0

    def close() -> None:
        nonlocal count
        if count:
            try:
                out.append(bytes(run).decode("utf-8"))
            except UnicodeDecodeError:
                out.append("\ufffd" * count)
            run.clear()
            count = 0

    for i in kept:
        b = table.byte_values[i]
        if b >= 0:
            run.append(b)
            count += 1
        else:
            close()
            out.append(table.pieces[i])
    close()
    text = "".join(out)
    if table.strip_leading_space and text.startswith(" "):
        text = text[1:]
    return text


# --- building -------------------------------------------------------------------------


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


_cache_lock = threading.Lock()
_weak_cache: weakref.WeakKeyDictionary[Any, tuple[TokenTable | None, str]] = weakref.WeakKeyDictionary()
_strong_cache: dict[int, tuple[Any, tuple[TokenTable | None, str]]] = {}


def build_table(tokenizer: Any) -> tuple[TokenTable | None, str]:
    """The verified table for ``tokenizer`` (cached), or ``(None, why)`` for the generic path."""
    if isinstance(tokenizer, TokenTable):
        return tokenizer, "prebuilt table"
    with _cache_lock:
        try:
            hit = _weak_cache.get(tokenizer)
        except TypeError:
            entry = _strong_cache.get(id(tokenizer))
            hit = entry[1] if entry is not None and entry[0] is tokenizer else None
        if hit is not None:
            return hit
        table, why = _try_build(tokenizer)
        if table is not None:
            mismatch = _verify(table, tokenizer.decode)
            if mismatch is not None:
                table, why = None, mismatch
        result = (table, why)
        try:
            _weak_cache[tokenizer] = result
        except TypeError:
            if len(_strong_cache) >= 32:
                _strong_cache.pop(next(iter(_strong_cache)))
            _strong_cache[id(tokenizer)] = (tokenizer, result)
        return result
