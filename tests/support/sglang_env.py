"""Where the SGLang tests find SGLang: ``.venv-sglang`` (``scripts/setup_sglang.sh``).

SGLang 0.5.23 pins transformers 5.19 (the test venv's vLLM 0.33 wants 5.20), so it lives in
its own venv, and the tests drive it through subprocesses. Without it they skip, saying so.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

__all__ = ["REPO", "SGLANG_PYTHON", "require_sglang", "sglang_run"]

REPO = Path(__file__).resolve().parents[2]

#: The venv's python (``DETOK_SGLANG_VENV`` names another venv, as the setup script reads it).
SGLANG_PYTHON = REPO / os.environ.get("DETOK_SGLANG_VENV", ".venv-sglang") / "bin" / "python"


def require_sglang() -> None:
    """Skip the calling module unless ``.venv-sglang`` has SGLang 0.5.23."""
    if not SGLANG_PYTHON.exists():
        pytest.skip(f"no {SGLANG_PYTHON.parent.parent.name}: run `bash scripts/setup_sglang.sh`", allow_module_level=True)


def sglang_run(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``.venv-sglang``'s python with ``args`` (the repository as working directory)."""
    full_env = {k: v for k, v in os.environ.items() if k != "DETOK_PLUGIN"}  # each test says its own
    full_env.update({"PYTHONWARNINGS": "ignore", **(env or {})})
    return subprocess.run(
        [str(SGLANG_PYTHON), *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
    )
