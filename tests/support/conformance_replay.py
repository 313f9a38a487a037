"""One fixture replayed through vLLM 0.33's chat path, as its OpenAI server drives it.

What ``OpenAIServingChat`` and ``OnlineRenderer`` do for ``/v1/chat/completions`` with
``--enable-auto-tool-choice``, step by step (``vllm/entrypoints/openai/chat_completion/
serving.py``, ``vllm/renderers/online_renderer.py``), each with vLLM's own object:

1. the parser class: ``ParserManager.get_parser(tool, reasoning, enable_auto_tools=True,
   model_name=..., is_harmony=gpt-oss, tokenizer=...)``;
2. the request: a ``ChatCompletionRequest`` with the fixture's tools and
   ``tool_choice="auto"`` (both left out when the fixture offers none, as a client would)
   and ``chat_template_kwargs`` from the fixture's ``thinking`` flag;
3. the renderer's ``adjust_request``, under the renderer's own condition, on a parser that
   was given the prompt ids (``set_prompt_token_ids``); harmony's always;
4. sampling parameters: ``request.to_sampling_params``, then the family's stop tokens as
   ``generation_config.json``'s ``eos_token_id`` (``update_from_generation_config``, as
   vLLM's ``InputProcessor`` applies it);
5. the ids through vLLM's real ``OutputProcessor`` (whose detokenizer is the plugin's when
   the plugin is on), one ``EngineCoreOutput`` per group; a generation that was not cut by
   ``max_tokens`` ends with its stop token and ``FinishReason.STOP`` (the detokenizer drops
   the token from the text, as in a server), a truncated one with ``FinishReason.LENGTH``;
6. streaming: each output through ``ChatStreamProcessor.step`` (serving's per-choice
   object), its deltas accumulated as an OpenAI client does (CanIToolCall's
   ``StreamAccumulator``); not streaming: ``parser.parse`` on the final output, after
   ``set_prompt_token_ids``, then ``assemble_chat_message_fields``.

An exception raised by vLLM's or the plugin's code is a parse outcome
(``ParseResult(exception=...)``), as CanIToolCall's adapters report it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from canitoolcall.results import ParsedToolCall, ParseResult, StreamAccumulator
from detok_plugin.integrations import vllm as shim
from detok_plugin.integrations.vllm import chat_registry
from vllm.entrypoints.openai.chat_completion.message_assembly import assemble_chat_message_fields
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.chat_completion.stream_processor import ChatStreamProcessor
from vllm.parser import ParserManager
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.output_processor import OutputProcessor

__all__ = [
    "USER_MESSAGE", "Replay", "plugin_switch", "registered_names", "replay_nonstream", "replay_stream", "with_stop",
]

#: The one user turn of the request (fixtures carry no messages).
USER_MESSAGE = "Use the tools to answer."
MAX_TOKENS = 1 << 16


@contextlib.contextmanager
def plugin_switch(on: bool) -> Iterator[None]:
    """The plugin's detokenizer on (``DETOK_PLUGIN=1``) or off, with the ``detok_*`` names
    registered either way, as ``detok_plugin.integrations.vllm.register`` does in a server."""
    before = os.environ.get("DETOK_PLUGIN")
    shim.unregister()
    os.environ["DETOK_PLUGIN"] = "1" if on else "0"
    try:
        shim.register()
        chat_registry.register_chat_parsers()
        yield
    finally:
        shim.unregister()
        if before is None:
            os.environ.pop("DETOK_PLUGIN", None)
        else:
            os.environ["DETOK_PLUGIN"] = before


@dataclass(frozen=True)
class Replay:
    """Everything fixed for one fixture under one pair of parser names."""

    tokenizer: Any  # vLLM's cached wrapper of a real tokenizer
    model: str  # the reference model (ModelConfig.model)
    reasoning_parser: str | None
    tool_parser: str
    is_harmony: bool
    tools: tuple[dict[str, Any], ...]
    chat_template_kwargs: dict[str, Any]
    prompt_ids: tuple[int, ...]
    stop_ids: tuple[int, ...]  # the family's stop tokens (generation_config.json's eos_token_id)
    stop_id: int | None  # appended to the output: it ended the generation (None: max_tokens cut it)

    @functools.cached_property
    def model_config(self) -> Any:
        """The stand-in for the server's ``ModelConfig`` (:func:`model_config`)."""
        eos = list(self.stop_ids)
        return types.SimpleNamespace(try_get_generation_config=lambda: {"eos_token_id": eos} if eos else {})

    @functools.cached_property
    def parser_cls(self) -> Any:
        """The parser class, resolved once, as vLLM's chat server resolves it at start-up
        (``OpenAIServingChat.__init__``); per request it only builds an instance. Read it
        first under the plugin switch the replays run in."""
        return ParserManager.get_parser(
            tool_parser_name=self.tool_parser,
            reasoning_parser_name=self.reasoning_parser,
            enable_auto_tools=True,
            model_name=self.model,
            is_harmony=self.is_harmony,
            tokenizer=self.tokenizer,
        )


def model_config(replay: Replay) -> Any:
    """What of the server's ``ModelConfig`` a parser reads here: its generation config, whose
    ``eos_token_id`` are the family's stop tokens (the ids the sampling parameters stop on,
    step 4). A real ``ModelConfig`` needs the model's ``config.json``, which the zoo's
    tokenizers do not have. One object per replay, as a server has one for all its requests."""
    return replay.model_config


def _request(replay: Replay, *, stream: bool) -> ChatCompletionRequest:
    tool_fields: dict[str, Any] = {"tools": list(replay.tools), "tool_choice": "auto"} if replay.tools else {}
    return ChatCompletionRequest(
        model=replay.model,
        messages=[{"role": "user", "content": USER_MESSAGE}],
        stream=stream,
        chat_template_kwargs=replay.chat_template_kwargs or None,
        **tool_fields,
    )


def _rendered(replay: Replay, parser_cls: Any, request: ChatCompletionRequest, ctk: dict[str, Any]) -> Any:
    """``OnlineRenderer``: ``adjust_request`` under its condition (harmony: always)."""
    tok = replay.tokenizer
    if replay.is_harmony:
        parser_cls(tok, request.tools, model_config=model_config(replay)).adjust_request(request=request)
        return request
    adjust = (
        getattr(parser_cls, "always_adjust_request", False)
        or parser_cls.reasoning_parser_cls is not None
        or getattr(request, "tool_choice", "none") != "none"
    )
    if not adjust:
        return request
    request_parser = parser_cls(tok, request.tools, model_config=model_config(replay), chat_template_kwargs=ctk)
    request_parser.set_prompt_token_ids(list(replay.prompt_ids))
    return request_parser.adjust_request(request=request)


def _prepared(replay: Replay, *, stream: bool) -> tuple[Any, ChatCompletionRequest, dict[str, Any], Any]:
    """The parser class, the adjusted request, serving's chat_template_kwargs, the sampling params."""
    parser_cls = replay.parser_cls
    request = _request(replay, stream=stream)
    ctk = dict(request.build_chat_params(None, "auto").chat_template_kwargs)
    request = _rendered(replay, parser_cls, request, ctk)
    params = request.to_sampling_params(MAX_TOKENS, {})
    params.update_from_generation_config({"eos_token_id": list(replay.stop_ids)}, replay.tokenizer.eos_token_id)
    return parser_cls, request, ctk, params


def _engine_outputs(replay: Replay, params: Any, groups: Sequence[Sequence[int]]) -> Iterator[tuple[Any, Any]]:
    """``(RequestOutput, CompletionOutput)`` per engine step, from vLLM's OutputProcessor."""
    op = OutputProcessor(replay.tokenizer, log_stats=False)
    op.add_request(
        EngineCoreRequest(
            request_id="r", external_req_id="r", prompt_token_ids=list(replay.prompt_ids), mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=0.0, lora_request=None,
            cache_salt=None, data_parallel_rank=None,
        ),
        None,
    )
    finish = FinishReason.STOP if replay.stop_id is not None else FinishReason.LENGTH
    for i, group in enumerate(groups):
        last = i == len(groups) - 1
        out = op.process_outputs(
            [EngineCoreOutput(request_id="r", new_token_ids=list(group), finish_reason=finish if last else None)]
        )
        for ro in out.request_outputs:
            for co in ro.outputs:
                yield ro, co
        if out.reqs_to_abort:  # a stop string: the engine drops the request
            return


def with_stop(replay: Replay, ids: Sequence[int]) -> list[int]:
    """The engine's output ids: the fixture's, then the stop token that ended it, if any."""
    return [*ids, replay.stop_id] if replay.stop_id is not None else list(ids)


def replay_stream(replay: Replay, groups: Sequence[Sequence[int]]) -> ParseResult:
    """A streamed reply, its deltas joined as a client joins them. ``groups`` partition the
    engine's output ids (:func:`with_stop`)."""
    acc = StreamAccumulator()
    try:
        parser_cls, request, ctk, params = _prepared(replay, stream=True)
        parser = parser_cls(replay.tokenizer, request.tools, chat_template_kwargs=ctk, model_config=model_config(replay))
        processor = ChatStreamProcessor(request, parser, enable_auto_tools=True, parser_cls=parser_cls)
        for ro, co in _engine_outputs(replay, params, groups):
            ids = list(co.token_ids)
            if not co.text and not ids and not processor.num_output_tokens and co.finish_reason is None:
                continue  # serving skips empty chunks
            delta, _finish = processor.step(co.text, ids, co.finish_reason, ro.prompt_token_ids)
            _add(acc, delta)
    except Exception as exc:
        return acc.result(exception=f"{type(exc).__name__}: {exc}")
    return acc.result()


def _add(acc: StreamAccumulator, delta: Any) -> None:
    if delta is None:
        return
    acc.add_content(delta.content)
    acc.add_reasoning(delta.reasoning)
    for tc in delta.tool_calls or ():
        fn = tc.function
        acc.add_tool_call(int(tc.index), fn.name if fn else None, fn.arguments if fn else None)


def replay_nonstream(replay: Replay, ids: Sequence[int]) -> ParseResult:
    """A non-streamed reply: the final output's text and ids through ``parser.parse``."""
    try:
        parser_cls, request, ctk, params = _prepared(replay, stream=False)
        parser = parser_cls(replay.tokenizer, request.tools, chat_template_kwargs=ctk, model_config=model_config(replay))
        final = None
        for ro, co in _engine_outputs(replay, params, [with_stop(replay, ids)]):
            final = (ro, co)
        if final is None:
            return ParseResult(exception="HarnessError: the OutputProcessor sent no final output")
        ro, co = final
        if ro.prompt_token_ids is not None:
            parser.set_prompt_token_ids(ro.prompt_token_ids)
        reasoning, content, tool_calls = parser.parse(
            co.text, request, enable_auto_tools=True, model_output_token_ids=list(co.token_ids)
        )
        fields = assemble_chat_message_fields(
            request, reasoning, content, tool_calls, enable_auto_tools=True, parser_cls=parser_cls
        )
    except Exception as exc:
        return ParseResult(exception=f"{type(exc).__name__}: {exc}")
    return ParseResult(
        content=fields.content or None,
        reasoning_content=fields.reasoning or None,
        tool_calls=tuple(ParsedToolCall(tc.function.name, tc.function.arguments) for tc in fields.tool_calls),
    )


def registered_names() -> tuple[frozenset[str], frozenset[str]]:
    """vLLM's registered reasoning-parser and tool-parser names (detok's included once registered)."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    return frozenset(ReasoningParserManager.list_registered()), frozenset(ToolParserManager.list_registered())
