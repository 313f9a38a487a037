"""The chat layer's rules for tool-call bodies, through ``ChatStream`` on real tokenizers
(Qwen3, DeepSeek V3, Llama 3 from tests/support/tokenizer_zoo.py), streamed one id per
step, three per step and all in one, and whole (``streaming=False``):

* a marker written inside a value (a JSON string, a Qwen3-Coder parameter value) is text
  of the value, not a marker (``ToolFormat.marker_is_text``, asked by the core);
* a call goes out once the model has finished it, whole; a body the reply ended inside is
  dropped (neither a call nor content), the calls finished before it stay;
* a body opened without the tool tag (``Preset.bare_open``): Llama 3's JSON call at the
  reply's start, Qwen3-Coder's ``<function=``; a JSON answer is content;
* whitespace between and after calls is markup, not content; so is whitespace at the edges
  of any reasoning or content segment (``detok_plugin._edges``), and a segment's trailing
  whitespace waits for its next character (it leaves with it) or for markup or the end;
* a tool call inside reasoning that was never closed ends the reasoning where the family's
  model does (``Preset.tool_ends_reasoning``: Qwen3.5's), and stays reasoning elsewhere.

The replies are CanIToolCall 0.1.1's cases (marker-in-arguments, truncated-second-parallel-call,
l3-*, llamacpp-coder-bare-function), written out here and encoded by the real tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from detok_plugin import ChatStream, TagSet

STEPS = [pytest.param(1, id="1-per-step"), pytest.param(3, id="3-per-step"), pytest.param(0, id="one-step")]


def enc(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def streamed(tok: Any, preset: str, ids: list[int], step: int, *, prompt: str = "", **kw: Any) -> tuple[str, str, list[tuple[str, Any]]]:
    """Content, reasoning and calls as an OpenAI client joins a stream's deltas."""
    s = ChatStream(tok, TagSet.preset(preset), prompt_ids=enc(tok, prompt), new_call_id=lambda name, fmt: "call", **kw)
    content, reasoning, calls = [], [], {}  # type: list[str], list[str], dict[int, list[str]]
    n = step or len(ids)
    for i in range(0, len(ids), n):
        fields = s.message(ids[i : i + n], i + n >= len(ids)) or {}
        content.append(fields.get("content") or "")
        reasoning.append(fields.get("reasoning") or "")
        for tc in fields.get("tool_calls", ()):
            slot = calls.setdefault(tc["index"], ["", ""])
            slot[0] += tc["function"].get("name") or ""
            slot[1] += tc["function"].get("arguments") or ""
    return "".join(content), "".join(reasoning), [(n_, json.loads(a)) for n_, a in (calls[k] for k in sorted(calls))]


def whole(tok: Any, preset: str, ids: list[int], *, prompt: str = "", **kw: Any) -> tuple[str, str, list[tuple[str, Any]]]:
    s = ChatStream(tok, TagSet.preset(preset), prompt_ids=enc(tok, prompt), new_call_id=lambda name, fmt: "call", streaming=False, **kw)
    parts = s.step(ids, True)
    return "".join(parts.content), "".join(parts.reasoning), [(n, json.loads(a)) for n, a in s.complete]


def both(tok: Any, preset: str, ids: list[int], step: int, **kw: Any) -> tuple[str, str, list[tuple[str, Any]]]:
    """The stream's result, checked equal to the whole reply's."""
    got = streamed(tok, preset, ids, step, **kw)
    assert got == whole(tok, preset, ids, **kw)
    return got


@pytest.fixture(scope="module")
def qwen3(load_tokenizer: Any) -> Any:
    return load_tokenizer("qwen3")


# --- a marker inside a value is text -----------------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
def test_hermes_close_tag_inside_a_json_string_is_text(qwen3: Any, step: int) -> None:
    args = {"text": 'Use <tool_call> ... </tool_call> tags, or "<think>" blocks.'}
    body = json.dumps({"name": "echo", "arguments": args})
    ids = enc(qwen3, f"<tool_call>\n{body}\n</tool_call>")
    assert enc(qwen3, "</tool_call>")[0] in ids[1:-1]  # the inner close tag is its marker token
    assert both(qwen3, "qwen3", ids, step) == ("", "", [("echo", args)])


@pytest.mark.parametrize("step", STEPS)
def test_deepseek_v31_call_marker_inside_a_json_string_is_text(load_tokenizer: Any, step: int) -> None:
    tok = load_tokenizer("deepseek_v3")
    args = {"text": "Tokens like <｜tool▁call▁begin｜>f<｜tool▁sep｜>{} are markup."}
    raw = f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>echo<｜tool▁sep｜>{json.dumps(args, ensure_ascii=False)}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    assert both(tok, "deepseek_v31", enc(tok, raw), step) == ("", "", [("echo", args)])


@pytest.mark.parametrize("step", STEPS)
def test_qwen3_coder_markup_inside_a_value_is_text(qwen3: Any, step: int) -> None:
    text = "Close with </function> then </tool_call>; open with <function=x>."
    raw = f"<tool_call>\n<function=write_file>\n<parameter=path>\nx.md\n</parameter>\n<parameter=content>\n{text}\n</parameter>\n</function>\n</tool_call>"
    assert both(qwen3, "qwen3_coder", enc(qwen3, raw), step) == ("", "", [("write_file", {"path": "x.md", "content": text})])


def test_qwen3_coder_value_grammar() -> None:
    """Inside a value only ``</parameter>`` ends it, or another tag at a line start where the
    model left that out; a compact body (no newlines) closes each value with its tag."""
    from detok_plugin import parse_tool_body

    inline = "Close tags inline: </function> and <parameter=path> and <function=x> are text here."
    body = f"<function=w>\n<parameter=content>\n{inline}\n</parameter>\n</function>"
    assert parse_tool_body(body, "qwen3_xml") == [("w", json.dumps({"content": inline}))]
    missing = "<function=g>\n<parameter=city>\nDallas\n<parameter=state>\nTX\n</parameter>\n</function>"
    assert parse_tool_body(missing, "qwen3_xml") == [("g", '{"city": "Dallas", "state": "TX"}')]
    compact = "<function=f><parameter=a>1</parameter><parameter=b>x</parameter></function>"
    assert parse_tool_body(compact, "qwen3_xml") == [("f", '{"a": "1", "b": "x"}')]


def test_a_close_tag_inside_a_string_does_not_end_the_body_for_stops(qwen3: Any) -> None:
    """``tools="inline"`` (the detokenizer's stream under vLLM's chat layer): a stop string
    inside the arguments, after an inner ``</tool_call>``, is still inside the body."""
    from detok_plugin import TaggedServingStream

    body = json.dumps({"name": "echo", "arguments": {"text": "a </tool_call> then STOP here"}})
    raw = f"Ok.<tool_call>\n{body}\n</tool_call>after STOP tail"
    s = TaggedServingStream.from_tokenizer(qwen3, tags=TagSet.preset("qwen3"), stop=("STOP",))
    out = "".join(s.push_text(i) for i in enc(qwen3, raw) if not s.finished)
    assert out == raw[: raw.index("after STOP") + len("after ")] and s.finish_reason == "stop"


# --- a call goes out once finished --------------------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
def test_a_reply_cut_in_its_second_call_keeps_the_first(qwen3: Any, step: int) -> None:
    first = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}}\n</tool_call>'
    raw = first + '\n<tool_call>\n{"name": "search", "arguments": {"query": "café'
    assert both(qwen3, "qwen3", enc(qwen3, raw), step) == ("", "", [("get_weather", {"city": "Zürich", "unit": "c"})])


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("preset", ["deepseek_r1", "deepseek_v31"])
def test_a_deepseek_section_cut_in_its_second_call_keeps_the_first(load_tokenizer: Any, preset: str, step: int) -> None:
    """One calls section holds both calls: the first ended at its ``<｜tool▁call▁end｜>``
    (``ToolFormat.call_close``), so it stays when the reply is cut in the second."""
    tok = load_tokenizer("deepseek_v3")

    def call(name: str, args: str) -> str:
        if preset == "deepseek_v31":
            return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"
        return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"

    raw = "<｜tool▁calls▁begin｜>" + call("get_weather", '{"city": "Zürich"}') + call("search", '{"query": "caf')[:-30]
    assert both(tok, preset, enc(tok, raw), step) == ("", "", [("get_weather", {"city": "Zürich"})])


@pytest.mark.parametrize("step", STEPS)
def test_nothing_of_an_unfinished_call_is_sent(qwen3: Any, step: int) -> None:
    raw = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    assert both(qwen3, "qwen3", enc(qwen3, raw), step) == ("Let me look.", "", [])


@pytest.mark.parametrize("step", STEPS)
def test_whitespace_between_and_after_calls_is_not_content(qwen3: Any, step: int) -> None:
    call = '<tool_call>\n{"name": "f", "arguments": {"n": %d}}\n</tool_call>'
    raw = "<think>\nhm\n</think>\n\n" + call % 1 + "\n" + call % 2 + "\n\n"
    content, reasoning, calls = both(qwen3, "qwen3", enc(qwen3, raw), step)
    assert content == "" and reasoning == "hm" and calls == [("f", {"n": 1}), ("f", {"n": 2})]
    content, _, _ = both(qwen3, "qwen3", enc(qwen3, call % 1 + "\nDone."), step)
    assert content == "Done."  # the whitespace after a call is the next segment's leading edge


# --- a body opened without the tool tag --------------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize(
    ("raw", "want"),
    [
        pytest.param('{"name": "get_time", "parameters": {}}', ("", [("get_time", {})]), id="parameters"),
        pytest.param(' {"name": "s", "arguments": {"q": "<|python_tag|>x"}}', ("", [("s", {"q": "<|python_tag|>x"})]), id="arguments"),
        pytest.param('{"capital": "Paris", "country": "France"}', ('{"capital": "Paris", "country": "France"}', []), id="json-answer"),
        pytest.param('{"a": 1} is a dict', ('{"a": 1} is a dict', []), id="json-then-text"),
        pytest.param('Sure: {"name": "f", "parameters": {}}', ('Sure: {"name": "f", "parameters": {}}', []), id="text-first"),
        pytest.param('{"name": "f", "parameters": {"a": [1, ', ('{"name": "f", "parameters": {"a": [1,', []), id="unfinished"),
    ],
)
def test_llama3_json_call_without_python_tag(load_tokenizer: Any, raw: str, want: tuple[str, list[Any]], step: int) -> None:
    """vLLM's ``llama3_json`` rule: a reply that is a JSON object with a name and its
    arguments (or parameters) is a call; any other JSON answer is content. An unfinished
    body is a malformed one here (the format has no closer): content, never a call."""
    tok = load_tokenizer("llama3")
    prompt = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    # Special tokens kept, so the <|python_tag|> written inside a string stays its text.
    content, _, calls = both(tok, "llama3", enc(tok, raw), step, prompt=prompt, skip_special_tokens=False)
    assert (content.strip(), calls) == want


@pytest.mark.parametrize("step", STEPS)
def test_qwen3_coder_function_without_tool_call_opener(qwen3: Any, step: int) -> None:
    prose = "I will list the Markdown files."
    call = "<function=glob>\n<parameter=pattern>\n**/*.md\n</parameter>\n</function>\n</tool_call>"
    content, _, calls = both(qwen3, "qwen3_coder", enc(qwen3, prose + "\n\n" + call), step)
    assert content.strip() == prose and calls == [("glob", {"pattern": "**/*.md"})]


@pytest.mark.parametrize("step", STEPS)
def test_an_empty_body_is_no_call_and_no_content(qwen3: Any, step: int) -> None:
    """Nothing between the tags (or a reply stopped right after the opener): no call was
    written, and the markers are not text."""
    assert both(qwen3, "qwen3", enc(qwen3, "Ok.<tool_call>\n</tool_call>"), step) == ("Ok.", "", [])
    assert both(qwen3, "qwen3", enc(qwen3, "Ok.<tool_call>"), step) == ("Ok.", "", [])


def test_mistral_call_id_between_name_and_arguments() -> None:
    """``NAME[CALL_ID]ID[ARGS]{...}`` (Mistral Small 3.2's history renders, llama.cpp's tests)."""
    from detok_plugin import parse_tool_body

    body = 'special_function[CALL_ID]123456789[ARGS]{"arg1": 1}[TOOL_CALLS]g[CALL_ID]000000001[ARGS]{}'
    assert parse_tool_body(body, "mistral") == [("special_function", '{"arg1": 1}'), ("g", "{}")]


# --- whitespace at a segment's edges ------------------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize(
    ("raw", "want"),
    [
        pytest.param("<think>\nWhy.\n</think>\n\nBecause.\n", ("Because.", "Why."), id="think-then-answer"),
        pytest.param("<think>\n\n</think>\n\n", ("", ""), id="empty-think"),
        pytest.param("  Line one.\n\n  Line two.  \n", ("Line one.\n\n  Line two.", ""), id="inside-kept"),
        pytest.param("<think>\nA\n\nB\n", ("", "A\n\nB"), id="cut-in-reasoning"),
    ],
)
def test_whitespace_at_a_segments_edges_is_markup(qwen3: Any, step: int, raw: str, want: tuple[str, str]) -> None:
    content, reasoning, calls = both(qwen3, "qwen3", enc(qwen3, raw), step)
    assert (content, reasoning, calls) == (*want, [])


@pytest.mark.parametrize("step", STEPS)
def test_whitespace_before_a_call_is_markup(qwen3: Any, step: int) -> None:
    call = '<tool_call>\n{"name": "f", "arguments": {"n": 1}}\n</tool_call>'
    for sep in (" ", "\n\n", "  \n"):
        assert both(qwen3, "qwen3", enc(qwen3, "I will check." + sep + call), step) == ("I will check.", "", [("f", {"n": 1})])


@pytest.mark.parametrize("step", STEPS)
def test_content_on_both_sides_of_a_call_is_one_segment(qwen3: Any, step: int) -> None:
    """A call goes out of band: the whitespace between text before it and text after it is
    text (CanIToolCall's ``sglang-text-around-call``, ``k2i-vllm-content-after-tool-section``)."""
    call = '<tool_call>\n{"name": "f", "arguments": {"n": 1}}\n</tool_call>'
    assert both(qwen3, "qwen3", enc(qwen3, "Before. " + call + " After.\n"), step) == ("Before.  After.", "", [("f", {"n": 1})])


def test_trailing_whitespace_waits_for_the_next_character(qwen3: Any) -> None:
    """One id per step: a newline leaves with the text after it; before markup it never leaves."""
    s = ChatStream(qwen3, TagSet.preset("qwen3"), new_call_id=lambda name, fmt: "call")
    ids = enc(qwen3, "One.\n\nTwo.\n\n<tool_call>")
    texts = [qwen3.decode([i]) for i in ids]
    assert texts == ["One", ".\n\n", "Two", ".\n\n", "<tool_call>"]  # Qwen3's pieces
    sent = [(s.message([i], False) or {}).get("content") for i in ids]
    assert sent == ["One", ".", "\n\nTwo", ".", None]  # the tag showed the last newlines were an edge


@pytest.mark.parametrize("step", STEPS)
def test_a_malformed_body_sent_as_content_keeps_the_whitespace_beside_it(qwen3: Any, step: int) -> None:
    """A body that does not parse was text: the spaces around it are inside content."""
    raw = "Look: <tool_call>\n{not json}\n</tool_call> done.\n"
    content, _, calls = both(qwen3, "qwen3", enc(qwen3, raw), step)
    assert (content, calls) == ("Look: <tool_call>\n{not json}\n</tool_call> done.", [])


@pytest.mark.parametrize("step", STEPS)
def test_the_rule_applies_where_tags_are_live_only(qwen3: Any, step: int) -> None:
    """Without live tags nothing is parsed: the content is the detokenizer's text, exact."""
    ids = enc(qwen3, "\n  Hello.\n\n")
    s = ChatStream(qwen3, None, new_call_id=lambda name, fmt: "call")
    n = step or len(ids)
    got = "".join((s.message(ids[i : i + n], i + n >= len(ids)) or {}).get("content") or "" for i in range(0, len(ids), n))
    assert got == "\n  Hello.\n\n"


@pytest.mark.parametrize("step", STEPS)
def test_mistral_space_after_inst_is_markup(mistral_v1: Any, step: int) -> None:
    """SentencePiece renders the reply's first word with its prefix space after ``[/INST]``."""
    prompt = enc(mistral_v1, "[INST] Hi [/INST]")
    ids = enc(mistral_v1, "Hello there")
    s = ChatStream(mistral_v1, TagSet.preset("mistral"), prompt_ids=prompt, new_call_id=lambda name, fmt: "call")
    assert mistral_v1.decode(prompt + ids)[len(mistral_v1.decode(prompt)) :].startswith(" ")
    n = step or len(ids)
    got = "".join((s.message(ids[i : i + n], i + n >= len(ids)) or {}).get("content") or "" for i in range(0, len(ids), n))
    assert got == "Hello there"


# --- a tool call inside reasoning that was never closed -----------------------------------------


@pytest.mark.parametrize("step", STEPS)
def test_a_call_in_an_unclosed_think_ends_it_where_the_family_does(qwen3: Any, step: int) -> None:
    """Qwen3.5 (the ``qwen3_coder`` preset) writes its call inside a ``<think>`` it never
    closed (llama.cpp's ``llamacpp-q35-call-inside-think``): the reasoning ends there. The
    Hermes preset keeps a marker inside reasoning as its text, as Magistral's fixtures do."""
    prompt = "<|im_start|>assistant\n<think>\n"  # the template opens the reasoning
    xml = "<tool_call>\n<function=ls>\n<parameter=path>\n.\n</parameter>\n</function>\n</tool_call>"
    assert TagSet.preset("qwen3_coder").tool_ends_reasoning and not TagSet.preset("qwen3").tool_ends_reasoning
    got = both(qwen3, "qwen3_coder", enc(qwen3, "Need to look.\n" + xml), step, prompt=prompt)
    assert got == ("", "Need to look.", [("ls", {"path": "."})])
    call = '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
    got = both(qwen3, "qwen3", enc(qwen3, "Need to look.\n" + call), step, prompt=prompt)
    assert got == ("", "Need to look.\n" + call, [])
    # Closed first, the call is after the reasoning in both.
    got = both(qwen3, "qwen3_coder", enc(qwen3, "Need to look.\n</think>\n\n" + xml), step, prompt=prompt)
    assert got == ("", "Need to look.", [("ls", {"path": "."})])
