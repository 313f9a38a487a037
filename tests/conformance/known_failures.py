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
#: <function=...>), F (a stop token of generation_config.json's, not the tokenizer's EOS, came
#: back as content: Llama 3's <|eom_id|>, Gemma 4's <|tool_response>), H (Mistral's [CALL_ID]),
#: I (Magistral Small 2506's <think> text reasoning: detok_magistral reads the tags its tokenizer says).
CAUSES: dict[str, str] = {
    "E": "a call inside an unclosed <think> stays reasoning",
    "S": "soft pass: separator whitespace the template writes (the blank lines after </think>, a space after [/INST]) comes back at the edge of content or reasoning",
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
    "gemma4/empty-arguments-thinking": Known("S", "expected_match: soft_pass (reasoning_content (whitespace only): expected 'get_time takes n"),
    "gemma4/no-call-thinking": Known("S", "expected_match: soft_pass (reasoning_content (whitespace only): expected 'The user is just"),
    "gemma4/parallel-two-calls-thinking": Known("S", "expected_match: soft_pass (reasoning_content (whitespace only): expected 'I should call th"),
    "gemma4/single-call-thinking": Known("S", "expected_match: soft_pass (reasoning_content (whitespace only): expected 'The user wants t"),
    "gemma4/text-after-call-thinking": Known("S", "expected_match: soft_pass (reasoning_content (whitespace only): expected 'I need live weat"),
    "gemma4/vllm-text-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the weather f"),
    "mistral/v3-no-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'The capital of France is P"),
    "mistral/vllm-v3-content-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Hello', got ' Hello')"),
    "qwen3-hermes/empty-arguments-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-hermes/instruct2507-text-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the current c"),
    "qwen3-hermes/multi-turn-final-answer-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'It is 20 °C in Zürich righ"),
    "qwen3-hermes/multi-turn-second-call-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-hermes/no-call-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Hello! How can I help you "),
    "qwen3-hermes/parallel-mixed-tools-text-before-no-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'I'll fetch both for you.',"),
    "qwen3-hermes/parallel-two-calls-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-hermes/sglang-text-before-call-with-space": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'I will check the weather f"),
    "qwen3-hermes/single-call-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-hermes/text-before-call-no-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the current c"),
    "qwen3-hermes/text-before-call-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the current c"),
    "qwen3-hermes/thinking2507-multi-turn": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-hermes/thinking2507-no-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected '2 + 2 = 4.', got '\\n\\n2 + "),
    "qwen3-hermes/thinking2507-parallel-calls": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-hermes/thinking2507-single-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-hermes/thinking2507-text-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the current c"),
    "qwen3-hermes/truncated-in-reasoning": Known("S", "expected_match: soft_pass (reasoning_content (whitespace only): expected 'The user wants t"),
    "qwen3-hermes/unicode-emoji-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/bug-coder-missing-tool-call-opener": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'I will first check for all"),
    "qwen3-xml/coder-text-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'I'll create the file now.'"),
    "qwen3-xml/llamacpp-q35-call-inside-think": Known("E", "expected_match: fail (reasoning_content: expected 'Need to inspect the current directory.'"),
    "qwen3-xml/llamacpp-q35-reasoning-content-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me inspect it now.', g"),
    "qwen3-xml/llamacpp-q35-reasoning-then-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q35-python-literals": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q35-single-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-empty-arguments": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-empty-reasoning": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-long-arguments": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-multiline-string": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-nested-json": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-no-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Hello! How can I help you "),
    "qwen3-xml/q38-numeric-and-literal-arguments": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-numeric-looking-strings": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-parallel-calls": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-single-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-string-escapes": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-text-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the weather f"),
    "qwen3-xml/q38-three-parallel-calls": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-tool-call-token-in-arguments": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-truncated-at-tool-call-open": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-unicode-emoji": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/q38-whitespace-significant": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\\n\\n'; reasoning"),
    "qwen3-xml/vllm-coder-missing-close-parameter": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the weather f"),
}
