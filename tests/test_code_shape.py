"""The code's shape, checked as the review asked (issue 18): ruff over the repository, mypy
strict over the core, every core module at most 450 lines, no core function above
cyclomatic complexity 15 as radon counts it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "detok_plugin"
MAX_LINES = 450
MAX_COMPLEXITY = 15


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_passes_on_the_repository() -> None:
    pytest.importorskip("ruff")
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_passes_on_the_core() -> None:
    pytest.importorskip("mypy")
    done = _run("mypy", "--no-incremental", "--cache-dir", "/dev/null")  # [tool.mypy] in pyproject.toml
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_is_one_concept_of_a_few_hundred_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines (at most {MAX_LINES}): split it by concept"


def test_no_core_function_is_above_complexity_15() -> None:
    radon = pytest.importorskip("radon.complexity")
    over = []
    for path in sorted(CORE.glob("*.py")):
        for block in radon.cc_visit(path.read_text(encoding="utf-8")):
            for item in [block, *getattr(block, "methods", [])]:
                if getattr(item, "letter", "F") in "FM" and item.complexity > MAX_COMPLEXITY:
                    over.append(f"{path.name}:{item.lineno} {item.fullname} ({item.complexity})")
    assert not over, "functions above complexity 15: " + ", ".join(over)
