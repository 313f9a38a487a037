"""vLLM's chat layer with ``detok_glm47``, ``detok_gemma4`` and ``detok_kimi_k3``: the names
compose to the detok parser, and a recorded reply of each family (CanIToolCall 0.1.1's
``raw_output``) replayed through vLLM 0.33's real ``OutputProcessor``, ``ParserManager``,
``ChatCompletionRequest`` and ``ChatStreamProcessor`` (``test_vllm_chat.chat``).

No PyPI package ships these families' tokenizers: the replies run on the real Qwen3
tokenizer (``<think>`` and ``<tool_call>`` single tokens as in GLM's vocabulary; Gemma 4's
and Kimi K3's markers text over several tokens). The oracle is the fixture's ``expected``
parse: calls (arguments as JSON) and reasoning exact, content after CanIToolCall's soft-v1
(stripped); Kimi K3's content once its response channel's framing, which a preset cannot
name yet, is taken out (docs/vllm.md).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("vllm.parser.abstract_parser", reason="vLLM 0.32+ is not installed")

from canitoolcall_fixtures import fixtures  # noqa: E402
from detok_plugin.integrations.vllm import chat as vllm_chat  # noqa: E402
from detok_plugin.integrations.vllm import chat_registry  # noqa: E402
from test_vllm_chat import TOOLS, Family, chat, enc, tokenizer  # noqa: E402
from vllm.parser.parser_manager import ParserManager  # noqa: E402

#: (preset, fixture family, fixture id, the generation prompt): each reply calls
#: get_weather with string arguments only, which TOOLS' schema keeps strings.
CASES = {
    "glm47": ("glm", "glm/glm47-single-call", "<|assistant|><think>"),
    "glm47-content": ("glm", "glm/glm47-content-before-call", "<|assistant|><think>"),
    "gemma4": ("gemma4", "gemma4/single-call-thinking", "<|turn>model\n"),
    "gemma4-text-after": ("gemma4", "gemma4/text-after-call", "<|turn>model\n<|channel>thought\n<channel|>"),
    "kimi_k3": ("kimi", "kimi/k3-single-call", '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'),
    "kimi_k3-content": ("kimi", "kimi/k3-content-before-call", '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'),
}
_K3_FRAMING = re.compile(r"<\|open\|>response<\|sep\|>|<\|close\|>response<\|sep\|>|<\|close\|>message<\|sep\|>")


@pytest.mark.parametrize(("preset", "tok_name", "skip"), [("gemma4", "gemma4", False), ("qwen3", "qwen3", None)])
def test_a_request_without_tools_keeps_special_tokens_where_a_reasoning_tag_needs_them(preset: str, tok_name: str, skip: Any) -> None:
    """Gemma 4's ``<|channel>thought\n`` holds the special ``<|channel>``: without special
    tokens in the text the tag is never seen, tools or not. Qwen3's ``<think>`` is one token,
    found by its id: the request's own setting stands."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    tok = tokenizer(tok_name)
    chat_registry.register_chat_parsers()
    try:
        name = "detok_" + preset
        cls = ParserManager.get_parser(tool_parser_name=name, reasoning_parser_name=name, enable_auto_tools=True, tokenizer=tok)
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
        assert request.skip_special_tokens is None  # vLLM's default: skip them
        adjusted = cls(tok, None, model_config=None).adjust_request(request)
        assert adjusted.skip_special_tokens is skip
    finally:
        chat_registry.unregister_chat_parsers()


def _fixture(family: str, fid: str) -> dict[str, Any]:
    [fx] = [fx for fx in fixtures(family) if fx["id"] == fid]
    return fx


@pytest.mark.parametrize("preset", ["glm47", "gemma4", "kimi_k3"])
def test_the_names_compose_to_the_detok_parser(preset: str) -> None:
    tok = tokenizer("qwen3")
    chat_registry.register_chat_parsers()
    try:
        name = "detok_" + preset
        cls = ParserManager.get_parser(tool_parser_name=name, reasoning_parser_name=name, enable_auto_tools=True, tokenizer=tok)
        assert cls is not None and issubclass(cls, vllm_chat.DetokChatParser)
        assert cls.reasoning_parser_cls is not None and cls.tool_parser_cls is vllm_chat.DetokToolParser
        cls.reasoning_parser_cls(tok)  # builds on a tokenizer whose vocabulary lacks the tags
    finally:
        chat_registry.unregister_chat_parsers()


@pytest.mark.parametrize("step", [1, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_recorded_reply_streams_its_calls_reasoning_and_content(case: str, step: int) -> None:
    family, fid, prompt = CASES[case]
    fx = _fixture(family, fid)
    preset = case.split("-", 1)[0]
    assert {t["function"]["name"] for t in fx["tools"]} >= {"get_weather"} and TOOLS[0]["function"]["name"] == "get_weather"
    fam = Family("qwen3", ("detok_" + preset, "detok_" + preset), None, prompt, None, ("", ""))
    seen = chat(fam, enc(tokenizer("qwen3"), fx["raw_output"]), step=step)
    want = fx["expected"]
    assert seen.calls() == [(c["name"], c["arguments"]) for c in want["tool_calls"]]
    assert (seen.joined("reasoning").strip() or None) == want["reasoning_content"]
    content = seen.joined("content")
    if preset == "kimi_k3":
        content = _K3_FRAMING.sub("", content)
    assert (content.strip() or None) == want["content"]
