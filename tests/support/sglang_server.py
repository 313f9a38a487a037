"""A real ``sglang.launch_server`` of SmolLM2-135M on this CPU, for the SGLang server tests.

SGLang 0.5.23 runs from ``.venv-sglang`` (``scripts/setup_sglang.sh``) with
``SGLANG_USE_CPU_ENGINE=1 --device cpu --attention-backend torch_native
--disable-overlap-schedule``: torch's path in every layer (the inert kernel stand-ins only
let it import). ``--enable-custom-logit-processor`` lets a request force scripted ids
(``tests/support/sglang_script``). The model is the safetensors directory
``scripts/setup_vllm_engine.sh`` converts (its last line of stdout).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sglang_env import REPO, SGLANG_PYTHON

__all__ = ["Server", "model_dir", "scripted_processor", "stream"]

SCRIPT_DIR = REPO / "tests" / "support" / "sglang_script"


@functools.cache
def model_dir() -> Path:
    """SmolLM2-135M-Instruct as safetensors: the directory ``scripts/setup_vllm_engine.sh``
    prints (converted once and cached by the runner; read here without a shell)."""
    from detok_plugin.gpu_runner.convert import default_model_directory

    return default_model_directory(progress=None)


def scripted_processor() -> str:
    """What ``ScriptedIds.to_str()`` gives (SGLang's processor string: the class pickled by
    reference, which dill loads in the server), written here without importing SGLang."""
    by_reference = b"\x80\x02cdetok_sglang_script\nScriptedIds\nq\x00."
    return json.dumps({"callable": by_reference.hex()})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One ``sglang.launch_server`` process group; ``env`` adds to the environment."""

    def __init__(self, model: Path, env: dict[str, str]) -> None:
        self.port = _free_port()
        self.log = Path(tempfile.mkstemp(prefix="sglang-server-", suffix=".log")[1])
        full_env = {k: v for k, v in os.environ.items() if k != "DETOK_PLUGIN"}
        # One torch thread each: two servers share this machine's cores.
        full_env.update(
            {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(SCRIPT_DIR), **env}
        )
        args = [
            str(SGLANG_PYTHON), "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu",
            "--attention-backend", "torch_native", "--disable-overlap-schedule", "--enable-custom-logit-processor",
            "--host", "127.0.0.1", "--port", str(self.port), "--skip-server-warmup", "--max-total-tokens", "8192",
            "--max-running-requests", "8",
        ]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float) -> None:
        """Until ``/model_info`` answers; raises with the log's tail if it does not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sglang exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/model_info", timeout=2):
                    return
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"sglang did not start in {timeout:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def lines(self, needle: str) -> list[str]:
        return [line for line in self.log.read_text(errors="replace").splitlines() if needle in line]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)


def stream(url: str, path: str, body: dict[str, Any], timeout: float = 180) -> Iterator[dict[str, Any]]:
    """The server-sent events of one streaming request, as dicts."""
    request = urllib.request.Request(
        url + path, json.dumps({**body, "stream": True}).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                yield json.loads(line[len("data:") :])
