"""SGLang 0.5.23's chat parsers per text delta: ``detok_qwen3`` + ``detok_qwen25`` against
SGLang's own ``qwen3`` + ``qwen25``, in one run.

What is timed: one reply, streamed as SGLang's OpenAI server parses it (``serving_chat``:
each delta through the ``ReasoningParser``'s ``parse_stream_chunk``, its normal text through
the ``FunctionCallParser``'s, both parsers' ``parse_stream_end`` at the end), the parsers'
construction included. The reply is Qwen3's: reasoning (a template-opened ``<think>``,
``force_reasoning``) over ``--paragraphs`` of ``_common.PARAGRAPHS``, ``</think>``, a line
of content, and ``--calls`` tool calls; its deltas are the text each of Qwen3's real tokens
adds (a split character's text waits for its last byte, as SGLang's detokenizer sends it).
Rounds alternate the two (``--repeats`` each, after a warm-up); each figure is the median
round's CPU time (``process_time_ns``) per delta, the ratio detok over stock. What both
assemble is printed, for reading: stock's is not always the reply (docs/sglang.md, "Chat
parsers").

Run (SGLang lives in ``.venv-sglang``, ``scripts/setup_sglang.sh``)::

    .venv-sglang/bin/python benchmarks/bench_sglang_parsers.py [--paragraphs 8] [--calls 2] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from _common import PARAGRAPHS, built_qwen3, interleaved_medians, table
from detok_plugin.integrations.sglang import parsers

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
]


def reply(paragraphs: int, calls: int) -> str:
    texts = list(PARAGRAPHS.values())
    thinking = "".join(texts[i % len(texts)] for i in range(paragraphs))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京 🗼", "days": 3}}\n</tool_call>'
    return thinking + "</think>\n\nLet me check the weather.\n" + "\n".join([call] * calls)


def deltas(tok: Any, text: str) -> list[str]:
    """The text each token adds, a character split over tokens sent with its last byte."""
    ids = tok.encode(text, add_special_tokens=False)
    out, sent = [], ""
    for k in range(1, len(ids) + 1):
        now = tok.decode(ids[:k])
        if now.endswith("\ufffd") and k < len(ids):
            continue
        out.append(now[len(sent) :])
        sent = now
    assert sent == text, "the deltas do not join to the reply"
    return out


def stream(names: tuple[str, str], pieces: list[str], tools: list[Any], tok: Any) -> dict[str, Any]:
    """``serving_chat``'s parse of one streamed reply; what a client assembles."""
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    rp = ReasoningParser(names[0], True, True, tokenizer=tok, tool_call_parser_active=True)
    fp = FunctionCallParser(tools, names[1], tokenizer=tok)
    reasoning, content, calls = [], [], {}
    for k, piece in enumerate(pieces):
        r, normal = rp.parse_stream_chunk(piece)
        if k == len(pieces) - 1:
            end_r, end_n = rp.parse_stream_end()
            r, normal = (r or "") + (end_r or ""), (normal or "") + (end_n or "")
        reasoning.append(r or "")
        text, items = fp.parse_stream_chunk(normal or "")
        if k == len(pieces) - 1:
            end_text, end_items = fp.parse_stream_end()
            text, items = text + end_text, [*items, *end_items]
        content.append(text)
        for item in items:
            slot = calls.setdefault(item.tool_index, ["", ""])
            slot[0] += item.name or ""
            slot[1] += item.parameters
    return {"reasoning": "".join(reasoning), "content": "".join(content), "calls": list(calls.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paragraphs", type=int, default=8)
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    from sglang.srt.entrypoints.openai.protocol import Tool

    if not parsers.install():
        raise SystemExit(f"the detok parsers did not register: {parsers.parser_problems()}")
    tok = built_qwen3()
    pieces = deltas(tok, reply(args.paragraphs, args.calls))
    tools = [Tool(**t) for t in TOOLS]
    configs = {"stock": ("qwen3", "qwen25"), "detok": (parsers.PREFIX + "qwen3", parsers.PREFIX + "qwen25")}
    for name, names in configs.items():
        got = stream(names, pieces, tools, tok)
        got["reasoning"] = f"{len(got['reasoning'])} characters, ending {got['reasoning'][-12:]!r}"
        print(name, json.dumps(got, ensure_ascii=False))
    medians = interleaved_medians({n: (lambda names=names: stream(names, pieces, tools, tok)) for n, names in configs.items()}, args.repeats)
    per = {n: medians[n] / len(pieces) * 1e6 for n in medians}
    rows = [[len(pieces), f"{per['stock']:.2f}", f"{per['detok']:.2f}", f"{per['detok'] / per['stock']:.3f}x"]]
    print(table(rows, ["deltas", "stock us/delta", "detok us/delta", "detok / stock"]))


if __name__ == "__main__":
    main()
