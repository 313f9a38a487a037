"""CanIToolCall's fixtures (PyPI ``canitoolcall``, installed in the test venv), read as data.

Each fixture is one recorded model output (``raw_output``), the tools offered, and the parse
a correct engine must give (``expected``) or the outcomes allowed for a truncated or
malformed output (``expected_error``); the package's ``_data/spec/README.md`` defines them.
Only the files are read: the package is never imported.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

__all__ = ["family_json", "fixtures", "params"]


def _root() -> Path:
    try:
        dist = metadata.distribution("canitoolcall")
    except metadata.PackageNotFoundError:
        pytest.skip("canitoolcall is not installed (scripts/setup.sh installs it)", allow_module_level=True)
    return Path(str(dist.locate_file("canitoolcall/_data/fixtures")))


def fixtures(family: str, *, tag: str | None = None) -> list[dict[str, Any]]:
    """Every fixture of ``family`` (its folder name), in file and line order; only those
    tagged ``tag`` when given."""
    out = []
    for path in sorted((_root() / family).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                fx = json.loads(line)
                if tag is None or tag in fx["tags"]:
                    out.append(fx)
    return out


def family_json(family: str) -> dict[str, Any]:
    """The family's ``family.json``: its markers and reference models (each with its
    ``default_generation_prompt``)."""
    data: dict[str, Any] = json.loads((_root() / family / "family.json").read_text(encoding="utf-8"))
    return data


def params(items: list[dict[str, Any]]) -> list[Any]:
    """``pytest.param(fixture, id=its id)`` for each."""
    return [pytest.param(fx, id=fx["id"].split("/", 1)[1]) for fx in items]
