"""SGLang 0.5.23's own chat parsers, stock and ``detok_*``, on CanIToolCall fixtures' text.

Runs in ``.venv-sglang`` (``scripts/setup_sglang.sh``), called by
``tests/integrations/sglang/test_sglang_parsers.py``::

    .venv-sglang/bin/python tests/support/sglang_parsers.py JOBS.json > parses.json

Each job is one fixture: its output ids grouped by each chunking strategy (the test groups
them with CanIToolCall's own ``chunking``), the tokenizer directory, SGLang's parser names,
the tools. Each group of ids becomes the text SGLang's detokenizer sends for that step
(a real ``DetokenizerManager._decode_batch_token_id_output``: its surrogate prompt ids, the
request's ``skip_special_tokens``, the stop token that ended the output appended to the
last step and trimmed as SGLang trims it). The text then goes through SGLang's own
``ReasoningParser`` and ``FunctionCallParser`` in the order its OpenAI server calls them
(``serving_chat``: reasoning first, the tool parser on the normal text, each parser's
``parse_stream_end`` on the last step, then ``_check_for_unstreamed_tool_args``), and once
whole (``parse_non_stream``, the tool parser only where ``has_tool_call``), once with the
stock names and once with ``detok_`` before them (``integrations/sglang/parsers.py``
registered). Prints, per fixture and configuration, CanIToolCall's parse records
(``ParseResult.to_dict``) by strategy, ``nonstream`` for the whole reply.
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from typing import Any

from sglang_replay import detokenizer_manager

START = time.perf_counter()

#: A request's id in the detokenizer's batch.
RID = "fixture"


def texts(manager: Any, job: dict[str, Any], tail: list[int], groups: list[list[int]]) -> list[str]:
    """The text SGLang's detokenizer sends for each group of ids (the first payload carries
    the prompt's last ids as context, as ``Req.init_incremental_detokenize`` sends them)."""
    stop_id = job["stop_id"]
    groups = [list(g) for g in groups] or [[]]
    if stop_id is not None:
        groups[-1].append(stop_id)
    all_ids, sent, out = list(tail), 0, []
    for k, group in enumerate(groups):
        all_ids.extend(group)
        last = k == len(groups) - 1
        finish = None
        if last:
            finish = {"type": "stop", "matched": stop_id} if stop_id is not None else {"type": "length", "length": len(all_ids) - len(tail)}
        batch = types.SimpleNamespace(
            rids=[RID], finished_reasons=[finish], decoded_texts=[""], decode_ids=[all_ids[sent:]],
            read_offsets=[len(tail)], skip_special_tokens=[job["skip_special_tokens"]],
            spaces_between_special_tokens=[True], no_stop_trim=[False],
        )
        sent = len(all_ids)
        out.append(manager._decode_batch_token_id_output(batch)[0])
    return out


def _error(exc: BaseException) -> dict[str, Any]:
    return {"content": None, "reasoning_content": None, "tool_calls": [], "exception": f"{type(exc).__name__}: {exc}"}


def whole(job: dict[str, Any], names: tuple[str | None, str], tools: list[Any], tok: Any, text: str) -> dict[str, Any]:
    """``_build_chat_response``'s parse of a whole reply: reasoning, then tool calls where
    ``has_tool_call`` (``_process_tool_calls``: a parse that raises keeps the text)."""
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    reasoning_name, tool_name = names
    reasoning = None
    try:
        if reasoning_name:
            rp = ReasoningParser(reasoning_name, False, job["force_reasoning"], tokenizer=tok, tool_call_parser_active=True)
            reasoning, text = rp.parse_non_stream(text)
        calls: list[dict[str, Any]] = []
        parser = FunctionCallParser(tools, tool_name, tokenizer=tok)
        if parser.has_tool_call(text):
            try:
                text, items = parser.parse_non_stream(text)
                calls = [{"name": c.name, "arguments_raw": c.parameters} for c in items]
            except Exception:  # serving_chat logs it and keeps the text as content
                calls = []
    except Exception as exc:
        return _error(exc)
    return {"content": text or None, "reasoning_content": reasoning or None, "tool_calls": calls, "exception": None}


def streamed(job: dict[str, Any], names: tuple[str | None, str], tools: list[Any], tok: Any, deltas: list[str]) -> dict[str, Any]:
    """``_generate_stream_content``'s parse, step by step, accumulated as an OpenAI client does."""
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    reasoning_name, tool_name = names
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}
    try:
        rp = None
        if reasoning_name:
            rp = ReasoningParser(reasoning_name, True, job["force_reasoning"], tokenizer=tok, tool_call_parser_active=True)
        parser = FunctionCallParser(tools, tool_name, tokenizer=tok)
        for k, delta in enumerate(deltas):
            r, normal, items = _step(rp, parser, delta, k == len(deltas) - 1)
            reasoning.append(r)
            content.append(normal)
            for item in items:
                slot = calls.setdefault(item.tool_index, ["", ""])
                slot[0] += item.name or ""
                slot[1] += item.parameters or ""
        for index, args in _unstreamed(parser):
            calls.setdefault(index, ["", ""])[1] += args
    except Exception as exc:
        return _error(exc)
    return {
        "content": "".join(content) or None,
        "reasoning_content": "".join(reasoning) or None,
        "tool_calls": [{"name": n, "arguments_raw": a} for _, (n, a) in sorted(calls.items())],
        "exception": None,
    }


def _step(rp: Any, parser: Any, delta: str, last: bool) -> tuple[str, str, list[Any]]:
    """One step: ``_process_reasoning_stream``, then ``_process_tool_call_stream`` on its
    normal text (each parser's ``parse_stream_end`` on the last step)."""
    r = ""
    if rp is not None:
        r, delta = rp.parse_stream_chunk(delta)
        if last:
            end_r, end_n = rp.parse_stream_end()
            r, delta = (r or "") + (end_r or ""), (delta or "") + (end_n or "")
    normal, items = parser.parse_stream_chunk(delta or "")
    if last:
        end_text, end_items = parser.parse_stream_end()
        normal, items = (normal or "") + end_text, [*items, *end_items]
    return r or "", normal or "", list(items)


def _unstreamed(parser: Any) -> list[tuple[int, str]]:
    """SGLang's ``_check_for_unstreamed_tool_args`` at the finish: the arguments it sends then."""
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    rest = OpenAIServingChat._check_for_unstreamed_tool_args(
        None, parser, {"meta_info": {"id": RID}}, types.SimpleNamespace(model="m"), 0, 0
    )
    out = []
    for line in (rest or "").splitlines():
        if line.startswith("data: "):
            for tc in json.loads(line[6:])["choices"][0]["delta"].get("tool_calls") or ():
                out.append((tc["index"], tc["function"].get("arguments") or ""))
    return out


def run(job: dict[str, Any], tok: Any) -> dict[str, Any]:
    """One fixture: every strategy and the whole reply, stock and detok; and detok fed
one character per delta."""
    from detok_plugin.integrations.sglang.parsers import PREFIX
    from sglang.srt.entrypoints.openai.protocol import Tool

    tools = [Tool(**t) for t in job["tools"]]
    manager = detokenizer_manager(tok, capacity=1 << 10)
    tail = list(tok.encode(job["prompt"], add_special_tokens=False))[-job["prompt_tail_ids"] :] if job["prompt"] else []
    deltas = {strategy: texts(manager, job, tail, groups) for strategy, groups in job["chunks"].items()}
    out: dict[str, Any] = {}
    for config, prefix in (("stock", ""), ("detok", PREFIX)):
        names = (prefix + job["reasoning"] if job["reasoning"] else None, prefix + job["tool"])
        parses = {"nonstream": whole(job, names, tools, tok, "".join(deltas["one"]))}
        for strategy, pieces in deltas.items():
            parses[strategy] = streamed(job, names, tools, tok, pieces)
        out[config] = parses
    # Synthetic, detok only: the reply's text one character per delta (no detokenizer
    # splits a marker finer), judged apart from CanIToolCall's strategies.
    names = (PREFIX + job["reasoning"] if job["reasoning"] else None, PREFIX + job["tool"])
    out["detok_by_character"] = streamed(job, names, tools, tok, list("".join(deltas["one"])))
    return out


def registration() -> dict[str, Any]:
    """SGLang's own ``load_plugins()`` with ``DETOK_PLUGIN=1``: the detok names SGLang's
    argument parser then offers (``server_args``' choices, read from the two registries),
    and what ``unregister()`` leaves (the replays then register the parsers alone, so that
    the text is SGLang's own detokenizer's)."""
    import sglang.srt.plugins as plugins
    from detok_plugin.integrations.sglang import unregister

    os.environ["DETOK_PLUGIN"] = "1"
    plugins.load_plugins()
    on = _offered()
    unregister()
    return {"on": on, "after_unregister": _offered()}


def _offered() -> dict[str, list[str]]:
    from detok_plugin.integrations.sglang.parsers import PREFIX
    from sglang.srt.server_args import _reasoning_parser_choices, _tool_call_parser_choices

    return {
        "tools": sorted(n for n in _tool_call_parser_choices() if n.startswith(PREFIX)),
        "reasoning": sorted(n for n in _reasoning_parser_choices() if n.startswith(PREFIX)),
    }


def forced_by_name() -> dict[str, Any]:
    """``ReasoningParser``'s name rule: ``qwen3-thinking`` starts in reasoning whatever
    ``force_reasoning`` says; its twin too. Each one's whole parse of a reply without ``<think>``."""
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    text = "I think.\n</think>\n\nDone."
    return {name: ReasoningParser(name, True, False).parse_non_stream(text) for name in ("qwen3-thinking", "detok_qwen3-thinking")}


def changed_contract() -> dict[str, Any]:
    """A detector base method whose parameters moved: ``install`` refuses, in one line,
    and SGLang's registries keep only its own parsers."""
    from detok_plugin.integrations.sglang import parsers
    from sglang.srt.function_call.base_format_detector import BaseFormatDetector

    parsers.uninstall()
    said: list[str] = []
    stock_finish = BaseFormatDetector.finish
    BaseFormatDetector.finish = lambda self, tools, flush=True: stock_finish(self, tools)  # type: ignore[method-assign]
    try:
        refused = not parsers.install(lambda level, line: said.append(line))
    finally:
        BaseFormatDetector.finish = stock_finish  # type: ignore[method-assign]
    return {"refused": refused, "said": said, "left": _offered()}


def main(argv: list[str]) -> None:
    from detok_plugin.integrations.sglang import parsers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    report: dict[str, Any] = {"registration": registration()}
    if not parsers.install():
        raise SystemExit(f"the detok parsers did not register: {parsers.parser_problems()}")
    print(f"SGLang's parsers imported at {time.perf_counter() - START:.1f} s", file=sys.stderr)
    with open(argv[0], encoding="utf-8") as fh:
        jobs = json.load(fh)
    tokenizers: dict[str, Any] = {}
    for job in jobs:
        path = job["tokenizer"]
        if path not in tokenizers:
            cls = PreTrainedTokenizerFast if job["tokenizer_name"].startswith("deepseek") else AutoTokenizer
            tokenizers[path] = cls.from_pretrained(path)
    print(f"tokenizers loaded at {time.perf_counter() - START:.1f} s", file=sys.stderr)
    report["fixtures"] = replay_all(jobs, tokenizers)
    print(f"parsed at {time.perf_counter() - START:.1f} s", file=sys.stderr)
    report["registration"]["forced_by_name"] = forced_by_name()
    report["registration"]["changed_contract"] = changed_contract()
    json.dump(report, sys.stdout, ensure_ascii=False)


def replay_all(jobs: list[dict[str, Any]], tokenizers: dict[str, Any]) -> dict[str, Any]:
    """Every job, where its pin's tokenizer decodes every one of the pin's fixtures' ids
    to their ``raw_output`` (else only that it does not)."""
    pins: dict[str, bool] = {}
    for job in jobs:
        same = tokenizers[job["tokenizer"]].decode(job["ids"], skip_special_tokens=False) == job["raw_output"]
        pins[job["pin"]] = pins.get(job["pin"], True) and same
    results: dict[str, Any] = {}
    for job in jobs:
        tok = tokenizers[job["tokenizer"]]
        entry = {"reproduces": pins[job["pin"]], "special_ok": set(job["special_ids"]) == special_ids(tok)}
        if entry["reproduces"]:
            entry.update(run(job, tok))
        results[job["id"]] = entry
    return results


def special_ids(tok: Any) -> set[int]:
    """``all_special_ids`` and the added tokens flagged special (CanIToolCall's SGLang
    adapter's rule for the ``special`` chunking)."""
    ids = {int(i) for i in tok.all_special_ids}
    ids.update(int(i) for i, t in tok.added_tokens_decoder.items() if t.special)
    return ids


if __name__ == "__main__":
    main(sys.argv[1:])
