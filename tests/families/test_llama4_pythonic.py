"""Llama 4's pythonic tool calls (``detok_plugin.families.llama4_pythonic``): every Llama 4
fixture of CanIToolCall 0.1.1, and the rules of the module on bodies written here.

The oracle: each fixture's ``expected`` (content and the calls' names and arguments compared
as JSON: ``9`` is not ``"9"``), which CanIToolCall took from vLLM's tests, a vLLM bug report
and Meta's prompt-format document; for the reader, its contract against the parse
(``family_checks``); for values, Python's own reading of the literal (``ast.literal_eval``).
The fixtures run through the real core from their recorded ids on Llama 4's real tokenizer
(the zoo's ``llama4``, built from llama-models' ``llama4/tokenizer.model``; its decode of every
fixture's ids is its ``raw_output``: ``tests/core/test_tokenizer_zoo_fixtures.py``).
"""

from __future__ import annotations

import ast
import json
from typing import Any

import pytest
from canitoolcall_fixtures import fixtures, params
from family_checks import calls_of, check_reader, read
from fixture_chat import STRATEGIES, expected_reply, replay

from detok_plugin import ChatStream, TagSet, parse_tool_body

FMT = "llama4_pythonic"
ALL = [fx for fx in fixtures("llama") if "Llama-4" in fx["models"][0]]
COMPLETE = [fx for fx in ALL if "expected" in fx]
ERRORS = [fx for fx in ALL if "expected_error" in fx]


def body_of(fx: dict[str, Any]) -> str:
    """The reply is the body; ``<|python_start|>`` is its tag (the core takes it off)."""
    return str(fx["raw_output"]).removeprefix("<|python_start|>")


@pytest.fixture(scope="module")
def llama4(load_tokenizer: Any) -> Any:
    return load_tokenizer("llama4")


def test_the_preset_opens_at_python_start_or_at_a_bracket_that_starts_the_reply() -> None:
    tags = TagSet.preset(FMT)
    assert (tags.reasoning_open, tags.reasoning_close, tags.tool_format) == (None, None, FMT)
    assert (tags.tool_open, tags.tool_close, tags.tool_bare, tags.bare_at_start) == ("<|python_start|>", None, "[", True)


def test_the_fixtures_are_llama_4s() -> None:
    assert len(ALL) == 10 and len(ERRORS) == 1
    assert any("<|python_start|>" in fx["raw_output"] for fx in ALL)


@pytest.mark.parametrize("fx", params(COMPLETE))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_fixture_through_the_core_is_its_expected_reply(fx: dict[str, Any], strategy: str, llama4: Any) -> None:
    assert replay(llama4, FMT, fx, strategy) == expected_reply(fx)


@pytest.mark.parametrize("strategy", ["nonstream", "token", "one"])
def test_the_wrappers_text_kept_with_special_tokens_is_no_content(strategy: str, llama4: Any) -> None:
    """With ``skip_special_tokens=False`` the text keeps ``<|python_end|>``: the wrapper's
    close, not content and not part of a value."""
    [fx] = [fx for fx in COMPLETE if fx["id"].endswith("python-start-end")]
    assert replay(llama4, FMT, fx, strategy, skip_special_tokens=False) == expected_reply(fx)


@pytest.mark.parametrize("fx", params([fx for fx in COMPLETE if expected_reply(fx).calls]))
def test_each_fixtures_body_parses_to_its_expected_calls_and_streams_a_prefix_at_every_cut(fx: dict[str, Any]) -> None:
    body = body_of(fx)
    assert calls_of(parse_tool_body(body.strip(), FMT)) == expected_reply(fx).calls
    check_reader(FMT, body)


@pytest.mark.parametrize("fx", params(ERRORS))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_cut_list_is_no_call(fx: dict[str, Any], strategy: str, llama4: Any) -> None:
    """Cut by max_tokens inside the second call's string: the parse refuses the list, the
    reply makes no call (its text comes back as content, or nothing)."""
    with pytest.raises(ValueError):
        parse_tool_body(body_of(fx).strip(), FMT)
    got = replay(llama4, FMT, fx, strategy)
    assert got.calls == [] and got.content in (None, fx["raw_output"])


def chat(tok: Any, text: str) -> tuple[str, list[tuple[str, Any]]]:
    """``text`` encoded by the real tokenizer, one id per step: the content and the calls."""
    ids = tok.encode(text, add_special_tokens=False)
    stream = ChatStream(tok, TagSet.preset(FMT), new_call_id=lambda name, fmt: "call")
    content = "".join((stream.message([i], finished=n == len(ids) - 1) or {}).get("content") or "" for n, i in enumerate(ids))
    return content, stream.complete


def test_a_bracket_after_text_is_text_and_blanks_before_the_list_are_not(llama4: Any) -> None:
    text = "See [1] and call get_weather(city='LA')."
    assert chat(llama4, text) == (text, [])
    content, calls = chat(llama4, "\n [get_weather(city='LA')]")
    assert content.strip() == "" and calls == [("get_weather", '{"city": "LA"}')]


# --- the rules of the module, on bodies written here ----------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "'東京 👩\u200d💻'",
        '"it\'s \\"quoted\\" \\\\ ok"',
        "-3",
        "+2.5",
        "1e-05",
        "[1, (2, 3), {'a': None}]",
        "{'nested': {'list': [True, False]}}",
        "{1: 'int key'}",
        "('a',)",
    ],
)
def test_a_value_is_the_json_of_the_python_literal(value: str) -> None:
    body = f"[f(v={value}, n=1)]"
    want = ast.literal_eval(value)
    want = json.loads(json.dumps(want)) if not isinstance(want, tuple) else json.loads(json.dumps(list(want)))
    assert calls_of(parse_tool_body(body, FMT)) == [("f", {"v": want, "n": 1})]
    check_reader(FMT, body)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("true", True),
        ("null", None),
        ("{'a', 'b'}", ["a", "b"]),
        ("f'plain'", "plain"),
        ("'line one\nline two\r'", "line one\nline two\r"),
    ],
    ids=["json-true", "json-null", "set", "f-string", "raw-newline"],
)
def test_values_vllm_reads_that_python_literals_do_not_cover(value: str, want: Any) -> None:
    """JSON's names, a set (a list, in its written order), an f-string without placeholders,
    a raw newline inside a string (rule 3)."""
    [(_, args)] = calls_of(parse_tool_body(f"[f(v={value})]", FMT))
    assert args["v"] == want
    check_reader(FMT, f"[f(v={value})]")


def test_brackets_and_markers_inside_strings_are_text() -> None:
    body = "[echo(text='a)] b( [c] <|python_end|>', n=1), ping.now()]"
    assert calls_of(parse_tool_body(body, FMT)) == [("echo", {"text": "a)] b( [c] <|python_end|>", "n": 1}), ("ping.now", {})]
    check_reader(FMT, body)


@pytest.mark.parametrize(
    "body",
    [
        "[]",
        "[f('positional')]",
        "[f(**kw)]",
        "[f(v=g())]",
        "[f(v=x)]",
        "[f(v=1e999)]",
        "[f(v=b'bytes')]",
        "[f(v=1)] and more",
        "[f(v=1)",
        "f(v=1)",
        "[f(v=1), 3]",
        "[(lambda: 1)()]",
        "[f(a=1, a=2)]",
        "[" * 300 + "]" * 300,
    ],
    ids=["empty", "positional", "kwargs", "call-value", "name-value", "inf", "bytes", "text-after", "unclosed",
         "no-list", "not-a-call", "lambda", "key-twice", "deep"],
)  # fmt: skip
def test_a_body_outside_the_rules_is_malformed_and_the_reader_finishes_no_call_it_refuses(body: str) -> None:
    with pytest.raises(ValueError):
        parse_tool_body(body, FMT)
    got = read(FMT, list(body))
    assert all(got.args[k] == '{"v": 1}' for k in range(got.calls) if got.done[k])
