"""``detok-plugin``: the console script. ``chat`` streams a reply, ``verify`` checks a batch.

``detok-plugin chat [PROMPT]``
    Streams the model's reply through the plugin, to stdout, as it is generated. With no
    prompt it asks for Japanese and an emoji. ``--compare`` shows the naive per-token
    stream (``tokenizer.decode([id])`` for each id) beside ours, live on a terminal, and
    ends with the U+FFFD count of each. Reasoning (with ``--tags``) and progress go to stderr.

``detok-plugin verify``
    Runs the multilingual prompt set (``--prompts N``: repeated to N) at ``--batch`` and checks every sequence (``verify.py``);
    prints throughput, model time per step and the detokenizer's time per token and share.
    Exit status 1 when a check fails; ``--json`` prints one JSON object instead.

``detok-plugin serve``
    Serves the model on 127.0.0.1 behind OpenAI's ``/v1/chat/completions`` and
    ``/v1/completions`` (streamed through the plugin), with a page at ``/`` that shows a naive
    stream and ours side by side in the browser (``serve.py``).

``detok-plugin check --base-url URL --model NAME --tokenizer PATH``
    Measures another server's streamed text (any OpenAI-compatible server that returns
    token ids) against the tokenizer's decode, on a fixed battery of requests, and prints a
    table: exact, late characters, U+FFFD sent, stop text leaked (``check.py``).

Errors a user can fix (a missing model, a bad option, a batch too large) print one line and
exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import unicodedata
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

from detok_plugin import Delta, TagSet, __version__

from .errors import RunnerError
from .prompts import DEFAULT_CHAT_PROMPT
from .settings import GenerationSettings

if TYPE_CHECKING:
    from .runner import Runner
    from .verify import VerifyReport

__all__ = ["main"]

_FFFD = "\ufffd"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``detok-plugin`` console script; returns the exit status."""
    # transformers draws tqdm bars while it de-quantizes and loads weights (one of them a bare
    # tqdm that no transformers switch reaches); the CLI's own line says what is loading.
    # Process-wide and read when tqdm is imported, so set first; a caller's value wins.
    os.environ.setdefault("TQDM_DISABLE", "1")
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "check":  # a client of another server: no model, no settings
            return _check(args)
        settings = _settings(args)
        return int(args.func(args, settings))
    except (RunnerError, ValueError) as exc:
        # RunnerError: a model, prompt or batch problem; ValueError: an option out of range.
        print(f"detok-plugin: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130


# --- chat -----------------------------------------------------------------------------


def _chat(args: argparse.Namespace, settings: GenerationSettings) -> int:
    from .verify import count_fffd

    runner = _load(args)
    prompt = args.prompt if args.prompt is not None else DEFAULT_CHAT_PROMPT
    tok = runner.tokenizer
    skip = settings.skip_special_tokens
    out, err = sys.stdout, sys.stderr
    print(f"> {prompt}", file=err, flush=True)

    naive: list[str] = []
    ours: list[str] = []
    live = _LiveCompare(out) if args.compare and out.isatty() else None

    def on_token(row: int, token_id: int, delta: Delta) -> None:
        ours.append(delta.text)
        if args.compare:
            naive.append(tok.decode([token_id], skip_special_tokens=skip) if not _ends_by_token(delta) else "")
            if live is not None:
                live.update("".join(naive), "".join(ours))
            return
        if delta.reasoning:
            err.write(_dim(delta.reasoning, err))
            err.flush()
        if delta.text:
            out.write(delta.text)
            out.flush()
        for call in delta.tool_calls:
            if call.complete:
                shown = call.error or f"{call.name}({call.arguments})"
                err.write(f"\n[tool call {call.index}] {shown}\n")

    result = runner.generate([prompt], settings, on_token=on_token)
    seq, stats = result.sequences[0], result.stats
    text = seq.text
    if args.compare:
        naive_text = "".join(naive)
        if live is not None:
            live.close()
        out.write(f"naive (tokenizer.decode([id]) per token):\n{naive_text}\n")
        out.write(f"detok-plugin:\n{text}\n")
        out.write(f"U+FFFD: naive {count_fffd(naive_text)}, detok-plugin {count_fffd(text)}\n")
    else:
        out.write("\n")
    out.flush()
    from .verify import naive_text as naive_of

    why = seq.finish_reason
    if seq.finish_reason == "stop":
        why += " (EOS)" if seq.stop_reason is None else f" ({seq.stop_reason!r})"
    per_token = count_fffd(naive_of(tok, seq.text_ids, skip_special_tokens=skip))
    print(
        f"[{len(seq.token_ids)} tokens, {stats.tokens_per_s:.1f} tokens/s on {stats.device}, finish: {why}; "
        f"U+FFFD in this stream: {count_fffd(text)} (a per-token decode shows {per_token})]",
        file=err,
    )
    if per_token == 0 and args.prompt is not None:
        print(
            "[no character of this reply was split across tokens, so a per-token decode shows no "
            "U+FFFD either: a small model often answers in English. The default prompt (no "
            "argument) asks for Japanese and an emoji; a larger model: --model PATH]",
            file=err,
        )
    return 0


def _ends_by_token(delta: Delta) -> bool:
    # The EOS id ends the stream without text; a naive streamer would not print it either.
    return delta.finish_reason == "stop" and not isinstance(delta.stop_reason, str)


class _LiveCompare:
    """Two labelled lines redrawn in place, each showing the tail of its stream that fits.

    Newlines show as ``⏎`` so each stream stays on its one line.
    """

    _LABELS = ("naive  │ ", "plugin │ ")

    def __init__(self, out: IO[str]) -> None:
        import shutil

        self.out = out
        self.width = max(shutil.get_terminal_size((80, 24)).columns - 1, 20)
        self.drawn = False

    def update(self, naive: str, ours: str) -> None:
        if self.drawn:
            self.out.write("\x1b[2F")  # back to the start of the first of our two lines
        for label, text in zip(self._LABELS, (naive, ours)):
            self.out.write("\x1b[2K" + label + _tail(text.replace("\n", "⏎"), self.width - 9) + "\n")
        self.out.flush()
        self.drawn = True

    def close(self) -> None:
        self.out.write("\n")


def _tail(text: str, columns: int) -> str:
    """The longest suffix of ``text`` that fits in ``columns`` terminal cells."""
    used = 0
    for i in range(len(text) - 1, -1, -1):
        used += _cells(text[i])
        if used > columns:
            return "…" + text[i + 2 :] if i + 2 <= len(text) else text[i + 1 :]
    return text


def _head(text: str, columns: int) -> str:
    """The longest prefix of ``text`` that fits in ``columns`` terminal cells."""
    used = 0
    for i, ch in enumerate(text):
        used += _cells(ch)
        if used > columns - 1:
            return text[:i] + "…"
    return text


def _cells(ch: str) -> int:
    if unicodedata.combining(ch) or ch in "\u200d\ufe0f":
        return 0
    return 2 if unicodedata.east_asian_width(ch) in "WF" else 1


def _dim(text: str, stream: IO[str]) -> str:
    return f"\x1b[2m{text}\x1b[0m" if stream.isatty() else text


# --- verify ---------------------------------------------------------------------------


def _verify(args: argparse.Namespace, settings: GenerationSettings) -> int:
    from .prompts import VERIFY_PROMPTS
    from .verify import run_verify

    if args.prompts is not None and args.prompts < 1:
        raise ValueError(f"--prompts must be at least 1, got {args.prompts}")
    count = len(VERIFY_PROMPTS) if args.prompts is None else args.prompts
    # The set, repeated to --prompts (a batch of 256 needs 256 rows): sampling makes repeats differ.
    prompts = [VERIFY_PROMPTS[i % len(VERIFY_PROMPTS)] for i in range(count)]
    runner = _load(args, quiet=args.json)
    report = run_verify(runner, settings, batch=args.batch, prompts=prompts, warmup=True)
    if args.json:
        print(json.dumps(report.as_dict(), ensure_ascii=False, indent=2))
    else:
        _print_report(report, settings)
    return 0 if report.ok else 1


def _print_report(report: VerifyReport, settings: GenerationSettings) -> None:
    """``verify``'s text output: one line per sequence, the tally, then the timings."""
    s = report.stats
    mode = "greedy" if settings.greedy else f"sampled (T={settings.temperature}, seed {settings.seed})"
    print(
        f"detok-plugin verify: {report.model} on {s.device}, {len(report.checks)} prompts at batch "
        f"{report.batch}, {mode}, up to {settings.max_new_tokens} new tokens"
    )
    for c in report.checks:
        mark = "ok  " if c.ok else "FAIL"
        preview = _head(c.text.replace("\n", "⏎"), 44)
        if c.finish_reason == "length" and c.text.endswith(_FFFD) and c.fffd_decode:
            preview += "  (the token limit cut a character; the decode ends in U+FFFD too)"
        print(
            f"  {mark} {c.label:<9} {c.tokens:>3} tok {c.finish_reason:<6}  U+FFFD ours {c.fffd_stream}"
            f" / decode {c.fffd_decode} / per-token {c.fffd_naive:<3}  {preview}"
        )
        if not c.exact:
            print(f"       stream:   {c.text!r}\n       expected: {c.expected!r}")
    good = sum(c.ok for c in report.checks)
    print(f"{good}/{len(report.checks)} sequences: stream == full decode, no U+FFFD the decode lacks")
    print(
        f"{s.tokens_per_s:.1f} tokens/s · model {s.model_ms_per_step:.1f} ms/step (prefill {s.prefill_ms:.0f} ms)"
        f" · detokenizer {s.detok_us_per_token:.1f} µs/token, {100 * s.detok_share:.3f}% of a step"
        f" · timer {s.timer}"
    )


# --- serve ----------------------------------------------------------------------------


def _serve(args: argparse.Namespace, settings: GenerationSettings) -> int:
    try:
        from .serve import defaults_for, serve
    except ImportError as exc:  # the serve extra (starlette, uvicorn) is not installed
        print(f"detok-plugin: error: {exc}", file=sys.stderr)
        return 2
    if args.max_batch < 1:
        raise ValueError(f"--max-batch must be at least 1, got {args.max_batch}")
    runner = _load(args)
    print(f"detok-plugin: serving {runner.name} on http://{args.host}:{args.port}/ (the page) "
          f"and /v1 (OpenAI API); Ctrl-C stops", file=sys.stderr, flush=True)
    serve(runner, defaults_for(runner, settings, max_batch=args.max_batch), host=args.host, port=args.port,
          max_batch=args.max_batch)
    return 0


# --- check ----------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from .check import format_table, run_check

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    print(f"detok-plugin: checking {args.base_url} (model {args.model}) against the decode of {args.tokenizer}",
          file=sys.stderr, flush=True)
    rows = run_check(args.base_url, args.model, tok)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], ensure_ascii=False))
    else:
        print(format_table(rows, f"{args.base_url}  ({args.model})"))
    return 0 if all(r.exact == r.choices and not (r.late or r.fffd or r.leaked) for r in rows) else 1


# --- shared ---------------------------------------------------------------------------


def _load(args: argparse.Namespace, *, quiet: bool = False) -> Runner:
    from ._deps import torch
    from .runner import Runner

    threads = args.threads
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be at least 1, got {threads}")
    if threads is None and (args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())):
        threads = idle_cores()
    if threads is not None:
        # Process-wide, so the CLI (which owns its process) sets it, never the Runner.
        torch.set_num_threads(threads)
    return Runner.load(args.model, device=args.device, dtype=args.dtype, progress=None if quiet else sys.stderr)


def idle_cores(cpus: int | None = None, load: float | None = None) -> int:
    """CPU threads for torch by default: the cores not already busy (the cores less the
    one-minute load average, at least 1). torch's own default takes every core, and threads
    that wait at barriers for a busy core slow a step several-fold on a shared machine."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # no load average on this platform
            load = 0.0
    return max(1, min(cpus, cpus - int(load + 0.5)))


def _settings(args: argparse.Namespace) -> GenerationSettings:
    return GenerationSettings(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        skip_special_tokens=not args.keep_special_tokens,
        stop=tuple(getattr(args, "stop", None) or ()),
        tags=getattr(args, "tags", None),
        reasoning=getattr(args, "reasoning", "separate"),
        chat_template=not args.no_chat_template,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detok-plugin",
        description="Stream a real model's tokens into text exactly and promptly (no U+FFFD from split characters).",
    )
    parser.add_argument("--version", action="version", version=f"detok-plugin {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{chat,verify,serve,check}")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default=None, metavar="PATH",
                        help="a local transformers model directory or .gguf file "
                             "(default: SmolLM2-135M-Instruct, fetched once into $DETOK_CACHE_DIR)")
    common.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda[:N]")
    common.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads for torch (default on CPU: the cores not busy, from the load average)")
    common.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    common.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    common.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest ids (0: all)")
    common.add_argument("--seed", type=int, default=0, help="seed of the sampler (same seed, same tokens)")
    common.add_argument("--keep-special-tokens", action="store_true",
                        help="decode special tokens as text (default: skip them, as vLLM does)")
    common.add_argument("--no-chat-template", action="store_true",
                        help="encode the prompt as is instead of through the tokenizer's chat template")

    chat = sub.add_parser("chat", parents=[common], help="stream the model's reply through the plugin",
                          description="Stream the model's reply through the plugin.")
    chat.add_argument("prompt", nargs="?", default=None,
                      help="what to ask (default: Japanese and an emoji, the case the plugin exists for)")
    chat.add_argument("--compare", action="store_true",
                      help="show the naive per-token stream beside ours, with their U+FFFD counts")
    chat.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    chat.add_argument("--tags", choices=TagSet.presets(), default=None,
                      help="route <think> reasoning and tool calls to their own channels")
    chat.add_argument("--reasoning", choices=["separate", "strip", "inline"], default="separate",
                      help="with --tags: reasoning to stderr (separate), dropped (strip) or in the reply (inline)")
    chat.add_argument("--max-new-tokens", type=int, default=96)
    chat.set_defaults(func=_chat)

    verify = sub.add_parser("verify", parents=[common], help="check a multilingual batch: stream == decode",
                            description="Run the multilingual prompt set at batch B and check every sequence.")
    verify.add_argument("--batch", type=int, default=4, metavar="B", help="prompts generated at once (default 4)")
    verify.add_argument("--prompts", type=int, default=None, metavar="N",
                        help="run N prompts: the multilingual set (8) repeated; default the set once")
    verify.add_argument("--json", action="store_true", help="print one JSON object for machines")
    verify.add_argument("--max-new-tokens", type=int, default=32)
    verify.set_defaults(func=_verify)

    serve = sub.add_parser("serve", parents=[common], help="serve an OpenAI-compatible API and a comparison page",
                           description="Serve the model behind OpenAI's chat and completions API, streamed "
                                       "through the plugin, with a page comparing a naive stream at /.")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-batch", type=int, default=16, metavar="B",
                       help="rows generated at once across requests (a request with n choices is n rows)")
    serve.add_argument("--max-new-tokens", type=int, default=256,
                       help="max_tokens for a request that gives none")
    serve.set_defaults(func=_serve)

    check = sub.add_parser(
        "check", help="measure another server's streamed text against the tokenizer's decode",
        description="Stream a fixed battery of requests (CJK, emoji, n=2, prompt ids ending inside a character, "
                    "long and non-ASCII stops, a max_tokens cut) to an OpenAI-compatible server that returns "
                    "token ids, and report per request: exact, late characters, U+FFFD sent, stop text leaked. "
                    "Exit status 1 when anything is off.")
    check.add_argument("--base-url", required=True, metavar="URL", help="the server's OpenAI API, e.g. http://127.0.0.1:8000/v1")
    check.add_argument("--model", required=True, metavar="NAME", help="the served model name")
    check.add_argument("--tokenizer", required=True, metavar="PATH", help="the model's tokenizer (a local directory)")
    check.add_argument("--json", action="store_true", help="print the rows as one JSON array")
    return parser


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
