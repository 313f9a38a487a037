"""``detok-plugin chat``, ``verify`` and ``serve``, end to end in a subprocess.

Fast tests drive the CLI with ``--model`` pointing at a tiny random Qwen3 saved with the
real Qwen3 tokenizer into a temporary directory; ``slow`` tests run the embedded default,
SmolLM2-135M-Instruct, exactly as a newcomer would (``DETOK_CACHE_DIR`` points at the test
cache, where ``tokenizer_zoo`` already unpacked it, so nothing is downloaded twice).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tokenizer_zoo

torch = pytest.importorskip("torch")

from detok_plugin.gpu_runner import cli, tiny_random_model  # noqa: E402

SCRIPT = Path(sys.executable).parent / "detok-plugin"
KANA = ("\u3040", "\u30ff")


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the installed console script (or the module, where it is not installed)."""
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "detok_plugin.gpu_runner.cli"]
    env = {**os.environ, "DETOK_CACHE_DIR": str(tokenizer_zoo.CACHE_DIR), "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(cmd + list(args), capture_output=True, text=True, encoding="utf-8", timeout=timeout, env=env)


@pytest.fixture(scope="module")
def tiny_dir(qwen3, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformers model directory: a 2-layer random Qwen3 and the real Qwen3 tokenizer."""
    out = tmp_path_factory.mktemp("tiny-qwen3")
    tiny_random_model(qwen3, seed=0).save_pretrained(out)
    qwen3.save_pretrained(out)
    return out


def test_console_script_is_installed_and_helps() -> None:
    assert SCRIPT.exists(), "pip install -e . should have installed the detok-plugin console script"
    top = run_cli("--help")
    assert top.returncode == 0 and "chat" in top.stdout and "verify" in top.stdout
    chat = run_cli("chat", "--help")
    for option in ("--compare", "--stop", "--tags", "--reasoning", "--model"):
        assert option in chat.stdout
    verify = run_cli("verify", "--help")
    assert "--batch" in verify.stdout and "--json" in verify.stdout


def test_options_map_onto_settings() -> None:
    args = cli._parser().parse_args(
        ["chat", "hi", "--stop", "###", "--stop", "END", "--tags", "qwen3", "--reasoning", "strip",
         "--temperature", "0.7", "--seed", "5", "--top-k", "50", "--keep-special-tokens", "--max-new-tokens", "9"]
    )
    s = cli._settings(args)
    assert (s.stop, s.tags, s.reasoning) == (("###", "END"), "qwen3", "strip")
    assert (s.temperature, s.seed, s.top_k, s.max_new_tokens) == (0.7, 5, 50, 9)
    assert s.skip_special_tokens is False and s.chat_template is True


def test_docs_list_every_tag_preset_chat_takes() -> None:
    """docs/runner.md's ``chat`` row names exactly the presets ``--tags`` accepts."""
    from detok_plugin import TagSet

    doc = (Path(__file__).resolve().parents[2] / "docs" / "runner.md").read_text(encoding="utf-8")
    row = next(line for line in doc.splitlines() if line.startswith("| `detok-plugin chat"))
    listed = re.search(r"`--tags ([^`]+)`", row)
    assert listed is not None, row
    assert listed.group(1).split("\\|") == list(TagSet.presets())
    assert cli._parser().parse_args(["chat", "--tags", TagSet.presets()[-1]]).tags == TagSet.presets()[-1]


def test_verify_json_on_a_random_model(tiny_dir: Path) -> None:
    proc = run_cli("verify", "--model", str(tiny_dir), "--temperature", "1", "--seed", "7", "--device", "cpu",
                   "--batch", "3", "--max-new-tokens", "24", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["batch"] == 3
    assert len(report["sequences"]) == 8 and all(s["exact"] and s["tokens"] == 24 for s in report["sequences"])
    stats = report["stats"]
    assert stats["device"] == "cpu" and stats["tokens"] == 8 * 24
    assert stats["tokens_per_s"] > 0 and stats["model_ms_per_step"] > 0 and 0 < stats["detok_share"] < 1


def test_verify_repeats_the_set_to_fill_a_batch(tiny_dir: Path) -> None:
    """``--prompts 20 --batch 16``: the set of 8 repeated to 20 rows, run as a batch of 16
    and one of 4; sampling makes the repeats differ, and every row is checked."""
    proc = run_cli("verify", "--model", str(tiny_dir), "--temperature", "1", "--seed", "3", "--prompts", "20",
                   "--batch", "16", "--max-new-tokens", "6", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    seqs = report["sequences"]
    assert len(seqs) == 20 and all(s["exact"] for s in seqs)
    assert [s["label"] for s in seqs[8:16]] == [s["label"] for s in seqs[:8]]
    assert [s["text"] for s in seqs[8:16]] != [s["text"] for s in seqs[:8]]
    assert report["stats"]["batch"] == 16 and report["stats"]["tokens"] == 20 * 6
    proc = run_cli("verify", "--model", str(tiny_dir), "--prompts", "0")
    assert proc.returncode == 2 and "--prompts must be at least 1" in proc.stderr


def test_verify_prints_checks_and_timings(tiny_dir: Path) -> None:
    proc = run_cli("verify", "--model", str(tiny_dir), "--temperature", "1", "--batch", "8", "--max-new-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    assert "8/8 sequences: stream == full decode" in proc.stdout
    for figure in ("tokens/s", "ms/step", "µs/token", "% of a step"):
        assert figure in proc.stdout


def test_chat_streams_with_tags_and_stop(tiny_dir: Path) -> None:
    proc = run_cli("chat", "hello", "--model", str(tiny_dir), "--temperature", "1", "--max-new-tokens", "16",
                   "--tags", "qwen3", "--reasoning", "inline", "--stop", "§never§")
    assert proc.returncode == 0, proc.stderr
    assert "> hello" in proc.stderr and "16 tokens" in proc.stderr and "finish: length" in proc.stderr


def test_chat_compare_counts_both_streams(tiny_dir: Path) -> None:
    proc = run_cli("chat", "hello", "--model", str(tiny_dir), "--temperature", "1", "--max-new-tokens", "24", "--compare")
    assert proc.returncode == 0, proc.stderr
    assert "naive (tokenizer.decode([id]) per token):" in proc.stdout and "detok-plugin:\n" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("U+FFFD: naive ") and ", detok-plugin " in last


@pytest.mark.parametrize("seed", ["1", "2"])
def test_chat_says_when_a_reply_splits_no_character(tiny_dir: Path, seed: str) -> None:
    # A prompt of the user's own: when the per-token decode shows no U+FFFD, a line says why.
    proc = run_cli("chat", "hello", "--model", str(tiny_dir), "--temperature", "1", "--seed", seed,
                   "--max-new-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    shown = int(re.search(r"a per-token decode shows (\d+)", proc.stderr).group(1))
    assert ("no character of this reply was split across tokens" in proc.stderr) == (shown == 0)


@pytest.mark.parametrize(
    ("cpus", "load", "threads"),
    [(2, 0.0, 2), (2, 0.4, 2), (2, 1.2, 1), (2, 5.0, 1), (16, 3.6, 12), (1, 0.0, 1)],
)
def test_default_cpu_threads_are_the_idle_cores(cpus: int, load: float, threads: int) -> None:
    assert cli.idle_cores(cpus, load) == threads


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["chat", "hi", "--model", "/no/such/model"], "model '/no/such/model' not found", id="missing-model"),
        pytest.param(["verify", "--batch", "0", "--model", "/no/such/model"], "not found", id="missing-before-batch"),
        pytest.param(["chat", "--max-new-tokens", "0"], "max_new_tokens must be at least 1", id="max-new-tokens"),
        pytest.param(["chat", "--temperature", "-1"], "temperature must be >= 0", id="temperature"),
        pytest.param(["chat", "--threads", "0"], "--threads must be at least 1", id="threads"),
    ],
)
def test_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("detok-plugin: error: ") and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unreadable_model_and_batch_errors(tiny_dir: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    proc = run_cli("chat", "hi", "--model", str(junk))
    assert proc.returncode == 2 and "cannot load model" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("verify", "--model", str(tiny_dir), "--batch", "0")
    assert proc.returncode == 2 and "batch must be at least 1" in proc.stderr
    proc = run_cli("verify", "--model", str(tiny_dir), "--max-new-tokens", str(10**10))
    assert proc.returncode == 2 and "lower --batch" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_cuda_asked_without_cuda() -> None:
    proc = run_cli("chat", "hi", "--device", "cuda")
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr


# --- the README's main job: the real default model ------------------------------------


@pytest.mark.slow
def test_chat_default_prompt_streams_a_clean_japanese_reply() -> None:
    proc = run_cli("chat", "--max-new-tokens", "40")
    assert proc.returncode == 0, proc.stderr
    reply = proc.stdout
    assert "\ufffd" not in reply and any(KANA[0] <= ch <= KANA[1] for ch in reply)
    assert "finish: stop (EOS)" in proc.stderr and "U+FFFD in this stream: 0" in proc.stderr


@pytest.mark.slow
def test_chat_compare_with_the_default_model() -> None:
    proc = run_cli("chat", "--compare", "--max-new-tokens", "40")
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    naive, ours = (int(part.rsplit(" ", 1)[1]) for part in last.removeprefix("U+FFFD: ").split(", "))
    assert naive > 0 and ours == 0


@pytest.mark.slow
def test_verify_with_the_default_model() -> None:
    proc = run_cli("verify", "--batch", "4", "--max-new-tokens", "12", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["model"] == "SmolLM2-135M-Instruct" and len(report["sequences"]) == 8


# --- serve: the access log on stderr ------------------------------------------------------


def test_serve_logs_one_access_line_per_request_to_stderr(tiny_dir: Path) -> None:
    """``detok-plugin serve`` writes each request's access line to stderr, as uvicorn's access
    log does, with the request's duration: one line per request and nothing else per request."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    with socket.socket() as s:  # a free port, released for the server to take
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(SCRIPT), "serve", "--model", str(tiny_dir), "--port", str(port), "--threads", "1", "--device", "cpu"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, encoding="utf-8",
                              env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while not _answers(f"{base}/health"):
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        _request(f"{base}/v1/models")
        _request(f"{base}/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True})
        _request(f"{base}/v1/completions", {"prompt": "hi", "n": 0})
        _request(f"{base}/nowhere")
        time.sleep(0.5)  # a streamed reply's line follows its last byte
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=60)
    # The polls of /health before the server listened never connected: they leave no line.
    lines = [line for line in err.splitlines() if ' - "' in line]
    assert [line.split(" - ", 1)[1].rsplit(" ", 2)[0] for line in lines] == [
        '"GET /health HTTP/1.1" 200', '"GET /v1/models HTTP/1.1" 200', '"POST /v1/completions HTTP/1.1" 200',
        '"POST /v1/completions HTTP/1.1" 400', '"GET /nowhere HTTP/1.1" 404',
    ], err
    assert all(re.fullmatch(r'INFO:     127\.0\.0\.1:\d+ - ".+ HTTP/1\.1" \d{3} \d+\.\d ms', line) for line in lines)


def _answers(url: str) -> bool:
    try:
        return _request(url) == 200
    except OSError:
        return False


def _request(url: str, body: object = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)
