"""What a ``detok_*`` parser sets up per request in vLLM 0.33's chat layer, and what it
leaves alone: the tags reach the detokenizer only for a request with stop strings (the one
thing it reads them for), the detokenizer is the plain stream otherwise, and the parser
class vLLM composes from the names is kept per pair of names and family registration.

Real parts: the Qwen3 tokenizer (tests/support/tokenizer_zoo.py), vLLM's own
``ParserManager``, ``ChatCompletionRequest`` and ``OutputProcessor``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("vllm.parser.abstract_parser", reason="vLLM 0.32+ is not installed")

import made_up_family  # noqa: E402
from detok_plugin.integrations import vllm as shim  # noqa: E402
from detok_plugin.integrations.vllm import chat_registry  # noqa: E402
from detok_plugin.integrations.vllm.xargs import REASONING_TAGS_KEY, TOOL_TAGS_KEY  # noqa: E402
from test_vllm_chat import TOOLS, enc, tokenizer  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.parser import ParserManager  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor  # noqa: E402

from detok_plugin import ServingStream, TaggedServingStream, families  # noqa: E402

PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
REPLY = "<think>Let me STOP and think.</think>Sure.<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    shim.unregister()
    monkeypatch.setenv("DETOK_PLUGIN", "1")
    shim.register()
    chat_registry.register_chat_parsers()
    yield
    shim.unregister()


def _parser_class(name: str = "detok_qwen3") -> type:
    cls = ParserManager.get_parser(
        tool_parser_name=name, reasoning_parser_name=name, enable_auto_tools=True, tokenizer=tokenizer("qwen3")
    )
    assert cls is not None
    return cls


def _run(stop: list[str] | None) -> tuple[ChatCompletionRequest, object, str]:
    """The request as the parser adjusted it, the detokenizer's stream, and its text."""
    tok = tokenizer("qwen3")
    cls = _parser_class()
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, stop=stop)
    request = cls(tok, request.tools).adjust_request(request)
    op = OutputProcessor(tok, log_stats=False)
    op.add_request(EngineCoreRequest(
        request_id="r", external_req_id="r", prompt_token_ids=enc(tok, PROMPT), mm_features=None,
        sampling_params=request.to_sampling_params(1000, {}), pooling_params=None, arrival_time=0.0,
        lora_request=None, cache_salt=None, data_parallel_rank=None,
    ), None)
    stream = op.request_states["r"].detokenizer._stream
    out = op.process_outputs([EngineCoreOutput(request_id="r", new_token_ids=enc(tok, REPLY), finish_reason=FinishReason.LENGTH)])
    return request, stream, out.request_outputs[0].outputs[0].text


def test_without_stop_strings_the_request_carries_no_tags_and_the_stream_is_plain(plugin: None) -> None:
    request, stream, text = _run(None)
    assert not request.vllm_xargs
    assert type(stream) is ServingStream
    assert text == REPLY  # the decode, tags and body included, as with the tags


def test_with_stop_strings_the_tags_reach_the_detokenizer(plugin: None) -> None:
    request, stream, text = _run(["STOP"])
    assert request.vllm_xargs == {
        REASONING_TAGS_KEY: ["<think>", "</think>"], TOOL_TAGS_KEY: ["<tool_call>", "</tool_call>"],
    }
    assert type(stream) is TaggedServingStream
    assert text == REPLY  # the stop inside reasoning is text (vllm-project/vllm#53066)


def test_the_composed_class_is_kept_per_pair_of_names(plugin: None) -> None:
    assert _parser_class() is _parser_class()
    assert _parser_class("detok_hermes") is not _parser_class()


def test_a_family_registered_again_is_composed_again(plugin: None) -> None:
    families.register(made_up_family.FAMILY)
    try:
        first = _parser_class("detok_made_up")
        assert first.tags.tool_open == "<call>"
        preset = made_up_family.FAMILY.presets[0]
        other = families.Family(made_up_family.FAMILY.format, (preset.__class__("made_up", "<think>", "</think>", "<fn>", "</fn>"),))
        families.register(other)
        again = _parser_class("detok_made_up")
        assert again is not first and again.tags.tool_open == "<fn>"
    finally:
        families.unregister("made_up")
    with pytest.raises(ValueError, match="unknown tag preset"):  # unregistered: no preset, as before it was composed
        _parser_class("detok_made_up")
