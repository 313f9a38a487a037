"""A family is one module and one registry entry: a made-up format (``made_up_family.py``),
registered, streams through vLLM 0.33's real chat layer (OutputProcessor, then
``ChatStreamProcessor``) under ``detok_made_up``, at any step size, with no other change."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

import made_up_family  # noqa: E402
from test_vllm_chat import TOOLS, Family, chat, enc, tokenizer  # noqa: E402

from detok_plugin import TagSet, families  # noqa: E402

FAM = Family(
    "qwen3", ("detok_made_up", "detok_made_up"), None,
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", ("<think>", "</think>"), ("<call>", "</call>"),
)
ARGS = {"city": "東京", "note": "a | bar and a } brace"}


@pytest.fixture
def made_up() -> Iterator[None]:
    families.register(made_up_family.FAMILY)
    yield
    families.unregister("made_up")


@pytest.mark.parametrize("step", [1, 2, 5])
def test_a_made_up_family_streams_through_vllms_chat_layer(made_up: None, step: int) -> None:
    assert TagSet.preset("made_up").tool_format == "made_up"
    tok = tokenizer("qwen3")
    args = json.dumps(ARGS, ensure_ascii=False)
    out = (
        enc(tok, "<think>") + enc(tok, "東京 🫨?") + enc(tok, "</think>") + enc(tok, "Checking.")
        + enc(tok, "<call>") + enc(tok, f"get_weather|{args}") + enc(tok, "</call>") + enc(tok, " Done.")
    )
    seen = chat(FAM, out, step=step)
    assert seen.joined("reasoning") == "東京 🫨?"
    assert seen.joined("content") == "Checking. Done."
    assert seen.calls() == [("get_weather", ARGS)]
    # The name went out before its arguments were complete: the reader streamed them.
    first = next(d for d in seen.deltas if d is not None and d.tool_calls)
    assert first.tool_calls[0].function.name == "get_weather"
    assert TOOLS  # the request carried tools, so the tool half was live


def test_an_unregistered_family_is_not_a_preset() -> None:
    with pytest.raises(ValueError, match="unknown tag preset"):
        TagSet.preset("made_up")
