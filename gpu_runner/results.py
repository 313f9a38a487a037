"""What one ``generate`` call returns: each row's outcome, and where the time went.

:class:`SequenceResult` is one row (its ids, the text each step released, why it ended);
:class:`RunStats` keeps the model's time and the detokenizer's apart (``docs/runner.md``,
"Timing"); :class:`RunResult` holds both. Plain data, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from detok_plugin import ToolCall

__all__ = ["RunResult", "RunStats", "SequenceResult", "merge_stats"]


@dataclass(frozen=True, slots=True)
class SequenceResult:
    """One row's outcome: its ids, the text each step released, and why it ended."""

    index: int
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    chunks: tuple[str, ...]
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    stop_reason: str | int | None

    @property
    def text(self) -> str:
        """The content stream, joined."""
        return "".join(self.chunks)

    @property
    def stopped_by_token(self) -> bool:
        """True when an EOS (``stop_reason is None``) or stop-token id ended the row."""
        return self.finish_reason == "stop" and not isinstance(self.stop_reason, str)

    @property
    def text_ids(self) -> tuple[int, ...]:
        """The generated ids whose text the stream carries: a final EOS or stop id dropped."""
        return self.token_ids[:-1] if self.stopped_by_token else self.token_ids


@dataclass(frozen=True, slots=True)
class RunStats:
    """Where one ``generate`` call's time went.

    ``model_ns`` holds one entry per forward pass (the prefill first); ``detok_ns`` is the
    total time inside ``DetokenizerState.push``/``finish`` over ``tokens`` pushes.

    >>> s = RunStats("cpu", "perf_counter_ns", 1, tokens=2, wall_ns=10**9, model_ns=(5_000_000, 1_000_000), detok_ns=20_000)
    >>> s.tokens_per_s, s.model_ms_per_step, s.detok_us_per_token
    (2.0, 1.0, 10.0)
    """

    device: str
    timer: str
    batch: int
    tokens: int
    wall_ns: int
    model_ns: tuple[int, ...]
    detok_ns: int

    @property
    def steps(self) -> int:
        return len(self.model_ns)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens, all rows together, per second of wall time (prefill included)."""
        return self.tokens / (self.wall_ns / 1e9) if self.wall_ns else 0.0

    @property
    def prefill_ms(self) -> float:
        return self.model_ns[0] / 1e6 if self.model_ns else 0.0

    @property
    def model_ms_per_step(self) -> float:
        """Mean decode-step time (forward through the cache plus picking), prefill excluded."""
        decode = self.model_ns[1:] or self.model_ns
        return sum(decode) / len(decode) / 1e6 if decode else 0.0

    @property
    def detok_us_per_token(self) -> float:
        return self.detok_ns / self.tokens / 1e3 if self.tokens else 0.0

    @property
    def detok_share(self) -> float:
        """The detokenizer's fraction of a decode step: its per-step time over the step's total."""
        if not self.steps:
            return 0.0
        per_step = self.detok_ns / self.steps / 1e6
        return per_step / (per_step + self.model_ms_per_step) if per_step else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "timer": self.timer,
            "batch": self.batch,
            "steps": self.steps,
            "tokens": self.tokens,
            "wall_s": self.wall_ns / 1e9,
            "tokens_per_s": self.tokens_per_s,
            "prefill_ms": self.prefill_ms,
            "model_ms_per_step": self.model_ms_per_step,
            "detok_us_per_token": self.detok_us_per_token,
            "detok_share": self.detok_share,
        }


@dataclass(frozen=True, slots=True)
class RunResult:
    sequences: tuple[SequenceResult, ...]
    stats: RunStats


def merge_stats(parts: Sequence[RunStats]) -> RunStats:
    """One :class:`RunStats` for several ``generate`` calls (batches run one after another)."""
    return RunStats(
        device=parts[0].device,
        timer=parts[0].timer,
        batch=max(p.batch for p in parts),
        tokens=sum(p.tokens for p in parts),
        wall_ns=sum(p.wall_ns for p in parts),
        # Each call's prefill stays first in the merged list only for the first call; the
        # others' prefills count as steps, a small bias towards a slower model step.
        model_ns=tuple(ns for p in parts for ns in p.model_ns),
        detok_ns=sum(p.detok_ns for p in parts),
    )
