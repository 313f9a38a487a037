"""Test oracles shared by the core tests: the exact formula and the promptness oracle."""

from __future__ import annotations

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
