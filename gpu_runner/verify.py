"""The checks behind ``detok-plugin verify``: every sequence's stream against its full decode.

For each sequence, with the runner's EOS definition (``runner.py``: the EOS id ends the
stream and its text is left out), two properties:

1. *exact*: the joined stream equals ``decode(prompt + text_ids)[len(decode(prompt)):]``
   with the same ``skip_special_tokens``;
2. *clean*: the stream holds no U+FFFD unless the full decode holds it too (a model can
   emit invalid UTF-8; then U+FFFD is the honest text, and exactness still applies).

Beside them, the U+FFFD count of the naive stream (``tokenizer.decode([id])`` per token,
joined) shows what the plugin saves a user from.

>>> count_fffd("caf\\ufffd \\ufffd")
2
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .prompts import VERIFY_PROMPTS, VerifyPrompt
from .results import RunStats, SequenceResult, merge_stats
from .settings import GenerationSettings

if TYPE_CHECKING:
    from .runner import Runner

__all__ = [
    "SequenceCheck",
    "VerifyReport",
    "check_sequence",
    "count_fffd",
    "expected_text",
    "merge_stats",
    "naive_text",
    "run_verify",
]

FFFD = "\ufffd"


def count_fffd(text: str) -> int:
    return text.count(FFFD)


def expected_text(tokenizer: Any, prompt_ids: Sequence[int], ids: Sequence[int], *, skip_special_tokens: bool) -> str:
    """The full decode of ``prompt + ids`` with the prompt's own decode cut off the front."""
    full: str = tokenizer.decode(list(prompt_ids) + list(ids), skip_special_tokens=skip_special_tokens)
    prompt: str = tokenizer.decode(list(prompt_ids), skip_special_tokens=skip_special_tokens)
    return full[len(prompt) :]


def naive_text(tokenizer: Any, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
    """What a per-token stream shows: each id decoded alone, joined (the bug the plugin fixes)."""
    return "".join(tokenizer.decode([i], skip_special_tokens=skip_special_tokens) for i in ids)


@dataclass(frozen=True, slots=True)
class SequenceCheck:
    label: str
    tokens: int
    finish_reason: str
    exact: bool
    fffd_stream: int
    fffd_decode: int
    fffd_naive: int
    text: str
    expected: str

    @property
    def clean(self) -> bool:
        return self.fffd_decode > 0 or self.fffd_stream == 0

    @property
    def ok(self) -> bool:
        return self.exact and self.clean

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "tokens": self.tokens,
            "finish_reason": self.finish_reason,
            "ok": self.ok,
            "exact": self.exact,
            "clean": self.clean,
            "fffd_stream": self.fffd_stream,
            "fffd_decode": self.fffd_decode,
            "fffd_naive": self.fffd_naive,
            "text": self.text,
        }


def check_sequence(tokenizer: Any, seq: SequenceResult, *, skip_special_tokens: bool, label: str = "") -> SequenceCheck:
    """Check one :class:`~detok_plugin.gpu_runner.SequenceResult` (properties 1 and 2)."""
    expected = expected_text(tokenizer, seq.prompt_ids, seq.text_ids, skip_special_tokens=skip_special_tokens)
    text = seq.text
    return SequenceCheck(
        label=label or str(seq.index),
        tokens=len(seq.token_ids),
        finish_reason=seq.finish_reason,
        exact=text == expected,
        fffd_stream=count_fffd(text),
        fffd_decode=count_fffd(expected),
        fffd_naive=count_fffd(naive_text(tokenizer, seq.text_ids, skip_special_tokens=skip_special_tokens)),
        text=text,
        expected=expected,
    )


@dataclass(frozen=True, slots=True)
class VerifyReport:
    model: str
    settings: GenerationSettings
    batch: int
    checks: tuple[SequenceCheck, ...]
    stats: RunStats

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "ok": self.ok,
            "model": self.model,
            "batch": self.batch,
            "settings": {
                "max_new_tokens": s.max_new_tokens,
                "temperature": s.temperature,
                "top_k": s.top_k,
                "seed": s.seed,
                "skip_special_tokens": s.skip_special_tokens,
            },
            "sequences": [c.as_dict() for c in self.checks],
            "stats": self.stats.as_dict(),
        }


def run_verify(
    runner: Runner,
    settings: GenerationSettings,
    *,
    batch: int = 4,
    prompts: Sequence[VerifyPrompt] = VERIFY_PROMPTS,
    warmup: bool = False,
) -> VerifyReport:
    """Run ``prompts`` through ``runner`` ``batch`` at a time and check every sequence.

    ``warmup`` first runs one short, untimed batch: the first forward passes after a load pay
    one-time costs (allocator growth, kernel selection) that are not the steady step.
    """
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    if warmup:
        runner.generate([p.text for p in prompts[:batch]], replace(settings, max_new_tokens=2))
    checks: list[SequenceCheck] = []
    stats = []
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        result = runner.generate([p.text for p in group], settings)
        stats.append(result.stats)
        for p, seq in zip(group, result.sequences):
            checks.append(check_sequence(runner.tokenizer, seq, skip_special_tokens=settings.skip_special_tokens, label=p.label))
    return VerifyReport(runner.name, settings, batch, tuple(checks), merge_stats(stats))
