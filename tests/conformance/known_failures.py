"""CanIToolCall fixtures the ``detok`` configuration fails today, each with its cause.

``tests/conformance/test_canitoolcall.py`` marks each listed parse ``xfail(strict=True)``: a
fix shows as XPASS, which fails the run until the entry is deleted here. Nothing else is
skipped. An entry names the fixture (its CanIToolCall id), the cause (a letter of
:data:`CAUSES`), the first failing check as CanIToolCall's ``assert_conforms`` words it
(today's observation, kept to say what to look for), and the parses it fails (``*``: the
non-streamed parse and every chunking). Regenerate the observation with
``.venv/bin/python benchmarks/bench_conformance.py`` (its "non-passes" section).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The causes of today's failures, by letter (the issue's letters where it named them).
#: Fixed since the list began (their entries deleted): A (Llama 3 JSON calls without
#: <|python_tag|>), B (a DSML reply cut in its second call keeps the first; a Magistral reply
#: stopped at [TOOL_CALLS]), C (a marker written inside an argument value ended or opened a body:
#: Qwen3-Coder's, and Qwen3.8's inline </parameter>), D (Qwen3-Coder's bare
#: <function=...>), E (a call inside an unclosed <think> stayed reasoning: Preset.tool_ends_reasoning),
#: the first S's 50 soft passes (separator whitespace at a segment's edge came back as text), F
#: (a stop token of generation_config.json's, not the tokenizer's EOS, came back as content: Llama 3's <|eom_id|>, Gemma 4's <|tool_response>), H (Mistral's [CALL_ID]),
#: I (Magistral Small 2506's <think> text reasoning: detok_magistral reads the tags its tokenizer says).
CAUSES: dict[str, str] = {
    "S": "the suite contradicts itself on a space before a last call: gemma4/vllm-text-before-call and "
    "qwen3-hermes/sglang-text-before-call-with-space drop it, these keep it; the chat layer's one rule "
    "(whitespace at a segment's edge is markup, detok_plugin._edges) drops it, so these pass soft",
}


@dataclass(frozen=True, slots=True)
class Known:
    """A fixture that fails today: its cause, what fails, and which parses."""

    cause: str
    seen: str
    parses: tuple[str, ...] = ("*",)

    @property
    def why(self) -> str:
        return f"{CAUSES[self.cause]} (seen: {self.seen})"

    def covers(self, parse: str) -> bool:
        return "*" in self.parses or parse in self.parses


KNOWN_FAILURES: dict[str, Known] = {
    "gemma4/sglang-text-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Some text before ', got 'Some text before')"),
    "llama/l3-sglang-text-before-python-tag": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check. ', got 'Let me check.')"),
}
