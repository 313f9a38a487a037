"""Test oracles shared by the core tests: the exact formula and the promptness oracle."""

from __future__ import annotations

import codecs
import os
from collections.abc import Sequence
from typing import Any

from detok_plugin import DetokenizerState, build_table

MULTILINGUAL = (
    "你好，世界！今天天气很好。",
    "こんにちは、カタカナとひらがな。",
    "مرحبا بالعالم، كيف حالك؟",
    "Здравствуй, мир. Привет!",
    "🫨 👨‍👩‍👧‍👦 🇯🇵 ❤️‍🔥 👍🏽",
    "def f(x):\n    return x ** 2  # 二乗\n",
    "नमस्ते दुनिया। ภาษาไทย ᄀᄁ 한국어 텍스트",
    "  double  spaces and\ttabs\n\n new lines ",
    "Ünïcödé café naïve façade — “quotes” … €100",
    "<think>reasoning</think> <tool_call>{\"name\": \"f\"}</tool_call>",
)


def expected(tok: Any, prompt: Sequence[int], out: Sequence[int], skip: bool = False) -> str:
    """Invariant 1: ``decode(prompt + out)[len(decode(prompt)):]``."""
    full = tok.decode(list(prompt) + list(out), skip_special_tokens=skip)
    return full[len(tok.decode(list(prompt), skip_special_tokens=skip)) :]


def stream(tok: Any, prompt: Sequence[int], chunks: Sequence[Sequence[int]], **kw: Any) -> list[str]:
    """Push ``chunks`` one push each; return each push's text, then finish()'s."""
    kw.setdefault("eos_token_ids", ())
    s = DetokenizerState.from_tokenizer(tok, prompt_ids=prompt, **kw)
    out = [s.push(list(c)).text for c in chunks]
    out.append(s.finish().text)
    return out


def probe_ids(tok: Any) -> list[list[int]]:
    """Continuations that between them change any unsettled tail: end of stream, an ASCII
    piece, and continuation-byte sequences that complete every valid UTF-8 prefix."""
    table, _ = build_table(tok)
    assert table is not None
    if table.family == "byte_level":
        find = {p: i for i, p in enumerate(table.pieces) if p is not None and len(p) == 1}
        byte = lambda b: find[bytes((b,))]  # noqa: E731
        letter = find[b"a"]
    else:
        find_b = {b: i for i, b in enumerate(table.byte_values) if b >= 0}
        byte = lambda b: find_b[b]  # noqa: E731
        letter = table.pieces.index("a")
    probes: list[list[int]] = [[], [letter]]
    for seq in ((0x80,), (0x80, 0x80), (0x80, 0x80, 0x80), (0xA0, 0x80), (0x90, 0x80, 0x80), (0xFF,)):
        try:
            probes.append([byte(b) for b in seq])
        except KeyError:  # some vocabularies lack bytes that never occur in UTF-8 (0xFF)
            if seq != (0xFF,):
                raise
    return probes


def settled(tok: Any, prompt: Sequence[int], out: Sequence[int], probes: list[list[int]], skip: bool) -> str:
    """The text no future token can change: the common prefix over the probe continuations."""
    texts = [expected(tok, prompt, list(out) + p, skip) for p in probes]
    return os.path.commonprefix(texts)


def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's byte-to-character map, inverted (byte-level BPE pieces spell bytes with it)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in keep]
    return {**{chr(b): b for b in keep}, **{chr(256 + n): b for n, b in enumerate(extra)}}


GPT2_BYTES = _gpt2_bytes()  # character -> byte


def _piece_bytes(piece: str) -> bytes | None:
    """A token's bytes: ``<0xNN>`` (SentencePiece byte fallback) or a byte-level piece."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes((int(piece[3:5], 16),))
    if all(c in GPT2_BYTES for c in piece):
        return bytes(GPT2_BYTES[c] for c in piece)
    return None


def _dangling(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a character no byte completed."""
    for n in (1, 2, 3):
        lead = data[-n] if len(data) >= n else None
        if lead is None:
            break
        need = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4 if 0xF0 <= lead <= 0xF4 else 0
        if need:
            try:
                codecs.getincrementaldecoder("utf-8")("strict").decode(data[-n:], final=False)
            except UnicodeDecodeError:
                return 0
            return n if n < need else 0
        if not 0x80 <= lead <= 0xBF:
            return 0
    return 0


def shown_by_a_server(tok: Any, prompt: Sequence[int], out: Sequence[int], skip: bool = False) -> str:
    """What a server shows for ``out`` when the engine ends it (``max_tokens``, a stop token,
    EOS): invariant 1's text less a last character no id completed, which the decode renders
    as U+FFFD and a stock detokenizer never releases (the core's ``drop_incomplete``).
    A byte-level decode renders that character as one U+FFFD; a SentencePiece byte run that
    ends inside a character renders whole as U+FFFD, so there it is the decode without the
    character's byte ids (one byte each)."""
    full = expected(tok, prompt, out, skip)
    if not full.endswith("\ufffd"):
        return full
    special = set(tok.all_special_ids)
    ids = [i for i in out if not (skip and i in special)]  # a skipped token is not there
    tail = b""
    for token_id in reversed(ids[-4:]):
        piece = tok.convert_ids_to_tokens(token_id)
        data = _piece_bytes(piece) if isinstance(piece, str) and token_id not in special else None
        if data is None:
            break
        tail = data + tail
    n = _dangling(tail)
    if not n:
        return full
    if str(tok.convert_ids_to_tokens(ids[-1])).startswith("<0x"):  # SentencePiece: one byte an id
        return expected(tok, prompt, ids[:-n], skip)
    return full[:-1]
