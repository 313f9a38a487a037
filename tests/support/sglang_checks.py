"""What the SGLang tests check on a stream of deltas: exact text, and late characters."""

from __future__ import annotations

from typing import Any

__all__ = ["late_characters", "verdict"]


def verdict(run: dict[str, Any], oracle: dict[str, Any]) -> list[str]:
    """Every way one run's deltas differ from the oracle; [] if exact."""
    problems = []
    shipped = ""
    for step, text in run["deltas"]:
        shipped += text
        if not oracle["text"].startswith(shipped):
            problems.append(f"step {step} shipped {shipped[-12:]!r}, not a prefix of the text {oracle['text']!r}")
            break
    if shipped != oracle["text"]:
        problems.append(f"text {shipped!r} != {oracle['text']!r}")
    if run["steps"] != oracle["steps"]:
        problems.append(f"generation ran {run['steps']} steps, the stop or EOS ends it at {oracle['steps']}")
    return problems


def late_characters(run: dict[str, Any], settled: list[int]) -> int:
    """Characters shipped after the step that settled them. ``settled[k]``: how many
    characters of the final text are known after step k+1, outside a genuine partial stop."""
    shipped_by: list[int] = []  # characters shipped by the end of each step
    total = 0
    deltas = {step: 0 for step in range(1, len(settled) + 1)}
    for step, text in run["deltas"]:
        deltas[step] = deltas.get(step, 0) + len(text)
    for step in sorted(deltas):
        total += deltas[step]
        shipped_by.append(total)
    late = 0
    for k, known in enumerate(settled):
        before = settled[k - 1] if k else 0
        for j in range(before, known):  # the characters step k+1 settled
            ship = next((n for n, s in enumerate(shipped_by) if s > j), len(shipped_by))
            late += ship > k
    return late
