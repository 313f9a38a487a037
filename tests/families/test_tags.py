"""Tag presets and the tool-call body parsers, format by format."""

from __future__ import annotations

import json

import pytest

from detok_plugin import DetokenizerState, TagSet, TokenTable, parse_tool_body


def test_presets_are_known_and_unknown_names_say_which_exist():
    assert set(TagSet.presets()) == {
        "qwen3", "hermes", "deepseek_r1", "deepseek_v31", "deepseek_v32", "deepseek_v4", "deepseek_v41", "mistral", "llama3", "llama4_pythonic", "qwen3_coder", "glm45", "glm47", "gemma4", "kimi_k2", "kimi_k3", "magistral"
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


_WEATHER_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "hot": {"type": "boolean"}}}}}
]  # fmt: skip


def test_qwen3_xml_calls_typed_by_the_schema_and_strings_without_it():
    body = (
        "<function=get_weather>\n<parameter=city>\n東京\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "<parameter=hot>\ntrue\n</parameter>\n</function>\n<function=lookup>\n<parameter=q>\na\nb\n</parameter>\n</function>"
    )
    calls = parse_tool_body(body, "qwen3_xml", tools=_WEATHER_TOOLS)
    assert [(n, json.loads(a)) for n, a in calls] == [
        ("get_weather", {"city": "東京", "days": 3, "hot": True}),
        ("lookup", {"q": "a\nb"}),  # one newline trimmed at each end, not more
    ]
    untyped = parse_tool_body(body, "qwen3_xml")
    assert json.loads(untyped[0][1]) == {"city": "東京", "days": "3", "hot": "true"}


def test_qwen3_xml_keeps_a_last_parameter_whose_close_tag_is_missing_and_reads_json_bodies():
    body = "<function=get_weather>\n<parameter=city>\nParis\n</function>"
    assert parse_tool_body(body, "qwen3_xml") == [("get_weather", '{"city": "Paris"}')]
    assert parse_tool_body('{"name": "f", "arguments": {"a": 1}}', "qwen3_xml") == [("f", '{"a": 1}')]


def test_glm45_name_then_pairs_keys_stripped_values_as_written():
    body = "get_weather\n<arg_key> city </arg_key>\n<arg_value>東京\n</arg_value>\n<arg_key>days</arg_key><arg_value>3</arg_value>"
    [(name, args)] = parse_tool_body(body, "glm45", tools=_WEATHER_TOOLS)
    assert name == "get_weather" and json.loads(args) == {"city": "東京\n", "days": 3}


def test_kimi_k2_calls_take_the_name_from_the_header():
    body = (
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "東京"}<|tool_call_end|>'
        "<|tool_call_begin|>functions.lookup:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
    )
    assert parse_tool_body(body, "kimi_k2") == [("get_weather", '{"city": "東京"}'), ("lookup", "{}")]


@pytest.mark.parametrize(
    "body, fmt",
    [
        ("<parameter=a>\n1\n</parameter>", "qwen3_xml"),
        ("<function=>\n</function>", "qwen3_xml"),
        ("<arg_key>a</arg_key><arg_value>1</arg_value>", "glm45"),
        ("<|tool_call_begin|>get_weather<|tool_call_argument_begin|>{}<|tool_call_end|>", "kimi_k2"),
        ("<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{bad<|tool_call_end|>", "kimi_k2"),
    ],
    ids=["qwen3-no-function", "qwen3-no-name", "glm45-no-name", "kimi-header-without-index", "kimi-bad-json"],
)
def test_malformed_xml_and_section_bodies_raise_value_error(body, fmt):
    with pytest.raises(ValueError):
        parse_tool_body(body, fmt)
