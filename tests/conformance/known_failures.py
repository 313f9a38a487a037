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

#: The causes, by letter (A, from the issue, is fixed: Llama 3 JSON calls without
#: <|python_tag|> pass).
CAUSES: dict[str, str] = {
    "B": "a truncated or malformed body: a cut second call must keep the first, complete one; a call cut by max_tokens is never returned; a marker the cut left open is not content",
    "C": "a marker written inside an argument value ends or opens a body",
    "D": "Qwen3-Coder's <function=...> without <tool_call> is content",
    "E": "a call inside an unclosed <think> stays reasoning",
    "F": "the stop token that ended the reply comes back as content when it is one of generation_config.json's eos ids but not the tokenizer's EOS (Llama 3's <|eom_id|> after a <|python_tag|> call, Gemma 4's <|tool_response>): the detok parser's end ids are the request's stop_token_ids and the tokenizer's EOS, not the sampling parameters' stop ids",
    "H": "Mistral v11: [CALL_ID] between the name and [ARGS] is not read",
    "I": "Magistral Small 2506 writes its reasoning between <think> tags as text; detok_magistral reads [THINK] only",
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
    "gemma4/array-of-objects-with-braces": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/array-of-strings": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/bug-ollama-18390-key-with-spaces": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/dictsort-case-insensitive-order": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/edge-values-key-with-space": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/empty-arguments": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/empty-arguments-thinking": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>'; reasoning_content (w"),
    "gemma4/json-text-in-string": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/long-arguments": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/many-strings-then-string-array": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/marker-in-arguments": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/multi-turn-second-call": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/nested-objects-and-arrays": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/no-call-thinking": Known("S", "expected_match: soft_pass (reasoning_content (whitespace only): expected 'The user is just"),
    "gemma4/numeric-arguments": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/parallel-mixed-with-empty": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/parallel-three-calls": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/parallel-two-calls-thinking": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>'; reasoning_content (w"),
    "gemma4/sglang-nested-array-with-spaces": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/sglang-nested-object": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/sglang-text-around-call": Known("F", "expected_match: fail (content: expected 'Some text before  after', got 'Some text before  "),
    "gemma4/sglang-text-before-call": Known("F", "expected_match: fail (content: expected 'Some text before ', got 'Some text before <|tool_"),
    "gemma4/single-call": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/single-call-thinking": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>'; reasoning_content (w"),
    "gemma4/string-with-newlines-and-backslashes": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/text-after-call": Known("F", "expected_match: fail (content: expected 'Let me check the current conditions in London.', "),
    "gemma4/text-after-call-thinking": Known("F", "expected_match: fail (content: expected 'Let me check the current conditions in London.', "),
    "gemma4/unicode-emoji": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/vllm-dotted-function-name": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/vllm-hyphenated-function-name": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/vllm-multiple-arguments": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/vllm-nested-arguments": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/vllm-no-arguments": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/vllm-number-and-boolean": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/vllm-single-call": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "gemma4/vllm-text-before-call": Known("F", "expected_match: fail (content: expected 'Let me check the weather for you.', got 'Let me c"),
    "gemma4/vllm-two-calls": Known("F", "expected_match: fail (content: expected None, got '<|tool_response>')"),
    "llama/l3-marker-in-arguments": Known("F", "expected_match: fail (content: expected None, got '{'name': 'write_file', 'parameters': {'"),
    "llama/l3-meta-python-tag-type-function": Known("F", "expected_match: fail (content: expected None, got '<|python_tag|>{\n    'type': 'function'"),
    "llama/l3-sglang-python-tag-call": Known("F", "expected_match: fail (content: expected None, got '<|python_tag|>{'name': 'get_weather', '"),
    "llama/l3-sglang-text-before-python-tag": Known("F", "expected_match: fail (content: expected 'Let me check. ', got 'Let me check. <|python_tag|"),
    "mistral/llamacpp-v11-call-id": Known("H", "expected_match: fail (content: expected None, got '[TOOL_CALLS]special_function[CALL_ID]12"),
    "mistral/llamacpp-v11-call-id-parallel": Known("H", "expected_match: fail (content: expected None, got '[TOOL_CALLS]special_function[CALL_ID]00"),
    "mistral/v13think-stop-at-open-marker": Known("B", "expected_match: fail (content: expected 'Let me check that for you.', got 'Let me check th"),
    "mistral/v3-no-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'The capital of France is P"),
    "mistral/vllm-v11-think-text": Known("I", "expected_match: fail (content: expected 'c', got '<think>r</think>c'; reasoning_content: e"),
    "mistral/vllm-v3-content-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Hello', got ' Hello')"),
    "qwen3-hermes/empty-arguments-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-hermes/instruct2507-text-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the current c"),
    "qwen3-hermes/multi-turn-final-answer-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'It is 20 °C in Zürich righ"),
    "qwen3-hermes/multi-turn-second-call-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-hermes/no-call-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Hello! How can I help you "),
    "qwen3-hermes/parallel-mixed-tools-text-before-no-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'I'll fetch both for you.',"),
    "qwen3-hermes/parallel-two-calls-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-hermes/sglang-text-before-call-with-space": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'I will check the weather f"),
    "qwen3-hermes/single-call-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-hermes/text-before-call-no-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the current c"),
    "qwen3-hermes/text-before-call-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the current c"),
    "qwen3-hermes/thinking2507-multi-turn": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-hermes/thinking2507-no-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected '2 + 2 = 4.', got '\n\n2 + "),
    "qwen3-hermes/thinking2507-parallel-calls": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-hermes/thinking2507-single-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-hermes/thinking2507-text-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the current c"),
    "qwen3-hermes/truncated-in-reasoning": Known("S", "expected_match: soft_pass (reasoning_content (whitespace only): expected 'The user wants t"),
    "qwen3-hermes/unicode-emoji-thinking": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/bug-coder-missing-tool-call-opener": Known("D", "expected_match: fail (content: expected 'I will first check for all Markdown files in the "),
    "qwen3-xml/coder-text-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'I'll create the file now.'"),
    "qwen3-xml/llamacpp-q35-call-inside-think": Known("E", "expected_match: fail (reasoning_content: expected 'Need to inspect the current directory.'"),
    "qwen3-xml/llamacpp-q35-reasoning-content-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me inspect it now.', g"),
    "qwen3-xml/llamacpp-q35-reasoning-then-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q35-python-literals": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q35-single-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-empty-arguments": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-empty-reasoning": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-long-arguments": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-marker-in-arguments": Known("C", "expected_match: fail (content (whitespace only): expected None, got '\n\n'; reasoning_cont"),
    "qwen3-xml/q38-multiline-string": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-nested-json": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-no-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Hello! How can I help you "),
    "qwen3-xml/q38-numeric-and-literal-arguments": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-numeric-looking-strings": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-parallel-calls": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-single-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-string-escapes": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-text-before-call": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the weather f"),
    "qwen3-xml/q38-three-parallel-calls": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-tool-call-token-in-arguments": Known("C", "expected_match: fail (content: expected None, got '\n\n blocks.\n</parameter>\n</function>"),
    "qwen3-xml/q38-truncated-at-tool-call-open": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-unicode-emoji": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/q38-whitespace-significant": Known("S", "expected_match: soft_pass (content (whitespace only): expected None, got '\n\n'; reasoning"),
    "qwen3-xml/vllm-coder-missing-close-parameter": Known("S", "expected_match: soft_pass (content (whitespace only): expected 'Let me check the weather f"),
}
