"""vLLM's chat layer with Mistral's v11+ tool calls and Magistral's reasoning:
``detok_mistral`` and ``detok_magistral`` (``integrations/vllm/chat.py``), replayed as
``tests/integrations/vllm/test_vllm_chat.py`` replays the others: real token ids through vLLM 0.33's real
``OutputProcessor``, ``ParserManager``, ``ChatCompletionRequest`` and ``ChatStreamProcessor``.

From tokenizer v11 on (Mistral Small 3.1/3.2, Devstral, Magistral, Ministral) a call is
``[TOOL_CALLS]NAME[ARGS]{json}``, one ``[TOOL_CALLS]`` per call; Magistral (v13) reasons
between ``[THINK]`` and ``[/THINK]``. All four are special tokens of those tokenizers.

Tokenizers. No PyPI package ships a Magistral or Devstral tokenizer, so the cases run on
the real Mistral v1 SentencePiece tokenizer (tests/support/tokenizer_zoo.py ``mistral_v1``, from
mistral-common's data) in two forms: a copy with ``[TOOL_CALLS]``, ``[ARGS]``, ``[THINK]``
and ``[/THINK]`` added as special tokens (``add_special_tokens({"additional_special_tokens":
...})``), which is how a Hugging Face tokenizer of these models carries them (each one id,
dropped by ``skip_special_tokens``), and the plain tokenizer, where each tag is text spelled
over several pieces. The body and every other text are the v1 vocabulary's own ids: the tag
and body parsing are checked on real ids, the families' own vocabularies (Tekken) are not.

The oracle: the tokenizer's own decode of the ids (special tokens kept), split at the tags
by string operations; the calls are parsed from the body by ``str.partition`` and ``json``.
vLLM's own ``mistral`` parser runs on the same replies where it can (it needs
``[TOOL_CALLS]`` in the vocabulary: the special-token copy).

Magistral's reasoning tags by tokenizer (the end of the module) run on tokenizer_zoo's Tekken
builds: v11 (Magistral Small 2506, ``<think>`` as text) and v13 (``[THINK]`` a control token).
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import pytest

pytest.importorskip("vllm.parser.abstract_parser", reason="vLLM 0.32+ is not installed")

import tokenizer_zoo  # noqa: E402
from detok_plugin.integrations import vllm as shim  # noqa: E402
from detok_plugin.integrations.vllm import chat_registry  # noqa: E402
from test_vllm_chat import Chat, Family, _replay, byte_ids  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.tokenizers.hf import get_cached_tokenizer  # noqa: E402

from detok_plugin import DetokenizerState, parse_tool_body  # noqa: E402

SPECIALS = ["[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]"]
PROMPT = "[INST] hi [/INST]"
ARGS: dict[str, Any] = {"city": "東京", "days": 3, "note": 'a "quoted" }] brace x'}
TWO = [("get_weather", ARGS), ("lookup", {"q": "x\ny", "n": [1, {"a": None}]})]
MAGISTRAL = ("detok_magistral", "detok_magistral")
MISTRAL = (None, "detok_mistral")
STOCK = {MAGISTRAL: ("mistral", "mistral"), MISTRAL: (None, "mistral")}
STEPS = [pytest.param(1, id="1-per-step"), pytest.param(3, id="3-per-step")]
#: Only ``_replay``'s signature reads it; the tokenizer and names are passed on their own.
_FAMILY = Family("mistral_v1", MISTRAL, None, PROMPT, None, ("[TOOL_CALLS]", ""))


@functools.cache
def tokenizer(kind: str) -> Any:
    """``special``: a copy of the v1 tokenizer with the four tags as special tokens (the
    cached one is left alone); ``plain``: the v1 tokenizer, the tags text."""
    tok = copy.deepcopy(tokenizer_zoo.load("mistral_v1"))
    if kind == "special":
        tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    return get_cached_tokenizer(tok)


def enc(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def reply(
    tok: Any,
    calls: list[tuple[str, dict[str, Any]]] | None = TWO,
    *,
    thought: str | None = "Let me think: 東京 weather 🫨?",
    said: str = "Sure, checking.\n",
) -> list[int]:
    """``[THINK]thought[/THINK]said`` then ``[TOOL_CALLS]NAME[ARGS]{json}`` per call: the
    reasoning tags, the reasoning and the answer encoded each on its own, each call as one
    text (so no dummy-prefix space comes before the name); a tag is one id or several pieces."""
    ids: list[int] = []
    if thought is not None:
        ids += enc(tok, "[THINK]") + enc(tok, thought) + enc(tok, "[/THINK]")
    ids += enc(tok, said)
    for name, args in calls or ():
        ids += enc(tok, f"[TOOL_CALLS]{name}[ARGS]{json.dumps(args, ensure_ascii=False)}")
    return ids


def decode(tok: Any, out: list[int]) -> str:
    """The reply's text as the tokenizer decodes it after the prompt, special tokens kept."""
    prompt = enc(tok, PROMPT)
    return tok.decode(prompt + out, skip_special_tokens=False)[len(tok.decode(prompt, skip_special_tokens=False)) :]


def edges(text: str) -> str:
    """A reasoning or content segment as the chat layer sends it: the whitespace at its edges
    is markup (``detok_plugin._edges``; the v1 vocabulary's dummy prefix puts a space first)."""
    return text.strip()


def split(tok: Any, out: list[int], *, think: bool) -> tuple[str, str, list[tuple[str, Any]]]:
    """(reasoning, content, calls) from the decode, by string operations, at their ``edges``."""
    rest, reasoning = decode(tok, out), ""
    if think and "[THINK]" in rest:
        before, _, after = rest.partition("[THINK]")
        reasoning, _, after = after.partition("[/THINK]")
        rest = before + after
    content, _, body = rest.partition("[TOOL_CALLS]")
    calls = []
    for segment in body.split("[TOOL_CALLS]") if body else ():
        name, _, args = segment.partition("[ARGS]")
        calls.append((name.strip(), json.loads(args)))
    return edges(reasoning), edges(content), calls


def chat(kind: str, names: tuple[str | None, str], out: list[int], **kw: Any) -> Chat:
    """Replay ``out`` through OutputProcessor and the chat layer on ``tokenizer(kind)``."""
    return chat_on(tokenizer(kind), names, out, **kw)


def chat_on(
    tok: Any, names: tuple[str | None, str], out: list[int], *, step: int = 1, plugin: bool = True,
    stop: list[str] | None = None, tools: bool = True, **fields: Any,
) -> Chat:
    """Replay ``out`` through OutputProcessor and the chat layer (``test_vllm_chat._replay``)."""
    shim.unregister()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DETOK_PLUGIN", "1" if plugin else "0")
        shim.register()
        chat_registry.register_chat_parsers()
        try:
            return _replay(_FAMILY, tok, out, step, stop, names, tools, PROMPT, fields)
        finally:
            shim.unregister()


def streamed_args(deltas: list[Any]) -> list[str]:
    return [tc.function.arguments for d in deltas if d for tc in d.tool_calls if tc.function and tc.function.arguments]


SETUPS = {
    "magistral-special": ("special", MAGISTRAL, True),
    "mistral-special": ("special", MISTRAL, False),
    "mistral-plain": ("plain", MISTRAL, False),
}


# --- detok's parsers against the decode --------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_channels_join_to_the_split_decode(setup: str, step: int) -> None:
    """Reasoning, content and two calls in a row; the tags one id each, or text pieces."""
    kind, names, think = SETUPS[setup]
    tok = tokenizer(kind)
    out = reply(tok, thought="Let me think: 東京 weather 🫨?" if think else None)
    if kind == "plain":
        assert len(enc(tok, "[TOOL_CALLS]")) > 1 and len(enc(tok, "[ARGS]")) > 1
    else:
        assert len(enc(tok, "[TOOL_CALLS]")) == 1 and len(enc(tok, "[THINK]")) == 1
    reasoning, content, calls = split(tok, out, think=think)
    assert calls == TWO and (reasoning or not think)
    seen = chat(kind, names, out, step=step)
    assert seen.joined("reasoning") == reasoning
    assert seen.joined("content").strip() == content.strip()
    assert seen.calls() == TWO
    ids = [tc.id for d in seen.deltas if d for tc in d.tool_calls if tc.id]
    assert len(ids) == len(set(ids)) == 2
    assert all(len(i) == 9 and i.isalnum() for i in ids)  # Mistral's ids, as vLLM's parser makes them


def test_magistral_tags_as_text_in_the_core() -> None:
    """The plain tokenizer spells ``[THINK]`` over several pieces, which vLLM's reasoning
    parser cannot take (it needs single tokens): the core's stream with the ``magistral``
    preset splits the same ids by text."""
    tok = tokenizer("plain")
    out = reply(tok)
    reasoning, content, calls = split(tok, out, think=True)
    state = DetokenizerState.from_tokenizer(tok, prompt_ids=enc(tok, PROMPT), tags="magistral", eos_token_ids=())
    deltas = [state.push(i) for i in out] + [state.finish()]
    assert edges("".join(d.reasoning for d in deltas)) == reasoning
    assert "".join(d.text for d in deltas).strip() == content.strip()
    done = [c for d in deltas for c in d.tool_calls if c.complete]
    assert [(c.name, json.loads(c.arguments or "")) for c in done] == calls == TWO


@pytest.mark.parametrize("kind", ["special", "plain"])
def test_arguments_stream_before_the_reply_ends(kind: str) -> None:
    """With the request's opt-in (``detok_stream_arguments``), each call's name goes out at
    its ``[ARGS]``, its arguments as they form: the first call's value arrives in many
    deltas before the second call begins."""
    tok = tokenizer(kind)
    long_city = "東京都 " * 12
    out = reply(tok, [("get_weather", {**ARGS, "city": long_city}), ("lookup", {"q": "x"})], thought=None)
    seen = chat(kind, MISTRAL, out, vllm_xargs={"detok_stream_arguments": True})
    second = len(out) - len(enc(tok, '[TOOL_CALLS]lookup[ARGS]{"q": "x"}'))
    before = streamed_args(seen.deltas[:second])
    assert len([x for x in before if "京" in x]) > 5
    assert json.loads("".join(before)) == {**ARGS, "city": long_city}
    assert seen.calls() == [("get_weather", {**ARGS, "city": long_city}), ("lookup", {"q": "x"})]


@pytest.mark.parametrize("stream_arguments", [False, True], ids=["whole", "opt-in"])
@pytest.mark.parametrize("kind", ["special", "plain"])
@pytest.mark.parametrize("bad", ['{"city": }', '{"city": "x"} Done.', ""], ids=["bad-json", "text-after", "no-name"])
def test_a_malformed_body_is_reported_as_content(kind: str, bad: str, stream_arguments: bool) -> None:
    """The raw text, tags included, is content. By default nothing of the call went out
    (a call is sent once finished); with the opt-in, what streamed before stays sent."""
    tok = tokenizer(kind)
    head = enc(tok, "Ok.") + enc(tok, "[TOOL_CALLS]")
    out = head + enc(tok, f"get_weather[ARGS]{bad}" if bad else "[ARGS]{}")
    seen = chat(kind, MISTRAL, out, vllm_xargs={"detok_stream_arguments": stream_arguments})
    assert seen.joined("content") == edges(decode(tok, out))
    sent = "".join(streamed_args(seen.deltas))
    if bad and stream_arguments:  # the name and a prefix of the arguments went out before the end showed the fault
        assert sent and bad.startswith(sent)
    else:
        assert not [tc for d in seen.deltas if d for tc in d.tool_calls]


@pytest.mark.parametrize("step", STEPS)
def test_a_stop_inside_think_does_not_end_the_reply_53066(step: int) -> None:
    """vllm-project/vllm#53066: a stop string only in the reasoning is text there."""
    tok = tokenizer("special")
    out = reply(tok, thought="Think. STOP is just a word here.")
    reasoning, content, _calls = split(tok, out, think=True)
    seen = chat("special", MAGISTRAL, out, step=step, stop=["STOP"])
    assert "STOP" in reasoning and seen.joined("reasoning") == reasoning
    assert seen.joined("content").strip() == content.strip() and seen.calls() == TWO
    assert seen.finish_reason != "stop"


def test_a_stop_inside_the_arguments_is_part_of_the_call() -> None:
    tok = tokenizer("special")
    out = reply(tok)
    seen = chat("special", MAGISTRAL, out, stop=["quoted"])
    assert seen.calls() == TWO and seen.finish_reason != "stop"
    assert seen.detok_text == decode(tok, out)  # tools live: special tokens kept, as vLLM's parser asks


def test_requests_with_tools_keep_special_tokens_as_vllms_parser_sets_them() -> None:
    """vLLM's ``mistral`` parser (its parser engine) sets ``skip_special_tokens=False`` on
    every request, so ``[TOOL_CALLS]`` and ``[ARGS]`` reach it as text, and drops every other
    special token from the text itself. detok's keeps special tokens on requests with tools
    (the body keeps its markers); without tools it leaves the flag, and the tags are found by
    id, which gives what vLLM's engine gives (other special tokens dropped)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager

    chat_registry.register_chat_parsers()
    tok = tokenizer("special")
    for names, kept_without_tools in ((MAGISTRAL, False), (STOCK[MAGISTRAL], True)):
        cls = ParserManager.get_parser(tool_parser_name=names[1], reasoning_parser_name=names[0],
                                       enable_auto_tools=True, tokenizer=tok)
        assert cls is not None
        for tools, kept in ((_tools(), True), (None, kept_without_tools)):
            request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)
            skip = cls(tok, request.tools).adjust_request(request).skip_special_tokens
            assert (skip is False) is kept, names  # None (the default) skips them


def _tools() -> list[dict[str, Any]]:
    from test_vllm_chat import TOOLS

    return TOOLS


def test_without_tools_the_tags_are_recognised_by_id() -> None:
    """A request without tools keeps ``skip_special_tokens=True``: ``[THINK]`` and
    ``[/THINK]`` have no text, and the stream switches on their ids."""
    tok = tokenizer("special")
    out = reply(tok, None)
    reasoning, content, _ = split(tok, out, think=True)
    seen = chat("special", MAGISTRAL, out, tools=False)
    assert seen.joined("reasoning") == reasoning and seen.joined("content") == content


def test_the_core_reads_both_layouts_and_the_ids_without_text() -> None:
    """``parse_tool_body(..., "mistral")``: the JSON list before v11, ``NAME[ARGS]{...}``
    from v11 on, and (``skip_special_tokens`` dropped ``[ARGS]`` and the later
    ``[TOOL_CALLS]``) ``NAME{...}NAME{...}``."""
    assert parse_tool_body('[{"name": "a", "arguments": {"x": 1}}]', "mistral") == [("a", '{"x": 1}')]
    v11 = 'a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS] {"y": [2]}'
    assert parse_tool_body(v11, "mistral") == [("a", '{"x": 1}'), ("b", '{"y": [2]}')]
    assert parse_tool_body('a{"x": 1}b{}', "mistral") == [("a", '{"x": 1}'), ("b", "{}")]
    assert parse_tool_body("a[ARGS][TOOL_CALLS]b[ARGS]", "mistral") == [("a", "{}"), ("b", "{}")]
    tok = tokenizer("special")
    out = reply(tok, thought=None)
    state = DetokenizerState.from_tokenizer(tok, tags="mistral", skip_special_tokens=True, eos_token_ids=())
    deltas = [state.push(out)] + [state.finish()]
    done = [c for d in deltas for c in d.tool_calls if c.complete]
    assert [(c.name, json.loads(c.arguments or "")) for c in done] == TWO


# --- vLLM's own ``mistral`` parser on the same replies ---------------------------------------


def _case(name: str) -> tuple[tuple[str | None, str], list[int]]:
    """A reply by case name, on the special-token tokenizer (vLLM's parser needs
    ``[TOOL_CALLS]`` in the vocabulary)."""
    tok = tokenizer("special")
    # Encoded apart from [TOOL_CALLS]: the v1 vocabulary's dummy prefix puts a space before the name.
    body = enc(tok, "get_weather") + enc(tok, "[ARGS]") + enc(tok, json.dumps(ARGS, ensure_ascii=False))
    t_calls = enc(tok, "[TOOL_CALLS]")
    cases: dict[str, Any] = {
        "magistral_reply": lambda: (MAGISTRAL, reply(tok)),
        "magistral_one_call": lambda: (MAGISTRAL, reply(tok, TWO[:1])),
        "magistral_no_call": lambda: (MAGISTRAL, reply(tok, None)),
        "magistral_no_think": lambda: (MAGISTRAL, reply(tok, thought=None)),
        "magistral_long_string_value": lambda: (MAGISTRAL, reply(tok, [("get_weather", {**ARGS, "city": "東京都 " * 12})])),
        "mistral_reply": lambda: (MISTRAL, reply(tok, thought=None)),
        "mistral_call_only": lambda: (MISTRAL, reply(tok, thought=None, said="")),
        "mistral_body_one_byte_per_token": lambda: (
            MISTRAL, enc(tok, "Ok.") + t_calls + byte_ids(tok, "get_weather") + enc(tok, "[ARGS]")
            + byte_ids(tok, json.dumps(ARGS, ensure_ascii=False)),
        ),
        "mistral_name_then_brace": lambda: (MISTRAL, enc(tok, "Ok.") + enc(tok, '[TOOL_CALLS]get_weather{"city": "x"}')),
        "mistral_empty_arguments": lambda: (MISTRAL, enc(tok, "Ok.") + enc(tok, "[TOOL_CALLS]get_weather[ARGS]")),
        "mistral_space_before_the_name": lambda: (MISTRAL, enc(tok, "Ok.") + t_calls + body),
        "mistral_text_after_the_call": lambda: (MISTRAL, reply(tok, TWO[:1], thought=None) + enc(tok, " Done.")),
        "magistral_stop_inside_think": lambda: (MAGISTRAL, reply(tok, thought="Think. STOP is just a word here.")),
        "magistral_call_inside_unclosed_think": lambda: (
            MAGISTRAL, enc(tok, "[THINK]") + enc(tok, "Let me call it.") + reply(tok, TWO[:1], thought=None, said=""),
        ),
        "mistral_other_special_token_in_content": lambda: (
            MISTRAL, enc(tok, "Ok.") + [tok.bos_token_id] + enc(tok, " Checking.") + reply(tok, TWO[:1], thought=None, said=""),
        ),
    }
    names, out = cases[name]()
    return names, out


def _both(case: str, step: int = 1, **fields: Any) -> tuple[Chat, Chat, list[int]]:
    names, out = _case(case)
    return (
        chat("special", names, out, step=step, **fields),
        chat("special", STOCK[names], out, step=step, plugin=False, **fields),
        out,
    )


#: Where vLLM's ``mistral`` parser (with a Hugging Face tokenizer whose vocabulary has
#: ``[ARGS]``: its v11+ path) and detok's give the same reasoning, content and calls.
AGREE = [
    *(pytest.param(c, s, id=f"{c}-{s}-per-step") for c in ("magistral_reply", "mistral_reply") for s in (1, 3)),
    *(
        pytest.param(c, 1, id=c)
        for c in (
            "magistral_one_call", "magistral_no_call", "magistral_no_think", "magistral_long_string_value",
            "mistral_call_only", "mistral_body_one_byte_per_token", "mistral_name_then_brace",
        )
    ),
]


@pytest.mark.parametrize(("case", "step"), AGREE)
def test_agrees_with_vllms_own_parser(case: str, step: int) -> None:
    ours, stock, _out = _both(case, step)
    assert ours.joined("reasoning") == edges(stock.joined("reasoning"))
    assert ours.joined("content").strip() == stock.joined("content").strip()
    assert ours.calls() == stock.calls()


#: Where they differ, by name; each is asserted below (a changed vLLM shows as a failure).
STOCK_DIFFERS = {
    "magistral_stop_inside_think": "vllm#53066: a stop string in the reasoning ends the reply there, "
    "with no content and no call (stock's detokenizer cuts anywhere)",
    "mistral_space_before_the_name": "a space between [TOOL_CALLS] and the name stays in vLLM's name "
    "(' get_weather'); detok's name is the word",
    "mistral_text_after_the_call": "text after the last call's JSON: vLLM streams it into the "
    "arguments ('...} Done.', not JSON; its non-streaming parse drops it, gh#48975); detok's "
    "arguments stop at the brace, and the body, which is not a v11 call list, follows as content",
    "mistral_empty_arguments": "nothing after [ARGS]: vLLM streams the call with arguments '' (not "
    "JSON); detok sends '{}', as vLLM's non-streaming parse gives",
    "magistral_call_inside_unclosed_think": "[TOOL_CALLS] inside a [THINK] never closed: detok keeps "
    "it in the reasoning, as text (a tag opens only in content); vLLM ends the reasoning there and "
    "makes the call",
    "mistral_other_special_token_in_content": "a special token that is no tag (<s>) in a reply with "
    "tools: detok's content shows its text, as the decode with special tokens kept does; vLLM's "
    "parser drops it",
}


@pytest.mark.parametrize("case", sorted(STOCK_DIFFERS))
def test_stock_differs(case: str) -> None:
    stop = ["STOP"] if case == "magistral_stop_inside_think" else None
    ours, stock, out = _both(case, stop=stop)
    tok = tokenizer("special")
    if case == "magistral_stop_inside_think":
        reasoning, content, calls = split(tok, out, think=True)
        assert ours.joined("reasoning") == reasoning and ours.joined("content").strip() == content.strip()
        assert ours.calls() == calls == TWO
        assert not stock.calls() and stock.joined("content") == "" and stock.finish_reason == "stop"
    elif case == "mistral_space_before_the_name":
        assert ours.calls() == [("get_weather", ARGS)] and stock.calls() == [(" get_weather", ARGS)]
    elif case == "magistral_call_inside_unclosed_think":
        assert ours.joined("reasoning") == edges(decode(tok, out).removeprefix("[THINK]"))
        assert not ours.calls() and ours.joined("content") == ""
        assert stock.joined("reasoning").strip() == "Let me call it." and stock.calls() == [("get_weather", ARGS)]
    elif case == "mistral_other_special_token_in_content":
        content = decode(tok, out).partition("[TOOL_CALLS]")[0]
        assert "<s>" in content and ours.joined("content") == edges(content)
        assert ours.calls() == stock.calls() == [("get_weather", ARGS)]
        assert stock.joined("content") == content.replace("<s>", "")
    elif case == "mistral_empty_arguments":
        assert ours.calls() == [("get_weather", {})]
        assert "".join(streamed_args(stock.deltas)) == ""
    else:  # the body does not parse: content only, no call (stock streamed one)
        assert ours.joined("content") == edges(decode(tok, out)) and ours.calls() == []
        assert "".join(streamed_args(stock.deltas)).endswith("} Done.")
        with pytest.raises(ValueError):
            stock.calls()


def test_every_differing_case_has_a_name() -> None:
    assert set(STOCK_DIFFERS).isdisjoint(p.values[0] for p in AGREE)


# --- Magistral's reasoning tags, as its tokenizer says ------------------------------------------

#: Tekken v11 (Magistral Small 2506: no ``[THINK]`` token, reasoning as ``<think>`` text) and
#: v13 (Magistral Small 2509: ``[THINK]`` a control token), both tokenizer_zoo builds.
TEKKEN = {"v11": "tekken_v11", "v13": "tekken"}


@functools.cache
def tekken(version: str) -> Any:
    return get_cached_tokenizer(tokenizer_zoo.load(TEKKEN[version]))


def _think_text_reply(tok: Any) -> list[int]:
    """``<think>thought</think>said`` then a call, written as Magistral Small 2506 writes it:
    the think tags as text (several ordinary tokens), ``[TOOL_CALLS]`` and ``[ARGS]`` control
    tokens."""
    text = '<think>Weather in 東京 🫨? Call it.</think>Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "東京", "days": 3}'
    ids = enc(tok, text)
    assert len(enc(tok, "<think>")) > 1 and enc(tok, "[TOOL_CALLS]")[0] in ids
    return ids


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("version", sorted(TEKKEN))
def test_magistral_reads_the_reasoning_tags_its_tokenizer_has(version: str, step: int) -> None:
    """``detok_magistral`` reasons between ``<think>`` and ``</think>`` as text on a tokenizer
    without a ``[THINK]`` token (Tekken v11), and between ``[THINK]`` and ``[/THINK]`` where it
    is one (v13), where the ``<think>`` text is content: vLLM 0.33's ``mistral`` parser picks
    the same way (``vllm/parser/mistral.py``). The oracle: the tokenizer's decode, split at the
    tags by string operations."""
    tok = tekken(version)
    out = _think_text_reply(tok)
    text = decode(tok, out)
    content, _, body = text.partition("[TOOL_CALLS]")
    name, _, args = body.partition("[ARGS]")
    reasoning = ""
    if version == "v11":
        before, _, rest = content.partition("<think>")
        reasoning, _, after = rest.partition("</think>")
        content = before + after
    seen = chat_on(tok, MAGISTRAL, out, step=step)
    assert (seen.joined("reasoning"), seen.joined("content"), seen.calls()) == (reasoning, content, [(name, json.loads(args))])
    ids = enc(tok, "[THINK]thinks[/THINK]said")  # control tokens on v13, text on v11
    seen = chat_on(tok, MAGISTRAL, ids, step=step, tools=False)
    want = ("thinks", "said") if version == "v13" else ("", decode(tok, ids))
    assert (seen.joined("reasoning"), seen.joined("content")) == want


def test_v11_reasoning_is_vllms_own_text_mode_split() -> None:
    """On the same Tekken v11 read as vLLM's ``tokenizer_mode="mistral"`` reads it (the
    tekken.json beside the build), vLLM's own ``MistralParser`` picks its plain-text reasoning
    mode and splits the reply's text where ``detok_magistral`` does."""
    from vllm.parser.mistral import MistralParser
    from vllm.tokenizers.mistral import MistralTokenizer

    mistral_tok = MistralTokenizer.from_pretrained(str(tokenizer_zoo.directory(TEKKEN["v11"])))
    tok = tekken("v11")
    out = _think_text_reply(tok)
    content = decode(tok, out).partition("[TOOL_CALLS]")[0]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    stock_reasoning, stock_content = MistralParser(mistral_tok).extract_reasoning(content, request)
    seen = chat_on(tok, MAGISTRAL, out)
    assert (seen.joined("reasoning"), seen.joined("content")) == (stock_reasoning, stock_content)
    assert seen.joined("reasoning") and "<think>" not in seen.joined("content")


@pytest.mark.parametrize("version", sorted(TEKKEN))
def test_magistrals_reasoning_half_names_the_tags_its_tokenizer_has(version: str) -> None:
    """The reasoning half of ``detok_magistral`` (what vLLM's structured-output gate asks)
    names the tags the chat parser reads: ``<think>``/``</think>`` on Tekken v11, where
    ``[THINK]`` is no token, and ``[THINK]``/``[/THINK]`` with their ids on v13."""
    from detok_plugin import TagSet
    from detok_plugin.families import mistral

    tok = tekken(version)
    half = chat_registry.parser_class(TagSet.preset("magistral"), True, True).reasoning_parser_cls(tok)
    assert (half.start_token, half.end_token) == mistral.reasoning_tags(tok.get_vocab())
    assert (half.start_token == "[THINK]") == (version == "v13")
    assert (half.end_token_id is not None) == (version == "v13")
