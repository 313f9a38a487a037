"""Timers for the model's step: CUDA events on CUDA, ``perf_counter_ns`` on CPU.

A model step (forward plus picking) is timed apart from the detokenizer's pushes
(``docs/runner.md``, "Timing"). On CPU the work is synchronous, so host clocks around the
step measure it. On CUDA, host timestamps around asynchronous kernel launches would measure
the launches, not the step: a pair of events is recorded on the stream itself per step and
read once, after a synchronize.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from ._deps import torch

__all__ = ["CpuClock", "CudaClock", "StepClock", "clock_for", "synchronize"]


class StepClock(Protocol):
    """``start()`` and ``stop()`` around each model step; ``elapsed_ns()`` once at the end."""

    @property
    def name(self) -> str: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def elapsed_ns(self) -> tuple[int, ...]: ...


@dataclass(slots=True)
class CpuClock:
    """Model-step timer on CPU: ``perf_counter_ns`` around each step (CPU work is synchronous)."""

    name: str = "perf_counter_ns"
    _t0: int = 0
    _ns: list[int] = field(default_factory=list)

    def start(self) -> None:
        self._t0 = time.perf_counter_ns()

    def stop(self) -> None:
        self._ns.append(time.perf_counter_ns() - self._t0)

    def elapsed_ns(self) -> tuple[int, ...]:
        return tuple(self._ns)


@dataclass(slots=True)
class CudaClock:
    """Model-step timer on CUDA: a pair of events per step, read once after a synchronize."""

    name: str = "cuda_events"
    _starts: list[torch.cuda.Event] = field(default_factory=list)
    _ends: list[torch.cuda.Event] = field(default_factory=list)

    def start(self) -> None:
        self._starts.append(_recorded_event())

    def stop(self) -> None:
        self._ends.append(_recorded_event())

    def elapsed_ns(self) -> tuple[int, ...]:
        torch.cuda.synchronize()
        return tuple(int(s.elapsed_time(e) * 1e6) for s, e in zip(self._starts, self._ends))


def _recorded_event() -> torch.cuda.Event:
    """A timing event recorded on the current stream."""
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch 2.13 leaves __new__ unannotated
    event.record()
    return event


def clock_for(device: torch.device) -> StepClock:
    """The step timer that measures the work on ``device``."""
    return CudaClock() if device.type == "cuda" else CpuClock()


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op off CUDA), so a host clock reads a finished step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
