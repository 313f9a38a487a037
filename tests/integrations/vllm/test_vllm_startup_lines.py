"""What a vLLM process says about the switch: one line, in every state, and nothing from the
other stacks' start-up hooks (``detok_plugin.integrations.vllm.plugin``, ``common.startup``).

A regular install ships the transformers and TGI ``.pth`` hooks, and Python runs them in
vLLM's processes too; they must stay silent there (their frameworks' modules are never
imported by vLLM), whatever ``DETOK_PLUGIN`` says. vLLM 0.33's Rust frontend
(``VLLM_USE_RUST_FRONTEND=1``) answers HTTP without Python, so the plugin cannot act: the
processes where it loads say so instead of "on".
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("vllm.v1.engine.output_processor", reason="vLLM is not installed")

from detok_plugin.integrations import tgi, transformers  # noqa: E402
from detok_plugin.integrations import vllm as shim  # noqa: E402
from detok_plugin.integrations.common.patches import PATCHES  # noqa: E402
from detok_plugin.integrations.vllm import plugin as vllm_plugin  # noqa: E402
from vllm.parser import ParserManager  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OFF = "vLLM keeps its stock detokenizer"


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch):
    """Each test as a new process would see it: nothing said yet, no switch in the environment."""
    for name in ("DETOK_PLUGIN", "VLLM_PLUGINS", "VLLM_USE_RUST_FRONTEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(vllm_plugin, "_Startup", vllm_plugin._StartupState())
    yield
    shim.unregister()


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno > logging.DEBUG]


@pytest.mark.parametrize(
    "env, level, line",
    [
        pytest.param({}, logging.INFO,
                     f"detok-plugin: off (neither DETOK_PLUGIN=1 nor VLLM_PLUGINS naming detok_plugin is set); {OFF}",
                     id="unset"),
        pytest.param({"DETOK_PLUGIN": "0"}, logging.INFO, f"detok-plugin: off (DETOK_PLUGIN=0); {OFF}", id="off"),
        pytest.param({"DETOK_PLUGIN": "maybe"}, logging.WARNING,
                     "detok-plugin: off (DETOK_PLUGIN='maybe' is not one of 1/0/true/false/yes/no/on/off; "
                     f"ignored); {OFF}", id="mistaken"),
        pytest.param({"DETOK_PLUGIN": "1"}, logging.INFO, "detok-plugin: on (DETOK_PLUGIN=1), replacing vLLM", id="on"),
        pytest.param({"VLLM_PLUGINS": "detok_plugin"}, logging.INFO,
                     "detok-plugin: on (VLLM_PLUGINS names detok_plugin), replacing vLLM", id="VLLM_PLUGINS"),
    ],
)
def test_each_state_of_the_switch_is_said_in_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, env: dict[str, str], level: int, line: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    vllm_root = logging.getLogger("vllm")  # vLLM's logging is set up: lines go out now
    monkeypatch.setattr(vllm_root, "handlers", [*vllm_root.handlers, logging.NullHandler()])
    with caplog.at_level(logging.DEBUG, logger="vllm.detok_plugin"):
        shim.register()
        shim.register()  # vLLM may load plugins twice in one process: still one line
    [(got_level, got)] = said(caplog)
    assert got_level == level and got.startswith(line), got


def test_the_rust_frontend_keeps_vllm_stock_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``VLLM_USE_RUST_FRONTEND=1 vllm serve``: HTTP, detokenizing and chat parsing happen in
    vLLM's Rust binary; the plugin loads only in Python processes that never make text for
    clients (the launcher, the engine core). It patches nothing and says so, once."""
    monkeypatch.setenv("DETOK_PLUGIN", "1")
    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "1")
    with caplog.at_level(logging.DEBUG, logger="vllm.detok_plugin"):
        assert not shim.register()
        assert not shim.register()
    [(level, line)] = said(caplog)
    assert level == logging.WARNING
    assert line.startswith("detok-plugin: NOT switched on (DETOK_PLUGIN=1): VLLM_USE_RUST_FRONTEND=1")
    assert "this server runs stock vLLM" in line and "unset VLLM_USE_RUST_FRONTEND" in line
    assert not shim.is_registered()
    assert not PATCHES.is_ours(ParserManager, "_compose_parser")
    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "0")
    assert shim.register()


_VLLM_PROCESS = textwrap.dedent(
    """
    import site, sys
    site.addsitedir({site_dir!r})           # runs the .pth hooks, as Python's start-up does
    import vllm.plugins
    vllm.plugins.load_general_plugins()     # what every vLLM process does
    import vllm.logger
    from vllm.config.logging import LoggingConfig
    vllm.logger.configure_logging(LoggingConfig())  # what every vLLM entry point does
    print("streamers imported:", "transformers.generation.streamers" in sys.modules, file=sys.stderr)
    """
)


@pytest.mark.parametrize("flag", ["maybe", "0", "1"])
def test_a_vllm_process_with_every_hook_installed_says_one_line(tmp_path: Path, flag: str) -> None:
    """The transformers and TGI hooks are installed (their ``.pth`` lines, as a regular
    install ships them) and run at start; with any value of the switch, the process's only
    detok-plugin line is vLLM's own, and no raw ``UserWarning``."""
    assert transformers._main(["install-pth", "--site-dir", str(tmp_path)]) == 0
    assert tgi._main(["install-pth", "--site-dir", str(tmp_path)]) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("DETOK_PLUGIN", "VLLM_PLUGINS", "PYTHONWARNINGS")}
    env["DETOK_PLUGIN"] = flag
    out = subprocess.run(
        [sys.executable, "-c", _VLLM_PROCESS.format(site_dir=str(tmp_path))],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    lines = [line for line in text.splitlines() if "detok-plugin" in line]
    assert len(lines) == 1, lines
    want = "detok-plugin: on (DETOK_PLUGIN=1)" if flag == "1" else f"detok-plugin: off (DETOK_PLUGIN={flag if flag == '0' else repr(flag)}"
    assert want in lines[0] and ("transformers" not in lines[0]) and ("TGI" not in lines[0]), lines
    assert "UserWarning" not in text and "streamers imported: False" in out.stderr
