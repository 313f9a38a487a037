"""vLLM's chat layer with the DSML and Llama 4 presets: ``detok_deepseek_v32``,
``detok_deepseek_v4``, ``detok_deepseek_v41`` and ``detok_llama4_pythonic``.

Each name is ``detok_`` + the name vLLM 0.33 gives its own parser for the same model, so a
user switching from stock changes one prefix; the replies run through vLLM's real
``OutputProcessor`` and ``ChatStreamProcessor`` (``test_vllm_chat.chat``) on the real
tokenizers. The oracle for a reply: the calls and content it was written from (DeepSeek's
encoders write ``content + "\\n\\n" + block``; Llama 4 writes the list as the reply).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("vllm.parser.abstract_parser", reason="vLLM 0.32+ is not installed")

from detok_plugin.integrations.vllm import chat_registry, parser_names  # noqa: E402
from test_vllm_chat import Family, chat, enc, tokenizer  # noqa: E402
from vllm.reasoning import ReasoningParserManager  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402

NEW = ("deepseek_v32", "deepseek_v4", "deepseek_v41", "llama4_pythonic")

DSML = {  # preset -> (tokenizer, wrapper, the tags' spelling)
    "deepseek_v32": ("deepseek_v32", "function_calls", ""),
    "deepseek_v4": ("deepseek_v3", "tool_calls", ""),
    "deepseek_v41": ("deepseek_v3", " calls", " "),
}
CALLS = [("get_weather", {"city": "東京", "days": 3, "note": 'a "quoted" </｜DSML｜parameter brace'}), ("ping", {})]


def test_each_name_is_detok_and_vllms_own_and_is_registered() -> None:
    stock = set(ToolParserManager.list_registered())
    assert {n for n in NEW if n in stock} == set(NEW)
    chat_registry.register_chat_parsers()
    try:
        reasoning, tools = parser_names.detok_names()
        assert {f"detok_{n}" for n in NEW} <= tools & set(ToolParserManager.list_registered())
        dsml = {f"detok_{n}" for n in DSML}
        assert dsml <= reasoning & set(ReasoningParserManager.list_registered())
        assert "detok_llama4_pythonic" not in reasoning  # Llama 4 does not think
    finally:
        chat_registry.unregister_chat_parsers()


def dsml_reply(preset: str, content: str) -> str:
    _, wrapper, sp = DSML[preset]
    invokes = []
    for name, args in CALLS:
        params = [
            f'<｜DSML｜{sp}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
            f"{v if isinstance(v, str) else json.dumps(v)}</｜DSML｜{sp}parameter>"
            for k, v in args.items()
        ]
        invokes.append(f'<｜DSML｜{sp}invoke name="{name}">\n' + "\n".join(params) + f"\n</｜DSML｜{sp}invoke>")
    return f"{content}\n\n<｜DSML｜{wrapper}>\n" + "\n".join(invokes) + f"\n</｜DSML｜{wrapper}>"


@pytest.mark.parametrize("step", [1, 3, 1000])
@pytest.mark.parametrize("preset", list(DSML))
def test_a_dsml_reply_with_text_and_two_calls(preset: str, step: int) -> None:
    tok_name, wrapper, _ = DSML[preset]
    fam = Family(tok_name, (f"detok_{preset}", f"detok_{preset}"), (preset, preset), "<｜User｜>hi<｜Assistant｜></think>",
                 ("<think>", "</think>"), (f"<｜DSML｜{wrapper}>", f"</｜DSML｜{wrapper}>"))  # fmt: skip
    tok = tokenizer(tok_name)
    got = chat(fam, enc(tok, dsml_reply(preset, "Let me look.")), step=step)
    assert got.joined("content") == "Let me look."
    assert got.calls() == CALLS


LLAMA4 = Family("llama4", (None, "detok_llama4_pythonic"), (None, "llama4_pythonic"),
                "<|header_start|>assistant<|header_end|>\n\n", None, ("<|python_start|>", ""))  # fmt: skip
PYTHONIC = "[get_weather(city='東京', days=3, note='a \"quoted\" ) ] brace'), ping()]"


@pytest.mark.parametrize("step", [1, 3, 1000])
@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "python_start"])
def test_a_llama4_list_of_calls(wrapped: bool, step: int) -> None:
    tok = tokenizer("llama4")
    ids = enc(tok, PYTHONIC)
    if wrapped:  # the wrapper is two special tokens: by id, as the model writes them
        ids = [tok.convert_tokens_to_ids("<|python_start|>"), *ids, tok.convert_tokens_to_ids("<|python_end|>")]
    got = chat(LLAMA4, ids, step=step)
    want: list[tuple[str, Any]] = [("get_weather", {"city": "東京", "days": 3, "note": 'a "quoted" ) ] brace'}), ("ping", {})]
    assert (got.joined("content"), got.calls()) == ("", want)


def test_a_llama4_answer_that_mentions_a_list_later_is_content() -> None:
    tok = tokenizer("llama4")
    text = "Use it like this: [get_weather(city='LA')]"
    got = chat(LLAMA4, enc(tok, text), step=1)
    assert (got.joined("content"), got.calls()) == (text, [])
