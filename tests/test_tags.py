"""Tag presets and the tool-call body parsers, format by format."""

from __future__ import annotations

import json

import pytest

from detok_plugin import DetokenizerState, TagSet, TokenTable, parse_tool_body


def test_presets_are_known_and_unknown_names_say_which_exist():
    assert set(TagSet.presets()) == {
        "qwen3", "hermes", "deepseek_r1", "deepseek_v31", "mistral", "llama3", "qwen3_coder", "glm45", "kimi_k2"
    }
    with pytest.raises(ValueError, match="qwen3"):
        TagSet.preset("qwen4")


def test_hermes_arguments_object_becomes_a_json_string():
    [(name, args)] = parse_tool_body('{"name": "f", "arguments": {"a": [1, "二"]}}', "hermes")
    assert name == "f" and json.loads(args) == {"a": [1, "二"]} and "二" in args


def test_mistral_list_of_calls():
    calls = parse_tool_body('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": "{\\"x\\": 1}"}]', "mistral")
    assert calls == [("a", "{}"), ("b", '{"x": 1}')]


def test_llama3_parameters():
    assert parse_tool_body('{"name": "search", "parameters": {"q": "東京"}}', "llama3") == [
        ("search", '{"q": "東京"}')
    ]


def test_deepseek_call_blocks():
    body = (
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"北京\"}\n```"
        "<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```"
        "<｜tool▁call▁end｜>"
    )
    assert parse_tool_body(body, "deepseek") == [("get_weather", '{"city": "北京"}'), ("get_time", "{}")]


@pytest.mark.parametrize(
    "body, fmt",
    [("{not json", "hermes"), ('{"arguments": {}}', "hermes"), ("[1, 2]", "mistral"), ("no calls", "deepseek")],
    ids=["bad-json", "no-name", "not-objects", "no-blocks"],
)
def test_malformed_bodies_raise_value_error(body, fmt):
    with pytest.raises(ValueError):
        parse_tool_body(body, fmt)


def test_llama3_python_tag_runs_to_the_end_of_the_stream():
    pieces = ("Let me look.", "<|python_tag|>", '{"name": "s", "parameters": {"q": 1}}')
    t = TokenTable("byte_level", tuple(p.encode() for p in pieces), frozenset())
    s = DetokenizerState.from_tokenizer(t, tags="llama3", eos_token_ids=())
    texts = [s.push(i).text for i in range(3)]
    done = [c for c in s.finish().tool_calls if c.complete]
    assert "".join(texts) == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in done] == [("s", {"q": 1})]
