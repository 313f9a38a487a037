"""Shared benchmark plumbing: real tokenizers, real multilingual streams, interleaved timing."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

import tokenizer_zoo  # noqa: E402,F401  (re-exported to the benchmark scripts)

OUT = ROOT / "benchmarks" / "out"

PARAGRAPHS = {
    "english": (
        "The quick brown fox jumps over the lazy dog. Streaming servers send text after every "
        "token, and a careful detokenizer never ships half a character.\n"
        "Stop strings, tool calls and reasoning blocks must not leak, arrive late or vanish.\n"
    ),
    "chinese": (
        "模型输出的是词元编号，而人们需要看到文字。流式服务器在每个词元之后发送文本，"
        "字节级分词常常在一个汉字的中间结束。\n我们提供正确的方案，既精确又及时。\n"
    ),
    "japanese": (
        "モデルはトークンIDを出力し、人は文字を読みます。ストリーミングでは、"
        "ひらがなやカタカナが途中で切れることがあります。\n正確で、すぐに届く文字列を。\n"
    ),
    "emoji": "🫨👨‍👩‍👧‍👦🇯🇵❤️‍🔥👍🏽 🎉🚀🌶️ party time 🥳🍣🗻\n",
}


def token_stream(tok, language: str, n: int) -> list[int]:
    """The first ``n`` ids of a long real text in ``language``."""
    text = PARAGRAPHS[language]
    ids: list[int] = []
    while len(ids) < n:
        text = text * 2
        ids = tok.encode(text, add_special_tokens=False)
    return ids[:n]


def interleaved_medians(
    runners: dict[str, Callable[[], None]], repeats: int, warmup: int = 1
) -> dict[str, float]:
    """Median seconds per call of each runner, the runners interleaved in every repeat.

    Seconds of this process's CPU time (``time.process_time_ns``), not of the wall clock:
    every runner is single-threaded work on the CPU, and on a shared machine the wall clock
    also counts the time the process waits for a core, which is other workers' load."""
    for _ in range(warmup):
        for fn in runners.values():
            fn()
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(repeats):
        for name, fn in runners.items():
            t0 = time.process_time_ns()
            fn()
            samples[name].append((time.process_time_ns() - t0) / 1e9)
    return {k: statistics.median(v) for k, v in samples.items()}


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def built_qwen3():
    """Qwen3's real tokenizer as the test venv built it, for a venv (SGLang's) that lacks the
    package ``tokenizer_zoo`` keys its directory by."""
    from transformers import AutoTokenizer

    built = sorted(tokenizer_zoo.CACHE_DIR.glob("qwen3-*/tokenizer.json"))
    if not built:
        raise SystemExit("build Qwen3's tokenizer first: .venv/bin/python -c \"import sys; sys.path.insert(0, 'tests/support'); "
                         "import tokenizer_zoo; tokenizer_zoo.directory('qwen3')\"")
    return AutoTokenizer.from_pretrained(built[-1].parent)
