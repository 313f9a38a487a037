"""A detok chat parser whose channels raise, inside vLLM's real chat layer: nothing reaches
vLLM's serving loop (``integrations/vllm/chat.py``: ``DetokChatParser.parse_delta`` and ``parse``).

vLLM's streaming chat generator turns an exception from a parser into an error event and
ends the reply. The detok parsers do not let one out: the error is logged, naming the
request, and from the failing step on each step's text from the detokenizer (vLLM's
``OutputProcessor``, the plugin on) is sent as content. What was sent before stays as sent.

The faults are injected into the parser's :class:`ChatStream`: when it is
built (the first step), at the start of a step (nothing taken), or after the core took the
step's ids (``ChatStream._take``), at steps in the reasoning, the answer and the tool body;
and into gpt-oss's ``harmony.HarmonyChannels`` mid-reply.
The replays are ``test_vllm_chat``'s: real tokenizers, vLLM's real ``OutputProcessor``,
``ParserManager`` and ``ChatStreamProcessor``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("vllm.parser.abstract_parser", reason="vLLM 0.32+ is not installed")

from detok_plugin.integrations.vllm import chat as vllm_chat  # noqa: E402
from detok_plugin.integrations.vllm import chat_registry  # noqa: E402
from test_vllm_chat import FAMILIES, TOOLS, Chat, answer, chat, enc, tokenizer  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.parser import ParserManager  # noqa: E402

from detok_plugin import ChatStream  # noqa: E402

LOGGER = "vllm.detok_plugin"


class Injected(RuntimeError):
    """The fault a test put in the parser's channels."""


def faulty(real: Callable[..., Any], at: int) -> Callable[..., Any]:
    """``real``, raising on its ``at``-th call (counted from 1) and on no other."""
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == at:
            raise Injected(f"fault at call {at}")
        return real(*args, **kwargs)

    return wrapper


def failing_step(seen: Chat, clean: Chat) -> int:
    """The first step whose delta differs from the clean run's."""
    for k, (got, want) in enumerate(zip(seen.deltas, clean.deltas)):
        if _fields(got) != _fields(want):
            return k
    raise AssertionError("no step differs from the run without a fault")


def _fields(delta: Any) -> Any:
    if delta is None:
        return None
    fields = delta.model_dump(exclude_none=True)
    for tc in fields.get("tool_calls", ()):
        tc.pop("id", None)  # random per run
    return fields


def assert_handed_over(seen: Chat, clean: Chat, at: int) -> None:
    """Before step ``at`` the client saw what it sees without a fault; from it on, each
    step's delta is the detokenizer's text of that step as content (None for no text)."""
    assert seen.detok_steps == clean.detok_steps  # the detokenizer is not the parser
    assert [_fields(d) for d in seen.deltas[:at]] == [_fields(d) for d in clean.deltas[:at]]
    for delta, text in zip(seen.deltas[at:], seen.detok_steps[at:]):
        assert _fields(delta) == ({"content": text} if text else None)
    assert seen.finish_reason == clean.finish_reason


def step_in(fam: Any, where: str) -> int:
    """The index of a step (one id per step) of ``answer(fam)`` in the part named."""
    out = answer(fam)
    if fam.think is None:
        thought, answered = 0, 2
    else:
        tok = tokenizer(fam.tokenizer)
        thought = len(enc(tok, fam.think[0])) + 2
        answered = out.index(enc(tok, fam.think[1])[-1]) + 3  # past the close tag's last id
    return {"first-step": 0, "reasoning": thought, "answer": answered, "tool-body": len(out) - 8}[where]


#: (family, where the fault lands); Llama 3 writes no reasoning.
WHERE = [
    pytest.param(family, where, id=f"{family}-{where}")
    for family in ("qwen3", "deepseek_r1", "llama3")
    for where in ("first-step", "reasoning", "answer", "tool-body")
    if not (where == "reasoning" and FAMILIES[family].think is None)
]


@pytest.mark.parametrize("family, where", WHERE)
def test_a_step_that_raises_sends_the_detokenizers_text_from_then_on(
    family: str, where: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fam = FAMILIES[family]
    out = answer(fam)
    at = step_in(fam, where)  # ChatStream.message is called once per step: its call at + 1
    clean = chat(fam, out)
    monkeypatch.setattr(ChatStream, "message", faulty(ChatStream.message, at + 1))
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        seen = chat(fam, out)  # raises nothing
    assert_handed_over(seen, clean, at)
    assert seen.joined("content").endswith("".join(seen.detok_steps[at:]))
    failures = [r for r in caplog.records if "the parser raised" in r.getMessage()]
    assert len(failures) == 1 and "Injected" in failures[0].getMessage()
    assert failures[0].exc_info is not None


@pytest.mark.parametrize("step", [1, 3])
def test_a_fault_after_the_core_took_the_ids(step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The core has taken the step's ids, the deltas are being read: that step and the
    rest are the detokenizer's text, what went out before stays."""
    fam = FAMILIES["qwen3"]
    out = answer(fam, thought="Split 🫨 characters 東京 and <thinking> about it.")
    clean = chat(fam, out, step=step)
    monkeypatch.setattr(ChatStream, "_take", faulty(ChatStream._take, 3))
    seen = chat(fam, out, step=step)
    assert_handed_over(seen, clean, failing_step(seen, clean))


def test_channels_that_cannot_be_built_leave_the_whole_reply_as_content(monkeypatch: pytest.MonkeyPatch) -> None:
    fam = FAMILIES["qwen3"]
    out = answer(fam)
    clean = chat(fam, out)

    def broken(self: Any, *args: Any, **kwargs: Any) -> None:
        raise Injected("no channels")

    monkeypatch.setattr(ChatStream, "__init__", broken)
    seen = chat(fam, out)
    assert_handed_over(seen, clean, 0)
    tok = tokenizer(fam.tokenizer)
    prompt = enc(tok, fam.prompt)
    full = tok.decode(prompt + out, skip_special_tokens=False)[len(tok.decode(prompt, skip_special_tokens=False)) :]
    assert seen.joined("content") == full


def test_a_harmony_step_that_raises_sends_the_detokenizers_text_from_then_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-oss's parser reads harmony by id (``harmony.HarmonyChannels``): the same hand-over."""
    from detok_plugin.integrations.vllm import harmony as _harmony
    from test_vllm_chat_presets import CALL, FINAL, THOUGHT, harmony_chat, harmony_ids

    out = harmony_ids([THOUGHT, CALL, FINAL])
    clean = harmony_chat(out)
    at = len(out) // 2  # mid-reply
    monkeypatch.setattr(_harmony.HarmonyChannels, "message", faulty(_harmony.HarmonyChannels.message, at + 1))
    seen = harmony_chat(out)
    assert_handed_over(seen, clean, at)
    assert seen.joined("reasoning") == THOUGHT[2]  # sent before the fault, and kept


@pytest.mark.parametrize("names", [("detok_qwen3", "detok_qwen3"), ("detok_gpt_oss", "detok_gpt_oss")])
def test_non_streaming_parse_that_raises_returns_the_output_as_content(
    names: tuple[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tok = tokenizer("qwen3")
    chat_registry.register_chat_parsers()
    parser_cls = ParserManager.get_parser(tool_parser_name=names[1], reasoning_parser_name=names[0],
                                          enable_auto_tools=True, tokenizer=tok)
    assert parser_cls is not None and issubclass(parser_cls, vllm_chat.DetokChatParser)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS)
    parser = parser_cls(tok, request.tools)
    real = parser_cls._parse

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        real(self, *args, **kwargs)  # the channels ran, then broke
        raise Injected("channels broke")

    monkeypatch.setattr(parser_cls, "_parse", broken)
    text = "<think>hm</think>Sure."
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        got = parser.parse(text, request, True, enc(tok, text))
    assert got == (None, text, None)
    assert any(request.request_id in r.getMessage() and "the parser raised" in r.getMessage() for r in caplog.records)
