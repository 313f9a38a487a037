"""SGLang 0.5.23's own chat parsers on CanIToolCall's fixtures: ``detok_*`` beside stock.

``tests/support/sglang_parsers.py`` runs in ``.venv-sglang``: each fixture's output ids,
grouped by each of CanIToolCall's default chunkings (its own ``chunking``, here), become the
text SGLang's detokenizer sends per step, and SGLang's ``ReasoningParser`` and
``FunctionCallParser`` parse it as its OpenAI server does, streamed and whole, under the
parser names CanIToolCall's SGLang adapter gives the fixture's model (stock) and the same
names with ``detok_`` before them (``integrations/sglang/parsers.py``). CanIToolCall's own
``evaluate`` judges every parse (strict: ``pass``). A fixture runs where a ``tokenizer_zoo``
tokenizer reproduces every ``raw_output`` of its pin (checked in the subprocess) and the
core has a detok name for its SGLang parsers (not gpt-oss: harmony is read by id).

The detok parsers must pass every fixture run, streamed and whole alike; stock's results
stand beside them in the table (``-s`` prints it; docs/sglang.md, "Chat parsers").

``DETOK_SGLANG_PARSER_FAMILIES`` names the CanIToolCall families to run (comma-separated;
``all``: every one, about 4 minutes here, most of it loading ten tokenizers in SGLang's venv);
by default :data:`QUICK_FAMILIES`, about a minute and a half.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import tokenizer_zoo
from canitoolcall.adapters.base import ReplayInput
from canitoolcall.adapters.sglang import resolve_parsers
from canitoolcall.chunking import DEFAULT_STRATEGIES, split
from canitoolcall.fixtures import Fixture, load_fixtures
from canitoolcall.runner import evaluate, family_for
from conformance_models import STOP_TOKENS, TOKENIZERS, StopRule, prompt_head
from detok_plugin.integrations.sglang.parsers import PREFIX, REASONING_PRESETS, TOOL_PRESETS
from sglang_env import require_sglang, sglang_run

from detok_plugin import TagSet

require_sglang()

#: The ids SGLang's detokenizer decodes before a request's first output id
#: (``INIT_INCREMENTAL_DETOKENIZATION_OFFSET``).
PROMPT_TAIL = 5

CONFIGS = ("detok", "stock")

#: The families a default run replays (five tokenizers): Qwen3 (hermes), DeepSeek V3 to V4, Llama 3 and 4.
QUICK_FAMILIES = ("qwen3-hermes", "deepseek", "llama")

#: CanIToolCall's families by fixture (``family_for``'s cache).
_FAMILIES: dict[Any, Any] = {}

_EDGE = (
    "soft pass: the suite writes a space before a last call both ways; the chat layer's one rule "
    "(whitespace at a segment's edge is markup, docs/conformance.md) drops it"
)

#: Fixtures the detok parsers do not pass strictly, by id, with why.
DETOK_WRONG: dict[str, str] = {
    "gemma4/sglang-text-before-call": _EDGE,
    "llama/l3-sglang-text-before-python-tag": _EDGE,
    "qwen3-xml/llamacpp-q35-call-inside-think": (
        "SGLang's reasoning parser for Qwen3.5 is qwen3, which is given no tool parser name: detok_qwen3's "
        "reasoning ends at </think> only, so a call Qwen3.5 writes inside an unclosed <think> stays reasoning "
        "(the core's qwen3_coder preset ends reasoning there: tool_ends_reasoning)"
    ),
}

#: Reasoning parsers for models CanIToolCall's SGLang map (0.5.20) gives none, by a pattern
#: over the model: the stock name, for stock and detok alike.
REASONING_FOR = ((r"Ministral-3-.*Reasoning", "mistral"),)


def _pin(f: Fixture) -> str:
    return f.tokenizer.repo if f.tokenizer is not None else f.reference_model


@functools.cache
def _zoo_name(pin: str) -> str | None:
    """The first tokenizer_zoo name mapped to ``pin`` that the zoo builds here (the
    subprocess checks it reproduces the pin's fixtures)."""
    for pattern, names in TOKENIZERS:
        if re.search(pattern, pin):
            return next((n for n in names if n in tokenizer_zoo.NAMES or _more(n)), None)
    return None


def _more(name: str) -> bool:
    try:
        tokenizer_zoo.directory(name)
    except Exception:  # not a zoo name, or not buildable here
        return False
    return True


@functools.cache
def _added(name: str) -> dict[str, tuple[int, bool]]:
    """The tokenizer's added tokens (its saved ``tokenizer.json``'s ``added_tokens`` array,
    decoded alone: the vocabulary after it is large): content -> (id, whether special)."""
    text = (Path(tokenizer_zoo.directory(name)) / "tokenizer.json").read_text(encoding="utf-8")
    start = text.index("[", text.index('"added_tokens"'))
    added, _ = json.JSONDecoder().raw_decode(text, start)
    return {t["content"]: (t["id"], bool(t.get("special"))) for t in added}


@functools.cache
def _special_ids(name: str) -> frozenset[int]:
    """The tokenizer's special ids read from its saved files (its added tokens flagged
    special, and those its config names special: ``all_special_ids``); the subprocess
    checks them against the loaded tokenizer's."""
    config = json.loads((Path(tokenizer_zoo.directory(name)) / "tokenizer_config.json").read_text(encoding="utf-8"))
    named = {config.get(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    named.update(config.get("extra_special_tokens") or config.get("additional_special_tokens") or ())
    return frozenset(i for content, (i, special) in _added(name).items() if special or content in named)


def _stop_id(f: Fixture, vocab_ids: dict[str, int]) -> int | None:
    """The token that ended the output (None: ``max_tokens`` cut it), as the vLLM replay picks it."""
    if f.truncated:
        return None
    family = family_for(f, _FAMILIES)
    ref = family.reference_for(f.reference_model) if family is not None else None
    tokens = list(ref.stop_tokens) if ref is not None else []
    rule = STOP_TOKENS.get(f.family, StopRule(tuple(tokens)))
    return next((vocab_ids[t] for t in [*rule.for_output(f.raw_output), *tokens] if t in vocab_ids), None)


def _job(f: Fixture, name: str, tool: str, reasoning: str | None) -> dict[str, Any]:
    family = family_for(f, _FAMILIES)
    raw = ReplayInput.from_fixture(f, family)
    prompt = prompt_head(f.family, f.reference_model) + (raw.generation_prompt or "")
    opening = TagSet.preset(REASONING_PRESETS[reasoning]).reasoning_open if reasoning else None
    ids = list(f.output_token_ids or ())
    return {
        "id": f.id,
        "pin": _pin(f),
        "ids": ids,
        "raw_output": f.raw_output,
        "tokenizer": str(tokenizer_zoo.directory(name)),
        "tokenizer_name": name,
        "special_ids": sorted(_special_ids(name)),
        "tool": tool,
        "reasoning": reasoning,
        "tools": [dict(t) for t in f.tools],
        "prompt": prompt,
        "prompt_tail_ids": PROMPT_TAIL,
        "stop_id": _stop_id(f, {c: i for c, (i, _) in _added(name).items()}),
        # serving_chat's _process_messages: special tokens kept for a request with tools.
        "skip_special_tokens": not f.tools,
        "force_reasoning": bool(opening) and (raw.generation_prompt or "").rstrip().endswith(opening.rstrip()),
        "chunks": {s.id: split(ids, s, special=_special_ids(name)) for s in DEFAULT_STRATEGIES},
    }


def plan() -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The jobs, and each fixture not run with why."""
    named = os.environ.get("DETOK_SGLANG_PARSER_FAMILIES", "").strip() or ",".join(QUICK_FAMILIES)
    wanted = set() if named == "all" else {w.strip() for w in named.split(",") if w.strip()}
    jobs, skipped = [], {}
    for f in load_fixtures(None):
        if wanted and f.family not in wanted:
            continue
        names = _sglang_names(f)
        name = _zoo_name(_pin(f))
        if isinstance(names, str):
            skipped[f.id] = names
        elif name is None or f.output_token_ids is None:
            skipped[f.id] = f"no tokenizer_zoo tokenizer for {_pin(f)}"
        else:
            jobs.append(_job(f, name, *names))
    return jobs, skipped


def _sglang_names(f: Fixture) -> tuple[str, str | None] | str:
    """SGLang's ``(tool, reasoning)`` parser names for the fixture's model (CanIToolCall's
    SGLang map, :data:`REASONING_FOR`), or why there are none with a detok twin."""
    rule = resolve_parsers(f.family, f.reference_model)
    if rule is None or rule.tool_call_parser is None:
        return "SGLang has no parser for it"
    reasoning = rule.reasoning_parser or next((r for p, r in REASONING_FOR if re.search(p, f.reference_model)), None)
    if rule.tool_call_parser not in TOOL_PRESETS or (reasoning and reasoning not in REASONING_PRESETS):
        return f"no detok name for SGLang's {rule.tool_call_parser} / {reasoning}"
    return rule.tool_call_parser, reasoning


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The subprocess's report: ``fixtures`` (each fixture's parses per configuration, and
    whether its tokenizer reproduced it and had the special ids planned) and ``registration``."""
    jobs, _ = plan()
    path = tmp_path_factory.mktemp("sglang_parsers") / "jobs.json"
    path.write_text(json.dumps(jobs, ensure_ascii=False), encoding="utf-8")
    done = sglang_run(["tests/support/sglang_parsers.py", str(path)], timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def judged(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per fixture run: each configuration's CanIToolCall case (``status``, the failing
    checks, the parses), and the subprocess's own findings (tokenizer and special ids)."""
    corpus = {f.id: f for f in load_fixtures(None)}
    out: dict[str, dict[str, Any]] = {}
    for fid, result in report["fixtures"].items():
        entry: dict[str, Any] = {"reproduces": result["reproduces"], "special_ok": result["special_ok"]}
        if result["reproduces"]:
            entry["detok_by_character"] = result["detok_by_character"]
            for config in CONFIGS:
                parses = result[config]
                reply = {
                    "supported": True,
                    "nonstream": parses["nonstream"],
                    "streams": {k: v for k, v in parses.items() if k != "nonstream"},
                    "parser_config": {"config": config},
                }
                case = evaluate(corpus[fid], family_for(corpus[fid], _FAMILIES), reply, include_observed="failures")
                bad = sorted({f"{row.check}[{row.strategy}]" for row in case.checks if row.status.value != "pass"})
                entry[config] = {"status": case.status.value, "bad": bad, "parses": parses}
        out[fid] = entry
    _table(out)
    return out


def _table(out: dict[str, dict[str, Any]]) -> None:
    rows: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for fid, entry in out.items():
        family = fid.split("/", 1)[0]
        rows[family]["fixtures"] += 1
        if entry["reproduces"]:
            rows[family]["run"] += 1
            for config in CONFIGS:
                rows[family][config] += entry[config]["status"] == "pass"
    print("\n| family | fixtures | run | detok pass | stock pass |\n|---|---|---|---|---|")
    for family, c in sorted(rows.items()):
        print(f"| {family} | {c['fixtures']} | {c['run']} | {c['detok']} | {c['stock']} |")
    total = sum(rows.values(), collections.Counter())
    print(f"| all | {total['fixtures']} | {total['run']} | {total['detok']} | {total['stock']} |")


def test_the_subprocess_reads_the_tokenizers_as_planned(judged: dict[str, dict[str, Any]]) -> None:
    """The special ids the chunking used are the loaded tokenizer's, and most fixtures run."""
    assert all(e["special_ok"] for e in judged.values())
    assert sum(e["reproduces"] for e in judged.values()) >= len(judged) // 2


def test_detok_parsers_pass_every_fixture(judged: dict[str, dict[str, Any]]) -> None:
    """Strict CanIToolCall pass on every fixture run: every check, streamed at every
    default chunking and whole."""
    failed = {
        fid: e["detok"]["bad"] for fid, e in judged.items() if e["reproduces"] and e["detok"]["status"] != "pass" and fid not in DETOK_WRONG
    }
    assert not failed, json.dumps(failed, indent=1, ensure_ascii=False)[:6000]
    assert all(judged[fid]["detok"]["status"] != "pass" for fid in DETOK_WRONG if judged.get(fid, {}).get("reproduces")), (
        "a pinned fixture passes now: delete its DETOK_WRONG entry"
    )


def test_detok_streamed_equals_whole(judged: dict[str, dict[str, Any]]) -> None:
    """Every streamed parse of a fixture equals its non-streamed parse (content, reasoning,
    calls with their arguments' text)."""
    differ = []
    for fid, e in judged.items():
        if not e["reproduces"]:
            continue
        parses = e["detok"]["parses"]
        differ += [f"{fid}[{k}]" for k, v in parses.items() if k != "nonstream" and _same(v) != _same(parses["nonstream"])]
    assert not differ, differ[:40]


def test_detok_by_character_equals_whole(judged: dict[str, dict[str, Any]]) -> None:
    """The reply's text one character per delta (finer than any detokenizer cuts it: every
    marker split at every character) parses as the whole reply does."""
    differ = [
        fid
        for fid, e in judged.items()
        if e["reproduces"] and _same(e["detok_by_character"]) != _same(e["detok"]["parses"]["nonstream"])
    ]
    assert not differ, differ[:40]


def _same(parse: dict[str, Any]) -> tuple[Any, ...]:
    calls = tuple((c["name"], json.loads(c["arguments_raw"])) if c["arguments_raw"] else (c["name"], None) for c in parse["tool_calls"])
    return parse["content"], parse["reasoning_content"], json.dumps(calls, sort_keys=True), parse["exception"]


def test_detok_never_does_worse_than_stock(judged: dict[str, dict[str, Any]]) -> None:
    """Where SGLang's own parser passes a fixture, the detok one does too (but for the
    pinned ones: SGLang keeps the space before a last call that the chat layer's rule drops)."""
    worse = [
        fid
        for fid, e in judged.items()
        if e["reproduces"] and e["stock"]["status"] == "pass" and e["detok"]["status"] != "pass" and fid not in DETOK_WRONG
    ]
    assert not worse, worse


def test_the_plugin_registers_the_names_sglang_offers(report: dict[str, Any]) -> None:
    """``DETOK_PLUGIN=1``: SGLang's own ``load_plugins()`` registers a ``detok_`` twin of
    each SGLang parser the core has a format for, and SGLang's ``--tool-call-parser`` and
    ``--reasoning-parser`` choices offer them; ``unregister()`` takes them out; a detector
    base class whose methods changed keeps SGLang's own parsers, saying why in one line."""
    got = report["registration"]
    assert got["on"] == {
        "tools": sorted(PREFIX + n for n in TOOL_PRESETS),
        "reasoning": sorted(PREFIX + n for n in REASONING_PRESETS),
    }
    changed = got["changed_contract"]
    assert got["after_unregister"] == changed["left"] == {"tools": [], "reasoning": []}
    assert changed["refused"]
    [line] = changed["said"]
    assert "NOT registered" in line and "BaseFormatDetector.finish takes ('tools', 'flush')" in line


def test_qwen3_thinking_starts_in_reasoning_by_its_name(report: dict[str, Any]) -> None:
    """SGLang's ``qwen3-thinking`` forces reasoning by its name (``ReasoningParser``), so its
    twin does: the reply's text before ``</think>`` is reasoning under both."""
    got = report["registration"]["forced_by_name"]
    assert got["detok_qwen3-thinking"] == ["I think.", "Done."]
    assert [t.strip() for t in got["qwen3-thinking"]] == got["detok_qwen3-thinking"]
