"""vLLM's chat layer with detok's parsers (``--reasoning-parser detok_*``): reasoning, content
and tool calls from the core's channels (``detok_plugin.integrations.vllm.chat``, over ``detok_plugin.ChatStream``).

Real parts only: real tokenizers (Qwen3, DeepSeek V3, Mistral v1, Llama 3 from
tests/support/tokenizer_zoo.py), vLLM 0.33's real ``OutputProcessor`` (the detokenizer plugin on or
off through its real entry point), vLLM's real ``ParserManager`` choosing the parser from
the command-line names, its real ``ChatCompletionRequest`` (``adjust_request``,
``to_sampling_params``) and its real ``ChatStreamProcessor``, the per-choice object
``OpenAIServingChat``'s streaming generator calls once per engine output (the generator
itself needs a ModelConfig of a real model checkpoint, which this project cannot load).
Engine outputs are replays of token ids made by encoding text with the real tokenizer,
one and several ids per step. The oracle is the tokenizer's own decode, split at the tag
strings and cut at the first stop outside reasoning, computed here by string operations.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("vllm.parser.abstract_parser", reason="vLLM 0.32+ is not installed")

import tokenizer_zoo  # noqa: E402
from detok_plugin.integrations import vllm as shim  # noqa: E402
from detok_plugin.integrations.vllm import chat as vllm_chat  # noqa: E402
from detok_plugin.integrations.vllm import chat_registry  # noqa: E402
from vllm.entrypoints.generate.base.protocol import DeltaMessage  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.entrypoints.openai.chat_completion.stream_processor import ChatStreamProcessor  # noqa: E402
from vllm.parser import ParserManager  # noqa: E402
from vllm.tokenizers.hf import get_cached_tokenizer  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor  # noqa: E402

from detok_plugin import build_table  # noqa: E402
from detok_plugin._tagged import RestTexts  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
ARGS = {"city": "東京", "days": 3, "note": "a \"quoted\" }] brace"}


@dataclass(frozen=True)
class Family:
    """One model family: its tokenizer, detok's parser names, vLLM's own, its markers."""

    tokenizer: str
    names: tuple[str | None, str]  # (--reasoning-parser, --tool-call-parser)
    stock: tuple[str | None, str] | None  # vLLM's own parsers for the family
    prompt: str
    think: tuple[str, str] | None
    tool: tuple[str, str]  # open, close ("" = runs to the end)

    def body(self, name: str, args: dict[str, Any]) -> str:
        a = json.dumps(args, ensure_ascii=False)
        if self.names[1] == "detok_deepseek_v31":
            return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{a}<｜tool▁call▁end｜>"
        if self.tokenizer == "deepseek_v3":
            return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{a}\n```<｜tool▁call▁end｜>"
        if self.tokenizer == "mistral_v1":
            return f'[{{"name": "{name}", "arguments": {a}}}]'
        if self.tokenizer == "llama3":
            return f'{{"name": "{name}", "parameters": {a}}}'
        return f'\n{{"name": "{name}", "arguments": {a}}}\n'

    def calls_in(self, body: str) -> list[tuple[str, Any]]:
        """The oracle's parse of a tool body (by format, with the standard library)."""
        if self.names[1] == "detok_deepseek_v31":
            name, _, rest = body.partition("<｜tool▁call▁begin｜>")[2].partition("<｜tool▁sep｜>")
            return [(name, json.loads(rest.partition("<｜tool▁call▁end｜>")[0]))]
        if self.tokenizer == "deepseek_v3":
            _head, _, rest = body.partition("<｜tool▁sep｜>")
            name, _, rest = rest.partition("\n")
            return [(name, json.loads(rest.split("```json\n")[1].split("\n```")[0]))]
        obj = json.loads(body)
        items = obj if isinstance(obj, list) else [obj]
        return [(o["name"], o.get("arguments", o.get("parameters"))) for o in items]


FAMILIES = {
    "qwen3": Family("qwen3", ("detok_qwen3", "detok_qwen3"), ("qwen3", "hermes"),
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
                    ("<think>", "</think>"), ("<tool_call>", "</tool_call>")),
    "deepseek_r1": Family("deepseek_v3", ("detok_deepseek_r1", "detok_deepseek_r1"), ("deepseek_r1", "deepseek_v3"),
                          "<｜User｜>hi<｜Assistant｜>", ("<think>", "</think>"),
                          ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")),
    "deepseek_v31": Family("deepseek_v3", ("detok_deepseek_v31", "detok_deepseek_v31"), ("deepseek_r1", "deepseek_v31"),
                           "<｜User｜>hi<｜Assistant｜>", ("<think>", "</think>"),
                           ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")),
    "mistral": Family("mistral_v1", (None, "detok_mistral"), None, "[INST] hi [/INST]", None, ("[TOOL_CALLS]", "")),
    "llama3": Family("llama3", (None, "detok_llama3"), (None, "llama3_json"),
                     "<|start_header_id|>assistant<|end_header_id|>\n\n", None, ("<|python_tag|>", "")),
}
FAMILY_PARAMS = [pytest.param(name, id=name) for name in FAMILIES]
STEPS = [pytest.param(1, id="1-per-step"), pytest.param(3, id="3-per-step")]


@functools.cache
def tokenizer(name: str) -> Any:
    return get_cached_tokenizer(tokenizer_zoo.load(name))


def enc(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def byte_ids(tok: Any, text: str) -> list[int]:
    """``text`` spelled one UTF-8 byte per token (the tokenizer's own byte pieces)."""
    table, _ = build_table(tok)
    assert table is not None
    if table.family == "byte_level":
        find = {p: i for i, p in enumerate(table.pieces) if p is not None and len(p) == 1}
        return [find[bytes((b,))] for b in text.encode()]
    find_b = {b: i for i, b in enumerate(table.byte_values) if b >= 0}
    return [find_b[b] for b in text.encode()]


# --- the replay through vLLM's chat layer --------------------------------------------


@dataclass
class Chat:
    """What a streaming client saw: each step's delta, and the channels joined."""

    deltas: list[Any] = field(default_factory=list)
    finish_reason: str | None = None
    detok_text: str = ""  # what the detokenizer (OutputProcessor) sent, joined
    detok_steps: list[str] = field(default_factory=list)  # ... and per step

    def joined(self, name: str) -> str:
        return "".join(getattr(d, name) or "" for d in self.deltas if d is not None)

    def calls(self) -> list[tuple[str, Any]]:
        acc: dict[int, list[str]] = {}
        for d in self.deltas:
            for tc in (d.tool_calls if d is not None else ()):
                entry = acc.setdefault(tc.index, ["", ""])
                if tc.function is not None:
                    entry[0] += tc.function.name or ""
                    entry[1] += tc.function.arguments or ""
        return [(n, json.loads(a)) for n, a in (acc[i] for i in sorted(acc))]


def chat(
    fam: Family, out: Sequence[int], *, step: int = 1, stop: list[str] | None = None,
    plugin: bool = True, names: tuple[str | None, str] | None = None, tools: bool = True,
    prompt: str | None = None, finish: FinishReason = FinishReason.LENGTH, **fields: Any,
) -> Chat:
    """Replay ``out`` through OutputProcessor and the chat layer; return what was streamed."""
    tok = tokenizer(fam.tokenizer)
    shim.unregister()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DETOK_PLUGIN", "1" if plugin else "0")
        shim.register()
        chat_registry.register_chat_parsers()  # the names, also with the detokenizer off
        try:
            return _replay(fam, tok, out, step, stop, names or fam.names, tools, prompt or fam.prompt, fields, finish)
        finally:
            shim.unregister()


def _replay(
    fam: Family, tok: Any, out: Sequence[int], step: int, stop: Any, names: Any, tools: bool, prompt_text: str,
    fields: dict[str, Any], finish: FinishReason = FinishReason.LENGTH,
) -> Chat:
    r_name, t_name = names
    parser_cls = ParserManager.get_parser(
        tool_parser_name=t_name, reasoning_parser_name=r_name, enable_auto_tools=True, tokenizer=tok
    )
    assert parser_cls is not None
    request = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS if tools else None,
        stop=stop, stream=True, **fields,
    )
    parser = parser_cls(tok, request.tools)
    request = parser.adjust_request(request)  # as vLLM's renderer does before sampling
    params = request.to_sampling_params(10_000, {})
    prompt = enc(tok, prompt_text)
    op = OutputProcessor(tok, log_stats=False)
    op.add_request(EngineCoreRequest(
        request_id="r", external_req_id="r", prompt_token_ids=prompt, mm_features=None,
        sampling_params=params, pooling_params=None, arrival_time=0.0, lora_request=None,
        cache_salt=None, data_parallel_rank=None,
    ), None)
    processor = ChatStreamProcessor(request, parser, enable_auto_tools=True, parser_cls=parser_cls)
    seen = Chat()
    for i in range(0, len(out), step):
        done = i + step >= len(out)
        outputs = [EngineCoreOutput(request_id="r", new_token_ids=list(out[i : i + step]),
                                    finish_reason=finish if done else None)]
        processed = op.process_outputs(outputs)
        for ro in processed.request_outputs:
            for co in ro.outputs:
                seen.detok_text += co.text
                seen.detok_steps.append(co.text)
                result = processor.step(co.text, list(co.token_ids), co.finish_reason, ro.prompt_token_ids)
                seen.deltas.append(result.delta)
                seen.finish_reason = result.finish_reason or seen.finish_reason
        if processed.reqs_to_abort:  # a stop string: the engine drops the request
            break
    return seen


# --- the oracle ------------------------------------------------------------------------


@dataclass
class Split:
    reasoning: str
    content: str
    calls: list[tuple[str, Any]]


def edges(segment: str) -> str:
    """The chat layer's rule for one reasoning or content segment (a run between reasoning
    tags, the reply's start and end; a tool call is no edge, the content on both sides of it
    joins; ``detok_plugin._edges``): the whitespace at its edges is markup, not text."""
    return segment.strip()


def oracle(fam: Family, out: Sequence[int], stop: Sequence[str] = ()) -> Split:
    """The full decode (special tokens kept, so id-only tags show), split at the tags, cut
    at the first stop string in the answer, each segment less its edges (:func:`edges`)."""
    tok = tokenizer(fam.tokenizer)
    prompt = enc(tok, fam.prompt)
    full = tok.decode(prompt + list(out), skip_special_tokens=False)[len(tok.decode(prompt, skip_special_tokens=False)) :]
    reasoning, rest, segments = "", full, []
    if fam.think is not None and fam.think[0] in rest:
        before, _, after = rest.partition(fam.think[0])
        reasoning, _, rest = after.partition(fam.think[1])
        segments.append(before)
    calls: list[tuple[str, Any]] = []
    if fam.tool[0] in rest:
        said, _, body = rest.partition(fam.tool[0])
        if fam.tool[1]:
            body, _, tail = body.partition(fam.tool[1])
            said += tail  # the content after the call joins the content before it
        calls = fam.calls_in(body.strip() if fam.tokenizer != "deepseek_v3" else body)
        rest = said
    segments.append(rest)
    joined = "".join(segments)
    cut = min((joined.index(s) for s in stop if s in joined), default=len(joined))
    kept = []
    for segment in segments:  # the content before the first stop, segment by segment
        kept.append(segment[: max(cut, 0)])
        cut -= len(segment)
    return Split(edges(reasoning), "".join(edges(s) for s in kept), calls)


def answer(fam: Family, thought: str = "Let me think: 東京 weather 🫨?", said: str = "Sure, checking.\n") -> list[int]:
    """Reasoning, an answer and a tool call, each part encoded by the tokenizer."""
    tok = tokenizer(fam.tokenizer)
    ids: list[int] = []
    if fam.think is not None:
        ids += enc(tok, fam.think[0]) + enc(tok, thought) + enc(tok, fam.think[1])
    ids += enc(tok, said)
    ids += enc(tok, fam.tool[0]) + enc(tok, fam.body("get_weather", ARGS))
    if fam.tool[1]:
        ids += enc(tok, fam.tool[1])
    return ids


def assert_channels(seen: Chat, want: Split) -> None:
    assert seen.joined("reasoning") == want.reasoning
    assert seen.joined("content") == want.content
    assert seen.calls() == want.calls


# --- the tests --------------------------------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_channels_join_to_the_split_decode(family: str, step: int) -> None:
    fam = FAMILIES[family]
    out = answer(fam)
    seen = chat(fam, out, step=step)
    want = oracle(fam, out)
    assert want.calls and (want.reasoning or fam.think is None)
    assert_channels(seen, want)


@pytest.mark.parametrize("family", ["qwen3", "deepseek_r1"])
def test_stop_inside_reasoning_is_text_53066(family: str) -> None:
    """vllm-project/vllm#53066: a stop string that occurs only in the reasoning must not
    end the reply with ``content: null``; the detokenizer sends the whole text."""
    fam = FAMILIES[family]
    out = answer(fam, thought="Think. STOP is just a word here.")
    seen = chat(fam, out, stop=["STOP"])
    want = oracle(fam, out, stop=["STOP"])
    assert "STOP" in want.reasoning and want.content
    assert_channels(seen, want)
    assert seen.finish_reason != "stop"


def test_stock_vllm_ends_in_reasoning_53066() -> None:
    """Stock vLLM (its detokenizer, its qwen3 parser) on the same case: no content at all."""
    fam = FAMILIES["qwen3"]
    out = answer(fam, thought="Think. STOP is just a word here.")
    seen = chat(fam, out, stop=["STOP"], plugin=False, names=fam.stock)
    assert seen.joined("content").strip() == "" and not seen.calls()
    assert seen.finish_reason == "stop"


@pytest.mark.parametrize("step", STEPS)
def test_stop_in_the_answer_cuts_the_answer_only(step: int) -> None:
    fam = FAMILIES["qwen3"]
    out = answer(fam, thought="I may say checking here.", said="Sure, checking. Then more.\n")
    seen = chat(fam, out, stop=["checking."], step=step, tools=False)
    tok = tokenizer(fam.tokenizer)
    full = oracle(fam, out)  # tools off: the tool call is text of the answer
    assert seen.joined("reasoning") == full.reasoning
    assert seen.joined("content") == edges("Sure, ")  # the stop ended the segment
    assert seen.finish_reason == "stop"
    # The detokenizer's text is the full decode with its tags, cut at the same place.
    prompt = enc(tok, fam.prompt)
    decoded = tok.decode(prompt + out)[len(tok.decode(prompt)) :]
    assert seen.detok_text == decoded[: decoded.index("checking.", decoded.index("</think>"))]


def test_with_the_detokenizer_off_stops_cut_where_stock_cuts() -> None:
    """The detok parser behind vLLM's stock detokenizer: the stop inside the reasoning
    ends the request there (stock's rule), and the parser agrees with that text."""
    fam = FAMILIES["qwen3"]
    out = answer(fam, thought="Think. STOP is just a word here.")
    seen = chat(fam, out, stop=["STOP"], plugin=False)
    assert seen.joined("reasoning") == edges("Think. ")  # the stop ended the segment
    assert seen.joined("content") == "" and seen.finish_reason == "stop"


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("family", ["qwen3", "deepseek_r1", "mistral"])
def test_a_stop_inside_a_tool_body_is_part_of_the_call(family: str, step: int) -> None:
    """A stop string that occurs only inside a tool call's arguments is not a stop: the
    detokenizer (told the tool tags by the parser's adjust_request) and the parser's
    stream both apply stops outside tool bodies only, so the call arrives whole, the
    detokenizer's text is the whole decode, and the reply is not cut."""
    fam = FAMILIES[family]
    out = answer(fam)
    seen = chat(fam, out, stop=["quoted"], step=step)
    want = oracle(fam, out)
    assert "quoted" in json.dumps(want.calls) and "quoted" not in want.content + want.reasoning
    assert_channels(seen, want)
    assert seen.finish_reason != "stop"
    tok = tokenizer(fam.tokenizer)
    prompt = enc(tok, fam.prompt)
    flags = {"skip_special_tokens": False} if family == "deepseek_r1" else {}
    assert seen.detok_text == tok.decode(prompt + out, **flags)[len(tok.decode(prompt, **flags)) :]


def test_a_stop_after_a_tool_body_still_cuts() -> None:
    """Outside the body the stop applies: the reply ends at the stop after the call."""
    fam = FAMILIES["qwen3"]
    out = answer(fam) + enc(tokenizer(fam.tokenizer), " Done quoted here.")
    seen = chat(fam, out, stop=["quoted"])
    want = oracle(fam, out, stop=["quoted"])
    assert_channels(seen, want)
    # The engine's finish was the stop; vLLM's chat layer reports "tool_calls" once a call
    # was streamed, so read the cut from the detokenizer's text.
    assert seen.detok_text.endswith("Done ")
    assert seen.joined("content").endswith("checking.\n Done")  # one segment: the call between is no edge


def test_stock_vllm_cuts_a_tool_call_at_a_stop_inside_its_body() -> None:
    """Stock vLLM (its detokenizer, its hermes parser): the stop inside the arguments ends
    the reply there, and no complete call reaches the client."""
    fam = FAMILIES["qwen3"]
    out = answer(fam)
    seen = chat(fam, out, stop=["quoted"], plugin=False, names=fam.stock)
    assert "quoted" not in seen.detok_text and seen.detok_text.endswith('"note": "a \\"')
    streamed = "".join(tc.function.arguments or "" for d in seen.deltas if d for tc in d.tool_calls if tc.function)
    assert "quoted" not in streamed
    with pytest.raises(ValueError):
        json.loads(streamed)


@pytest.mark.parametrize("family", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("tag", ["open_think", "close_think", "open_tool", "close_tool"])
def test_tags_split_at_every_byte(family: str, tag: str) -> None:
    """Each tag spelled as text split into two tokens at every byte, and one byte per
    token: nothing of it leaks, and the channel switches at the tag's last token."""
    fam = FAMILIES[family]
    tok = tokenizer(fam.tokenizer)
    assert fam.think is not None
    text = {"open_think": fam.think[0], "close_think": fam.think[1], "open_tool": fam.tool[0], "close_tool": fam.tool[1]}[tag]
    whole = enc(tok, text)
    base = answer(fam)
    at = next(i for i in range(len(base)) if base[i : i + len(whole)] == whole)
    raw = text.encode()
    spellings = [byte_ids(tok, text)]
    for cut in range(1, len(raw)):
        try:
            head, tail = raw[:cut].decode(), raw[cut:].decode()
        except UnicodeDecodeError:
            head = tail = ""
        spellings.append(enc(tok, head) + enc(tok, tail) if head and tail else byte_ids(tok, text))
    want = oracle(fam, base)
    for spelled in spellings:
        assert tok.decode(spelled) == text
        out = base[:at] + spelled + base[at + len(whole) :]
        seen = chat(fam, out)
        assert_channels(seen, want)
        if tag == "close_think":
            # The reasoning is complete in the delta of the tag's last token.
            last = at + len(spelled) - 1
            assert "".join(d.reasoning or "" for d in seen.deltas[: last + 1] if d) == want.reasoning


def _as_sent(seen: Chat) -> list[Any]:
    """Every step's delta as a client receives it, tool call ids left out (random)."""
    sent = []
    for d in seen.deltas:
        fields = d.model_dump(exclude_none=True) if d is not None else None
        for tc in (fields or {}).get("tool_calls", ()):
            tc.pop("id", None)
        sent.append(fields)
    return [sent, seen.detok_steps, seen.finish_reason]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_the_common_ids_shortcut_sends_what_the_core_sends(family: str, step: int) -> None:
    """Both layers take the common id without the core while their stream is at rest
    (``detok_plugin._tagged.RestTexts``); with it off (every id through the core), every
    step's delta, the detokenizer's text per step and the finish are the same: replies
    with a stop in the reasoning, in a tool body, in the answer, tags spelled one byte
    per token, emoji split over tokens, and a request without tools."""
    fam = FAMILIES[family]
    tok = tokenizer(fam.tokenizer)
    cases: list[tuple[list[int], dict[str, Any]]] = [
        (answer(fam), {"stop": ["quoted", "STOP"]}),
        (answer(fam, thought="Think. STOP is a word 🫨 here.", said="Sure 👨‍👩‍👧 then STOP now.\n"), {"stop": ["STOP"]}),
        (answer(fam, said="Sure, checking.\n"), {"stop": ["\n\nUser:", "###"], "tools": False}),
    ]
    spelled = byte_ids(tok, fam.tool[0]) + enc(tok, fam.body("get_weather", ARGS)) + (byte_ids(tok, fam.tool[1]) if fam.tool[1] else [])
    if fam.think is not None:
        spelled = byte_ids(tok, fam.think[0]) + enc(tok, "a ### b") + byte_ids(tok, fam.think[1]) + enc(tok, "ok ") + spelled
    cases.append((spelled, {"stop": ["###"]}))
    for out, kw in cases:
        fast = chat(fam, out, step=step, **kw)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(RestTexts, "of", classmethod(lambda cls, *a: None))
            slow = chat(fam, out, step=step, **kw)
        assert _as_sent(fast) == _as_sent(slow)


def test_a_tool_call_is_sent_whole_once_the_model_finished_it() -> None:
    """By default nothing of a call goes out before its close tag: a call cut short is
    never sent, so a client never runs half a call."""
    fam = FAMILIES["qwen3"]
    out = answer(fam)
    seen = chat(fam, out)
    tok = tokenizer(fam.tokenizer)
    close = out.index(enc(tok, "</tool_call>")[0])
    assert not [tc for d in seen.deltas[:close] if d for tc in d.tool_calls]
    calls = [tc for d in seen.deltas[close:] if d for tc in d.tool_calls]
    assert len(calls) == 1 and calls[0].id and calls[0].type == "function"
    assert calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments) == ARGS


def test_tool_arguments_stream_as_they_form_when_the_request_asks() -> None:
    fam = FAMILIES["qwen3"]
    out = answer(fam)
    seen = chat(fam, out, vllm_xargs={"detok_stream_arguments": True})
    tok = tokenizer(fam.tokenizer)
    close = out.index(enc(tok, "</tool_call>")[0])
    pieces = [tc.function.arguments for d in seen.deltas[:close] if d for tc in d.tool_calls if tc.function and tc.function.arguments]
    assert len(pieces) > 5  # arrived in many steps before the closing tag
    assert json.loads("".join(pieces)) == ARGS
    named = [tc for d in seen.deltas if d for tc in d.tool_calls if tc.function and tc.function.name]
    assert len(named) == 1 and named[0].id and named[0].type == "function"


@pytest.mark.parametrize("step", STEPS)
def test_a_malformed_tool_body_is_reported_not_dropped(step: int) -> None:
    fam = FAMILIES["qwen3"]
    tok = tokenizer(fam.tokenizer)
    bad = '\n{"name": "get_weather", "arguments": {"city": }\n'
    out = enc(tok, "<think>hm</think>") + enc(tok, "Ok.") + enc(tok, "<tool_call>") + enc(tok, bad) + enc(tok, "</tool_call>")
    seen = chat(fam, out, step=step)
    assert seen.joined("reasoning") == "hm"
    assert seen.joined("content") == "Ok.<tool_call>" + bad + "</tool_call>"


@pytest.mark.parametrize("stream_arguments", [False, True])
def test_an_unterminated_tool_call_is_dropped(stream_arguments: bool) -> None:
    """A reply cut inside a call: the model never finished it, so it is neither a call nor
    content (CanIToolCall's spec); without the opt-in nothing of it was streamed either."""
    fam = FAMILIES["qwen3"]
    tok = tokenizer(fam.tokenizer)
    body = '\n{"name": "get_weather", "arguments": {"city": "x"'
    seen = chat(fam, enc(tok, "Ok.<tool_call>") + enc(tok, body), vllm_xargs={"detok_stream_arguments": stream_arguments})
    assert seen.joined("content") == "Ok."
    sent = [tc for d in seen.deltas if d for tc in d.tool_calls]
    assert bool(sent) == stream_arguments  # the opt-in's documented risk: a name went out


def test_non_streaming_parse_equals_the_stream() -> None:
    fam = FAMILIES["qwen3"]
    tok = tokenizer(fam.tokenizer)
    out = answer(fam)
    chat_registry.register_chat_parsers()
    parser_cls = ParserManager.get_parser(tool_parser_name="detok_qwen3", reasoning_parser_name="detok_qwen3",
                                          enable_auto_tools=True, tokenizer=tok)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS)
    parser = parser_cls(tok, request.tools)
    parser.set_prompt_token_ids(enc(tok, fam.prompt))
    reasoning, content, calls = parser.parse("", request, True, out)
    want = oracle(fam, out)
    assert reasoning == want.reasoning and (content or "").strip() == want.content.strip()
    assert [(c.name, json.loads(c.arguments)) for c in calls or ()] == want.calls


def test_a_prompt_that_opens_the_reasoning_starts_the_reply_in_it() -> None:
    """DeepSeek R1's template ends in ``<think>\n``: the reply starts inside reasoning."""
    fam = FAMILIES["deepseek_r1"]
    tok = tokenizer(fam.tokenizer)
    out = enc(tok, "Hmm, 東京.") + enc(tok, "</think>") + enc(tok, "Answer.")
    seen = chat(fam, out, prompt=fam.prompt + "<think>\n")
    assert seen.joined("reasoning") == "Hmm, 東京." and seen.joined("content") == "Answer."


def test_include_reasoning_false_sends_no_reasoning() -> None:
    fam = FAMILIES["qwen3"]
    out = answer(fam)
    seen = chat(fam, out, include_reasoning=False)
    want = oracle(fam, out)
    assert seen.joined("reasoning") == "" and seen.joined("content").strip() == want.content.strip()
    assert seen.calls() == want.calls


def test_tool_choice_none_leaves_the_call_as_text() -> None:
    fam = FAMILIES["qwen3"]
    tok = tokenizer(fam.tokenizer)
    out = answer(fam)
    seen = chat(fam, out, tool_choice="none")
    prompt = enc(tok, fam.prompt)
    decoded = tok.decode(prompt + out)[len(tok.decode(prompt)) :]
    assert not seen.calls()
    assert seen.joined("content") == decoded[decoded.index("</think>") + len("</think>") :]


@pytest.mark.parametrize("step", STEPS)
def test_two_calls_in_one_reply_get_two_indexes(step: int) -> None:
    fam = FAMILIES["qwen3"]
    tok = tokenizer(fam.tokenizer)
    second = {"city": "Paris"}
    out = answer(fam) + enc(tok, "\n<tool_call>") + enc(tok, fam.body("get_weather", second)) + enc(tok, "</tool_call>")
    seen = chat(fam, out, step=step)
    assert seen.calls() == [("get_weather", ARGS), ("get_weather", second)]
    ids = [tc.id for d in seen.deltas if d for tc in d.tool_calls if tc.id]
    assert len(ids) == len(set(ids)) == 2


# --- vLLM's own parsers, on the same outputs -------------------------------------------

#: Cases where vLLM's own parser for the family is wrong, by name; each has a test below
#: that asserts detok's output against the oracle and stock's failure (a fixed vLLM then
#: shows up as a failing test).
STOCK_WRONG = {
    "stop_inside_reasoning": "vllm#53066: a stop string in the reasoning ends the reply with "
    "no content (test_stock_vllm_ends_in_reasoning_53066)",
    "qwen3_close_think_spelled_in_pieces": "vLLM's qwen3 parser finds </think> by token id: spelled "
    "over two tokens, the reasoning never ends and the answer stays reasoning",
    "deepseek_r1_open_think_in_a_multi_token_step": "vLLM's deepseek_r1 parser keeps '<think>' in the "
    "reasoning when the step that brings it has more ids",
    "llama3_python_tag_after_text": "vLLM's llama3_json parser reads the text, from which "
    "skip_special_tokens removed <|python_tag|>: a call after some text stays content",
}

#: Where vLLM's parser is right: every family, one id per step and (but DeepSeek R1) three;
#: Llama 3's call is the whole reply, as vLLM's llama3_json parser expects.
AGREE = [
    pytest.param("qwen3", 1, id="qwen3-1-per-step"),
    pytest.param("qwen3", 3, id="qwen3-3-per-step"),
    pytest.param("deepseek_r1", 1, id="deepseek_r1-1-per-step"),
    pytest.param("deepseek_v31", 1, id="deepseek_v31-1-per-step"),
    pytest.param("llama3", 1, id="llama3-1-per-step"),
    pytest.param("llama3", 3, id="llama3-3-per-step"),
]


@pytest.mark.parametrize(("family", "step"), AGREE)
def test_agrees_with_vllms_own_parser(family: str, step: int) -> None:
    fam = FAMILIES[family]
    assert fam.stock is not None
    out = answer(fam, said="" if family == "llama3" else "Sure, checking.\n")
    ours = chat(fam, out, step=step)
    stock = chat(fam, out, step=step, plugin=False, names=fam.stock)
    assert_channels(ours, oracle(fam, out))
    # One reasoning segment and one content segment: stock's, less their edges.
    assert ours.joined("reasoning") == edges(stock.joined("reasoning"))
    assert ours.joined("content") == edges(stock.joined("content"))
    assert ours.calls() == stock.calls()


def _wire_shapes(seen: Chat) -> set[tuple[tuple[str, ...], tuple[str, ...]]]:
    """Each tool-call delta as vLLM streams it (``exclude_unset``): the fields it sets,
    and its function's."""
    shapes = set()
    for d in seen.deltas:
        for tc in d.model_dump(exclude_unset=True).get("tool_calls", ()) if d is not None else ():
            shapes.add((tuple(sorted(tc)), tuple(sorted(tc.get("function") or ()))))
    return shapes


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v31"])
def test_tool_call_deltas_set_the_fields_vllms_parser_sets(family: str) -> None:
    """A client sees the JSON vLLM's own parser sends: the first delta of a call carries
    its id, type and name, the others its index and a piece of its arguments (no
    ``"id": null``)."""
    fam = FAMILIES[family]
    assert fam.stock is not None
    out = answer(fam)
    ours = _wire_shapes(chat(fam, out, vllm_xargs={"detok_stream_arguments": True}))
    assert ours == _wire_shapes(chat(fam, out, plugin=False, names=fam.stock))
    assert ours == {(("function", "id", "index", "type"), ("name",)), (("function", "index"), ("arguments",))}
    # By default the finished call goes out in one delta: its id, type, name and arguments.
    assert _wire_shapes(chat(fam, out)) == {(("function", "id", "index", "type"), ("arguments", "name"))}


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("step", STEPS)
def test_the_eos_that_ends_a_reply_is_no_text(step: int, skip: bool) -> None:
    """A reply ended by the tokenizer's EOS (a stop the engine core found): neither the
    detokenizer's text nor the parser's channels show it, whether or not special tokens
    are skipped; the call before it arrives whole."""
    fam = FAMILIES["qwen3"]
    tok = tokenizer(fam.tokenizer)
    out = answer(fam) + [tok.eos_token_id]
    seen = chat(fam, out, step=step, finish=FinishReason.STOP, skip_special_tokens=skip)
    assert tok.eos_token not in seen.detok_text
    assert tok.eos_token not in seen.joined("content") + seen.joined("reasoning")
    assert_channels(seen, oracle(fam, out[:-1]))


@pytest.mark.parametrize("family", ["qwen3", "deepseek_r1"])
def test_each_delta_is_the_one_deltamessage_builds(family: str) -> None:
    """The parser builds its deltas through DeltaMessage's validator (``new_delta``): each
    is equal to ``DeltaMessage(**fields)`` of what it sets, sets the same fields and
    dumps the same JSON, tool calls included."""
    fam = FAMILIES[family]
    seen = chat(fam, answer(fam), stop=["quoted"])
    deltas = [d for d in seen.deltas if d is not None]
    assert any(d.tool_calls for d in deltas) and any(d.reasoning for d in deltas) and any(d.content for d in deltas)
    for d in deltas:
        assert type(d) is DeltaMessage
        fields = d.model_dump(exclude_unset=True)
        built = DeltaMessage(**fields)
        assert built == d and built.model_fields_set == d.model_fields_set
        assert [tc.model_fields_set for tc in built.tool_calls] == [tc.model_fields_set for tc in d.tool_calls]
        assert built.model_dump_json(exclude_unset=True) == d.model_dump_json(exclude_unset=True)


def _stock_wrong(family: str, out: list[int], step: int = 1) -> tuple[Chat, Split]:
    fam = FAMILIES[family]
    want = oracle(fam, out)
    assert_channels(chat(fam, out, step=step), want)
    return chat(fam, out, step=step, plugin=False, names=fam.stock), want


def test_stock_wrong_qwen3_close_think_spelled_in_pieces() -> None:
    tok = tokenizer("qwen3")
    base = answer(FAMILIES["qwen3"])
    at = base.index(enc(tok, "</think>")[0])
    stock, want = _stock_wrong("qwen3", base[:at] + enc(tok, "</") + enc(tok, "think>") + base[at + 1 :])
    assert stock.joined("reasoning") != want.reasoning


def test_stock_wrong_deepseek_r1_open_think_in_a_multi_token_step() -> None:
    stock, want = _stock_wrong("deepseek_r1", answer(FAMILIES["deepseek_r1"]), step=3)
    assert stock.joined("reasoning") == "<think>" + want.reasoning


def test_stock_wrong_llama3_python_tag_after_text() -> None:
    stock, want = _stock_wrong("llama3", answer(FAMILIES["llama3"]))
    assert want.calls and not stock.calls()


# --- how the names reach vLLM -----------------------------------------------------------


def test_detok_names_compose_detoks_parser_and_others_stay_vllms() -> None:
    chat_registry.register_chat_parsers()
    try:
        tok = tokenizer("qwen3")
        ours = ParserManager.get_parser(tool_parser_name="detok_qwen3", reasoning_parser_name="detok_qwen3",
                                        enable_auto_tools=True, tokenizer=tok)
        assert ours is not None and issubclass(ours, vllm_chat.DetokChatParser)
        assert ours.reasoning_parser_cls is not None and ours.tool_parser_cls is vllm_chat.DetokToolParser
        stock = ParserManager.get_parser(tool_parser_name="hermes", reasoning_parser_name="qwen3",
                                         enable_auto_tools=True, tokenizer=tok)
        assert stock is not None and not issubclass(stock, vllm_chat.DetokChatParser)
        with pytest.raises(TypeError, match="pairs only"):
            ParserManager.get_parser(tool_parser_name="hermes", reasoning_parser_name="detok_qwen3",
                                     enable_auto_tools=True, tokenizer=tok)
    finally:
        chat_registry.unregister_chat_parsers()


def test_every_stock_wrong_case_has_its_test() -> None:
    names = {n for n in globals() if n.startswith("test_stock_wrong_")}
    assert {f"test_stock_wrong_{case}" for case in STOCK_WRONG if case != "stop_inside_reasoning"} == names


def test_an_unknown_id_counts_towards_min_tokens_as_in_the_serving_stream() -> None:
    """An id past the vocabulary (a padded vocabulary can sample one) renders as "" and is
    counted: with the reasoning tags live, a stop that completes after min_tokens ids,
    unknown ones included, ends the stream, as it does in the plain serving stream."""
    from detok_plugin import ServingStream, TagSet
    from detok_plugin import TaggedServingStream as ReasoningAwareStream

    tok = tokenizer("qwen3")
    text = enc(tok, "xy STOP more")
    complete = next(k for k in range(1, len(text) + 1) if "STOP" in tok.decode(text[:k]))
    unknown = len(tok) + 5
    ids = [unknown, unknown, *text]
    options = dict(stop=["STOP"], eos_token_ids=(), min_tokens=complete + 1, on_unknown_id=lambda exc: None)
    plain = ServingStream.from_tokenizer(tok, **options)
    tagged = ReasoningAwareStream.from_tokenizer(tok, tags=TagSet.preset("qwen3"), **options)
    for stream in (plain, tagged):
        got = "".join(stream.push_text(i) for i in ids if not stream.finished)
        assert (got, stream.finish_reason, stream.stop_reason) == ("xy ", "stop", "STOP")
        assert stream.token_ids == ids[: 2 + complete]


@pytest.mark.parametrize("step", STEPS)
def test_the_generation_config_stop_token_is_not_body_text(step: int) -> None:
    """vLLM also stops at the model's generation-config EOS ids (Llama 3's ``<|eom_id|>``
    after a call), which the request does not list; the id ends the output ids, and with
    special tokens kept its text ends the body: the call is still a call (the body was
    malformed before, and went out as content)."""
    fam = FAMILIES["llama3"]
    tok = tokenizer(fam.tokenizer)
    eom = tok.convert_tokens_to_ids("<|eom_id|>")
    out = enc(tok, "<|python_tag|>" + fam.body("get_weather", ARGS)) + [eom]
    seen = chat(fam, out, step=step, finish=FinishReason.STOP, skip_special_tokens=False)
    assert seen.calls() == [("get_weather", ARGS)] and seen.joined("content") == ""
