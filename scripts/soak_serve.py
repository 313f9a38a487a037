"""Soak ``detok-plugin serve``: C concurrent streaming clients for S seconds, every stream checked.

    .venv/bin/python scripts/soak_serve.py [--clients 16] [--seconds 60] [--max-tokens 32]

Starts ``detok-plugin serve`` as a child process on a free port of 127.0.0.1 (the default
SmolLM2 on CPU), then runs ``--clients`` threads, each sending streamed chat requests one
after another (greedy, the ``verify`` prompts and the default chat prompt in turn, with
``return_token_ids``) until ``--seconds`` have passed; requests in flight then finish. For
every stream it checks:

1. status 200, no error event, a finish reason, ``[DONE]`` last;
2. exact: the joined text == the tokenizer's decode of the prompt plus the ids the stream
   carried, minus the prompt's own decode (an EOS that ended it adds no text);
3. no U+FFFD the decode does not have.

Meanwhile it samples the server's resident memory (``VmRSS`` from ``/proc/<pid>/status``)
once a second. It prints one summary (requests, tokens, failures, RSS after the warm-up
request, at its highest and at the end) and exits 1 if any stream failed. Bounded: one
request per client at a time, each capped at ``--max-tokens`` and a 300 s timeout; the child
is stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def stream_chat(port: int, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One streamed request; returns its text, ids, finish reason and any error."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True, "max_tokens": max_tokens,
            "temperature": 0, "return_token_ids": True}
    out: dict[str, Any] = {"text": "", "ids": [], "finish": None, "stop_reason": None, "error": None, "done": False}
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        payload = resp.read()
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: {payload[:200]!r}"
            return out
        for event in payload.split(b"\n\n"):
            if not event.startswith(b"data: "):
                continue
            data = event[6:]
            if data == b"[DONE]":
                out["done"] = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                out["error"] = chunk["error"]["message"]
                continue
            for c in chunk["choices"]:
                out["text"] += c["delta"].get("content", "")
                out["ids"] += c.get("token_ids", [])
                if c.get("finish_reason"):
                    out["finish"], out["stop_reason"] = c["finish_reason"], c.get("stop_reason")
    except (OSError, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return out


class Checker:
    """Expected texts from the tokenizer's own decode (the model's tokenizer, loaded here)."""

    def __init__(self) -> None:
        from detok_plugin.gpu_runner.fetch import fetch_default_model
        from transformers import AutoTokenizer

        gguf = fetch_default_model(progress=None)
        self.tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        self.eos = {self.tok.eos_token_id}
        self._prompt_ids: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def prompt_ids(self, prompt: str) -> list[int]:
        if prompt not in self._prompt_ids:
            text = self.tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                tokenize=False)
            self._prompt_ids[prompt] = self.tok.encode(text, add_special_tokens=False)
        return self._prompt_ids[prompt]

    def problem(self, prompt: str, got: dict[str, Any]) -> str | None:
        """Why a stream is wrong, or None."""
        if got["error"] is not None:
            return got["error"]
        if not got["done"] or got["finish"] is None:
            return "the stream ended without a finish reason or [DONE]"
        ids = got["ids"]
        if got["finish"] == "stop" and got["stop_reason"] is None and ids and ids[-1] in self.eos:
            ids = ids[:-1]
        with self.lock:  # one tokenizer, several threads
            prompt_ids = self.prompt_ids(prompt)
            full = self.tok.decode(prompt_ids + ids, skip_special_tokens=True)
            want = full[len(self.tok.decode(prompt_ids, skip_special_tokens=True)):]
        if got["text"] != want:
            return f"stream {got['text']!r} != decode {want!r}"
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description="Soak detok-plugin serve with concurrent streaming clients.")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1,
                        help="the server's --threads (1: steadiest where other processes share the cores; 0: torch's choice)")
    args = parser.parse_args()

    from detok_plugin.gpu_runner.prompts import DEFAULT_CHAT_PROMPT, VERIFY_PROMPTS

    prompts = [DEFAULT_CHAT_PROMPT] + [p.text for p in VERIFY_PROMPTS]
    checker = Checker()
    port = free_port()
    cmd = [str(Path(sys.executable).with_name("detok-plugin")), "serve", "--port", str(port),
           "--max-batch", str(args.clients)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    server = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "TQDM_DISABLE": "1"})
    try:
        return soak(server, port, prompts, checker, args)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def soak(server: subprocess.Popen[bytes], port: int, prompts: list[str], checker: Checker,
         args: argparse.Namespace) -> int:
    if not wait_for_port(server, port, timeout=300):
        print("the server did not start", file=sys.stderr)
        return 1
    warm = stream_chat(port, prompts[0], args.max_tokens)
    if checker.problem(prompts[0], warm):
        print(f"warm-up failed: {checker.problem(prompts[0], warm)}", file=sys.stderr)
        return 1
    rss = [rss_mb(server.pid)]
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(1.0):
            rss.append(rss_mb(server.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    results = run_clients(port, prompts, checker, args)
    wall = time.monotonic() - t0
    stop_sampling.set()
    sampler.join()
    rss.append(rss_mb(server.pid))
    print(json.dumps(summarize(results, rss, wall, args.clients), indent=2))
    failures = [(p, why) for p, _, why in results if why]
    for p, why in failures[:5]:
        print(f"FAILED {p!r}: {why}", file=sys.stderr)
    return 1 if failures or not results else 0


def wait_for_port(server: subprocess.Popen[bytes], port: int, *, timeout: float) -> bool:
    """Wait for the model to load and the port to open (False: the child died or timed out)."""
    deadline = time.monotonic() + timeout
    while server.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.5)
    return False


Result = tuple[str, dict[str, Any], "str | None"]


def run_clients(port: int, prompts: list[str], checker: Checker, args: argparse.Namespace) -> list[Result]:
    """``args.clients`` threads, each streaming one request after another until the time is up."""
    results: list[Result] = []
    lock = threading.Lock()
    end = time.monotonic() + args.seconds

    def client(c: int) -> None:
        k = c
        while time.monotonic() < end:
            prompt = prompts[k % len(prompts)]
            got = stream_chat(port, prompt, args.max_tokens)
            with lock:
                results.append((prompt, got, checker.problem(prompt, got)))
            k += args.clients

    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.seconds + 330)
    return results


def summarize(results: list[Result], rss: list[float], wall: float, clients: int) -> dict[str, Any]:
    tokens = sum(len(got["ids"]) for _, got, _ in results)
    by_prompt: dict[str, set[str]] = {}
    for p, got, _ in results:
        by_prompt.setdefault(p, set()).add(got["text"])
    return {
        "clients": clients,
        "seconds": round(wall, 1),
        "requests": len(results),
        "failed": sum(1 for _, _, why in results if why),
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        # Exactness already covers U+FFFD; this says where any came from: a max_tokens cut
        # inside a character leaves U+FFFD in the decode too, and then in the stream.
        "fffd_in_streams": sum(got["text"].count("\ufffd") for _, got, _ in results),
        "streams_cut_inside_a_character": sum(got["text"].endswith("\ufffd") and got["finish"] == "length"
                                              for _, got, _ in results),
        "distinct_replies_per_prompt": max(len(v) for v in by_prompt.values()) if by_prompt else 0,
        "rss_mb_after_warmup": round(rss[0], 1),
        "rss_mb_every_10s": [round(v) for v in rss[::10]],
        "rss_mb_max": round(max(rss), 1),
        "rss_mb_end": round(rss[-1], 1),
    }


if __name__ == "__main__":
    sys.exit(main())
