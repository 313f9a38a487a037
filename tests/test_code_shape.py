"""The code's shape: ruff over the repository; mypy strict over the core, the integrations
and the reference runner; every module of the three at most 450 lines and no function above
cyclomatic complexity 15 as radon counts it; no import cycle among their modules, lazy or
not; and no module outside the core reading a private attribute of a core object or
importing a private core module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Source folder -> the package it installs as (pyproject's package-dir).
PACKAGES = {"detok_plugin": "detok_plugin", "integrations": "detok_plugin.integrations", "gpu_runner": "detok_plugin.gpu_runner"}
SOURCES = sorted(p for folder in PACKAGES for p in (ROOT / folder).rglob("*.py"))
MAX_LINES = 450
MAX_COMPLEXITY = 15


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def _name(path: Path) -> str:
    """The installed module name of a source file."""
    rel = path.relative_to(ROOT)
    parts = [PACKAGES[rel.parts[0]], *rel.parts[1:]]
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_ruff_passes_on_the_repository() -> None:
    pytest.importorskip("ruff")
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_passes_on_the_core_the_integrations_and_the_runner() -> None:
    pytest.importorskip("mypy")
    done = _run("mypy", "--no-incremental", "--cache-dir", "/dev/null")  # [tool.mypy] in pyproject.toml
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_is_one_concept_of_a_few_hundred_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES}): split it by concept"


def test_no_function_is_above_complexity_15() -> None:
    radon = pytest.importorskip("radon.complexity")
    over = []
    for path in SOURCES:
        for block in radon.cc_visit(path.read_text(encoding="utf-8")):
            for item in [block, *getattr(block, "methods", [])]:
                if getattr(item, "letter", "F") in "FM" and item.complexity > MAX_COMPLEXITY:
                    over.append(f"{path.relative_to(ROOT)}:{item.lineno} {item.fullname} ({item.complexity})")
    assert not over, "functions above complexity 15: " + ", ".join(over)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports anywhere in it (top level or inside a function)."""
    name = _name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from pkg import sub`` imports the submodule; ``from pkg import name``, pkg itself.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        found |= {t for t in targets if t in modules and t != name}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_import_cycle_lazy_or_not() -> None:
    """Edges: ``import m``, ``from m import name`` (m's ``__init__`` for a package) and
    ``from pkg import sub`` (the submodule); a package's ``__init__`` importing its own
    submodules is its public face, and a submodule that reads names from its package's
    ``__init__`` would close a cycle."""
    modules = {_name(p) for p in SOURCES}
    graph = {_name(p): _imports(p, modules) for p in SOURCES}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def _core_private_names() -> set[str]:
    """Every ``_name`` the core defines: attributes, methods, slots and module globals."""
    names: set[str] = set()
    for path in (ROOT / "detok_plugin").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)  # __slots__ entries
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_outside_the_core_reads_a_core_private() -> None:
    """Outside ``detok_plugin/``, no ``x._name`` where ``_name`` is a private of the core
    (except on ``self``/``cls``, an object's own), and no import of a private core module."""
    private = _core_private_names()
    found = []
    for path in SOURCES:
        if path.is_relative_to(ROOT / "detok_plugin"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and node.attr in private:
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{where} {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("detok_plugin"):
                module = node.module or ""
                names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if any(part.startswith("_") for part in module.split(".")) or names:
                    found.append(f"{where} from {module} import {', '.join(names) or '...'}")
    assert not found, "core privates read outside the core: " + ", ".join(found)


def test_the_private_check_can_fail(tmp_path: Path) -> None:
    """The check above, on a planted read: ``state._mode_at_rest()`` outside the core."""
    private = _core_private_names()
    tree = ast.parse("def f(state):\n    return state._mode_at_rest()\n")
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in private]
    assert [ast.unparse(h) for h in hits] == ["state._mode_at_rest"]


def test_the_cycle_check_can_fail() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
