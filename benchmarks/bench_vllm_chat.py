"""vLLM's chat layer per token, with tags and four stops: stock parsers + stock detokenizer
against detok's parsers + detok's detokenizer, on the same replayed outputs.

Each of ``--requests`` requests (default 256) is a Qwen3 reply with a reasoning block, an
answer and a Hermes tool call, in English, Chinese, Japanese or emoji text, tokenized by the
real Qwen3 tokenizer; every request carries the same four stop strings, which never occur
(each stream runs to its end and every token pays for the stop check). One engine step
gives every live request one id. What is timed, per step: vLLM's real
``OutputProcessor.process_outputs`` (the detokenizer) and, for each output, vLLM's real
``ChatStreamProcessor.step`` (the parser, as ``OpenAIServingChat`` streams it):

* ``stock``: ``DETOK_PLUGIN=0``, ``--reasoning-parser qwen3 --tool-call-parser hermes``;
* ``detok``: ``DETOK_PLUGIN=1``, ``--reasoning-parser detok_qwen3 --tool-call-parser detok_qwen3``;
* ``detok, no shortcut``: the same with the common-id shortcut of both layers off
  (``detok_plugin._tagged.RestTexts``: every id through the core), the simpler design
  measured beside it;
* ``floor``: ``DETOK_PLUGIN=1`` with no tags (the plugin's ``ServingStream``) and a parser that
  returns ``DeltaMessage(content=delta_text)`` for a step with text: what vLLM's own
  ``process_outputs`` and ``ChatStreamProcessor.step`` cost around any parser.

Requests are built and added untimed; then the replays take the engine steps in turn,
``CHUNK`` steps each, the order rotating (``--repeats`` rounds after a warm-up round), each
timed in CPU time (``process_time_ns``) with the setup heap frozen as vLLM's server freezes
it: load on the shared machine falls on every configuration alike. The figure is the
median round's nanoseconds per token (and its two halves), and each ratio the median of
per-round ratios to ``stock``. Every configuration's reasoning, content and tool calls
but the floor's are checked equal to stock's in the warm-up round.

Then a request's setup, ``stock`` against ``detok``: CPU microseconds per request before its
first token (``setup_per_request``: the parser and ``adjust_request``, the sampling
parameters, ``add_request`` with its detokenizer, the ``ChatStreamProcessor``, and detok's
``ChatStream``, which serving builds at the first step and so is also in the per-token
figure), median of interleaved rounds of ``--requests`` requests.

Run: ``.venv/bin/python benchmarks/bench_vllm_chat.py [--requests 256] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

from _common import PARAGRAPHS, table, tokenizer_zoo
from detok_plugin.integrations import vllm as shim
from detok_plugin.integrations.vllm.chat import DetokChatParser, chat_stream
from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.chat_completion.stream_processor import ChatStreamProcessor
from vllm.parser import ParserManager
from vllm.parser.abstract_parser import Parser
from vllm.tokenizers.hf import get_cached_tokenizer
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.output_processor import OutputProcessor

from detok_plugin._tagged import RestTexts

STOPS = ["<|end_of_answer|>", "\n\nUser:", "###", "STOP!"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
#: name: (plugin on, --reasoning-parser, --tool-call-parser); None names: the floor's parser.
#: Engine steps each replay takes in its turn: the replays interleave in chunks of this
#: many steps, the order rotating, so load on the shared machine falls on all of them alike.
CHUNK = 8
CONFIGS: dict[str, tuple[bool, str | None, str | None]] = {
    "stock": (False, "qwen3", "hermes"),
    "detok": (True, "detok_qwen3", "detok_qwen3"),
    "detok, no shortcut": (True, "detok_qwen3", "detok_qwen3"),
    "floor": (True, None, None),
}


class FloorParser(Parser):
    """No reasoning, no tools: the step's text as content (what vLLM streams without a parser)."""

    reasoning_parser_cls = None
    tool_parser_cls = None

    def parse_delta(self, delta_text: str, delta_token_ids: list[int], request: Any,
                    prompt_token_ids: list[int] | None = None, *, finished: bool) -> DeltaMessage | None:
        return DeltaMessage(content=delta_text) if delta_text else None


@contextlib.contextmanager
def _variant(name: str) -> Iterator[None]:
    """``detok, no shortcut``: RestTexts.of gives None, so both layers send every id through
    the core (the detokenizer's stream is built at add_request, the parser's at its first step)."""
    if name != "detok, no shortcut":
        yield
        return
    with mock.patch.object(RestTexts, "of", classmethod(lambda cls, *a: None)):
        yield


def replies(tok: Any, n: int) -> list[list[int]]:
    """``n`` replies: reasoning, answer and a tool call, languages rotating."""
    langs = list(PARAGRAPHS)
    out = []
    for i in range(n):
        text = PARAGRAPHS[langs[i % len(langs)]]
        args = json.dumps({"city": "東京", "note": PARAGRAPHS[langs[(i + 1) % len(langs)]][:60]}, ensure_ascii=False)
        reply = f"<think>{text}</think>\n\n{text}<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>"
        out.append(list(tok.encode(reply, add_special_tokens=False)))
    return out


class Replay:
    """One configuration's OutputProcessor and per-request chat processors, built untimed."""

    def __init__(self, tok: Any, name: str, outs: list[list[int]]) -> None:
        self.plugin, r_name, t_name = CONFIGS[name]
        self.name, self.tok, self.outs = name, tok, outs
        with _switch(self.plugin), _variant(name):
            self.parser_cls = (
                ParserManager.get_parser(
                    tool_parser_name=t_name, reasoning_parser_name=r_name, enable_auto_tools=True, tokenizer=tok
                )
                if r_name or t_name
                else FloorParser
            )
            self.op = OutputProcessor(tok, log_stats=False)
            self.procs: dict[str, ChatStreamProcessor] = {}
            prompt = list(tok.encode(PROMPT, add_special_tokens=False))
            for i in range(len(outs)):
                self.procs[f"r{i}"] = self.add(f"r{i}", prompt)[2]
        longest = max(map(len, outs), default=0)
        self.steps = [
            [EngineCoreOutput(request_id=f"r{i}", new_token_ids=o[s : s + 1],
                              finish_reason=FinishReason.LENGTH if s + 1 == len(o) else None)
             for i, o in enumerate(outs) if s < len(o)]
            for s in range(longest)
        ]
        self.seen: dict[str, list[Any]] = {rid: [] for rid in self.procs}

    def add(self, rid: str, prompt: list[int]) -> tuple[Any, Any, Any]:
        """One chat request as vLLM's server starts it: the parser built, the request it
        adjusted, the request in the OutputProcessor, its ChatStreamProcessor."""
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, stop=STOPS, stream=True)
        parser = self.parser_cls(self.tok, request.tools)
        request = parser.adjust_request(request)
        self.op.add_request(EngineCoreRequest(
            request_id=rid, external_req_id=rid, prompt_token_ids=prompt, mm_features=None,
            sampling_params=request.to_sampling_params(10_000, {}), pooling_params=None,
            arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
        ), None)  # fmt: skip
        return request, parser, ChatStreamProcessor(request, parser, enable_auto_tools=True, parser_cls=self.parser_cls)

    def run(self, lo: int, hi: int, keep: bool) -> tuple[int, int]:
        """Engine steps ``lo`` to ``hi``, timed: CPU nanoseconds in the detokenizer and in
        the parser (the plugin switched untimed, before the clock starts). ``keep``: the
        deltas are kept for the check (the warm-up round); else dropped, as a server drops
        each once it is sent, so they do not burden later collections."""
        op, procs, seen = self.op, self.procs, self.seen
        clock = time.process_time_ns
        detok = parse = 0
        with _switch(self.plugin), _variant(self.name):
            for outputs in self.steps[lo:hi]:
                t0 = clock()
                request_outputs = op.process_outputs(outputs).request_outputs
                t1 = clock()
                for ro in request_outputs:
                    co = ro.outputs[0]
                    delta = procs[ro.request_id].step(co.text, list(co.token_ids), co.finish_reason, ro.prompt_token_ids).delta
                    if keep:
                        seen[ro.request_id].append(delta)
                detok += t1 - t0
                parse += clock() - t1
        return detok, parse

    def joined(self) -> dict[str, tuple[str, str, str]]:
        out = {}
        for rid, deltas in self.seen.items():
            ds = [d for d in deltas if d is not None]
            args = "".join(tc.function.arguments or "" for d in ds for tc in d.tool_calls if tc.function)
            # Whitespace at a segment's edges is markup to the chat layer (detok_plugin._edges):
            # compared without it.
            out[rid] = ("".join(d.reasoning or "" for d in ds).strip(), "".join(d.content or "" for d in ds).strip(), args)
        return out


class _switch:
    """The plugin on or off through its real entry point, for building and replaying."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __enter__(self) -> None:
        os.environ["DETOK_PLUGIN"] = "1" if self.on else "0"
        shim.register()

    def __exit__(self, *exc: object) -> None:
        shim.unregister()


def setup_per_request(tok: Any, names: list[str], requests: int, repeats: int) -> dict[str, float]:
    """CPU microseconds per request before its first token, each configuration's, medians
    of interleaved rounds: the parser built and ``adjust_request`` (as ``OnlineRenderer``
    does), the sampling parameters, ``OutputProcessor.add_request`` (the detokenizer's
    construction), the ``ChatStreamProcessor``, and the parser's per-request state that
    its first step builds (detok: the request's ``ChatStream``; stock parsers build none)."""
    prompt = list(tok.encode(PROMPT, add_special_tokens=False))
    samples: dict[str, list[float]] = {k: [] for k in names}
    for rep in range(repeats + 1):
        for k in names[rep % len(names) :] + names[: rep % len(names)]:
            replay = Replay(tok, k, [])
            with _switch(replay.plugin), _variant(k):
                gc.collect()
                t0 = time.process_time_ns()
                for i in range(requests):
                    request, parser, _ = replay.add(f"s{i}", prompt)
                    if isinstance(parser, DetokChatParser):  # what its first step builds
                        chat_stream(parser, request, prompt, streaming=True)
                spent = time.process_time_ns() - t0
            if rep:
                samples[k].append(spent / requests / 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tok = get_cached_tokenizer(tokenizer_zoo.load("qwen3"))
    outs = replies(tok, args.requests)
    tokens = sum(map(len, outs))
    times: dict[str, list[tuple[int, int]]] = {k: [] for k in CONFIGS}
    names = list(CONFIGS)
    for rep in range(args.repeats + 1):
        replays = {k: Replay(tok, k, outs) for k in CONFIGS}  # untimed: requests added fresh
        spent = {k: (0, 0) for k in CONFIGS}
        # The setup heap frozen, as vLLM's server freezes it after start-up
        # (vllm.utils.gc_utils.freeze_gc_heap): else a full collection over it lands on
        # whichever replay runs when it comes.
        gc.collect()
        gc.freeze()
        try:
            for n, lo in enumerate(range(0, len(replays["stock"].steps), CHUNK)):
                for k in names[n % len(names) :] + names[: n % len(names)]:
                    d, p = replays[k].run(lo, lo + CHUNK, keep=not rep)
                    spent[k] = (spent[k][0] + d, spent[k][1] + p)
        finally:
            gc.unfreeze()
        if rep:  # the first round is the warm-up
            for k in CONFIGS:
                times[k].append(spent[k])
        if not rep:
            got = {k: replays[k].joined() for k in CONFIGS if k != "floor"}
            assert all(v == got["stock"] for v in got.values()), "stock and detok disagree on these replies"
    stock = [sum(t) for t in times["stock"]]
    rows = []
    for k, v in times.items():
        per = [sum(t) for t in v]
        rows.append((
            k,
            f"{statistics.median(per) / tokens:,.0f}",
            f"{statistics.median(t[0] for t in v) / tokens:,.0f}",
            f"{statistics.median(t[1] for t in v) / tokens:,.0f}",
            f"{statistics.median(d / s for s, d in zip(stock, per)):.2f}x",
        ))
    print(f"{args.requests} requests, {tokens} tokens, stops {STOPS!r}, Qwen3 with <think> and <tool_call>")
    print(table(rows, ("config", "ns/token", "process_outputs", "chat step", "/ stock")))
    ratios = [sum(d) / sum(s) for s, d in zip(times["stock"], times["detok"])]
    each = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"detok / stock: {statistics.median(ratios):.2f}x (target <= 0.45x; per repeat {each})")
    setup = setup_per_request(tok, ["stock", "detok"], min(args.requests, 256), max(args.repeats, 5))
    print(f"setup per request (before its first token), CPU us: stock {setup['stock']:.1f}, "
          f"detok {setup['detok']:.1f} ({setup['detok'] / setup['stock']:.2f}x)")


if __name__ == "__main__":
    main()
