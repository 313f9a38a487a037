"""Token tables: what each token id contributes to the decoded text, per tokenizer family.

A table is built once per tokenizer, verified against the tokenizer's own ``decode`` and
cached (``_table_build.build_table``); every stream on that tokenizer shares it, across
threads. What it is built from is immutable; the memos that streams fill in as they run
are filled so that any thread may read them without a lock (``TokenTable``, "Sharing
across threads").

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

__all__ = ["Family", "TokenTable", "decode_with_table", "learn_rest_text", "surrogate_prefix"]

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
