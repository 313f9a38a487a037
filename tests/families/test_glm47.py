"""GLM-4.7 and GLM-5.x (``detok_plugin.families.glm47``, GLM-4.5's body format): every GLM
fixture of CanIToolCall 0.1.1 (4.5, 4.7 and 5.3 layouts) through the parse and the reader.

No PyPI package ships GLM's tokenizer, so the family is tested on the fixtures' recorded
texts (``raw_output``), not through GLM's own ids. The oracle: each fixture's ``expected``
calls (names, and arguments compared as JSON: ``3`` is not ``"3"``), written by CanIToolCall
from GLM's official chat templates and from vLLM's and SGLang's tests; for the reader, its
contract against that parse (``family_checks``). Where the bodies are in a reply is cut here
by the format's notes (a ``</tool_call>`` inside an ``<arg_value>`` is text), not by the code
under test.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from canitoolcall_fixtures import family_json, fixtures, params
from family_checks import calls_of, check_reader, expected_reply, text_reply

from detok_plugin import TagSet, parse_tool_body
from detok_plugin.families import tool_format

FORMAT = TagSet.preset("glm47").tool_format
ALL = fixtures("glm")
COMPLETE = [fx for fx in ALL if "expected" in fx]
ERRORS = [fx for fx in ALL if "expected_error" in fx]

# A body runs from <tool_call> to the first </tool_call> outside a closed <arg_value>.
_BODY = re.compile(r"<tool_call>((?:<arg_value>.*?</arg_value>|.)*?)</tool_call>", re.DOTALL)


def bodies(raw: str) -> list[str]:
    """The closed tool-call bodies of a reply, in order."""
    return [m.group(1) for m in _BODY.finditer(raw)]


def expected_calls(fx: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(c["name"], c["arguments"]) for c in fx["expected"]["tool_calls"]]


def test_glm47_is_glm45s_body_format_with_its_own_preset() -> None:
    tags = TagSet.preset("glm47")
    assert (tags.reasoning_open, tags.reasoning_close, tags.tool_open, tags.tool_close) == (
        "<think>", "</think>", "<tool_call>", "</tool_call>",
    )  # fmt: skip
    assert FORMAT == TagSet.preset("glm45").tool_format == "glm45"


def test_the_fixtures_cover_all_three_layouts() -> None:
    layouts = {tag for fx in ALL for tag in fx["tags"] if tag in ("x-glm45", "x-glm47", "x-glm53")}
    assert layouts == {"x-glm45", "x-glm47", "x-glm53"} and len(COMPLETE) >= 40


@pytest.mark.parametrize("fx", params(COMPLETE))
def test_each_fixtures_bodies_parse_to_its_expected_calls(fx: dict[str, Any]) -> None:
    got = [
        call for body in bodies(fx["raw_output"]) for call in calls_of(parse_tool_body(body.strip(), FORMAT, tools=fx["tools"]))
    ]
    assert got == expected_calls(fx)


@pytest.mark.parametrize("fx", params([fx for fx in COMPLETE if bodies(fx["raw_output"])]))
def test_the_reader_at_every_chunking_sends_a_prefix_of_the_parse(fx: dict[str, Any]) -> None:
    for body in bodies(fx["raw_output"]):
        check_reader(FORMAT, body, fx["tools"])


@pytest.mark.parametrize("fx", params([fx for fx in COMPLETE if "marker-in-arguments" in fx["tags"]]))
def test_markers_inside_a_value_are_its_text(fx: dict[str, Any]) -> None:
    [body] = bodies(fx["raw_output"])
    [(_, args)] = calls_of(parse_tool_body(body.strip(), FORMAT, tools=fx["tools"]))
    assert "<tool_call>" in args["content"] and "</tool_call>" in args["content"] and "<arg_key>" in args["content"]
    # The core asks the format before a close tag ends a body: inside the value it is text,
    # at the body's real end it is the close.
    text_is = tool_format(FORMAT).marker_is_text
    inner = body.index("</tool_call>")
    assert text_is(body[:inner]) and not text_is(body)


def test_a_value_whose_close_tag_is_missing_runs_to_the_body_end() -> None:
    """vLLM #57826's malformation (the last ``</arg_value>`` left out): ``</tool_call>``
    still closes the call, and the value is kept (``glm47-missing-last-close-arg-value``)."""
    [fx] = [fx for fx in ALL if fx["id"] == "glm/glm47-missing-last-close-arg-value"]
    [body] = bodies(fx["raw_output"])
    assert body.endswith("<arg_value>celsius")
    assert not tool_format(FORMAT).marker_is_text(body)  # so </tool_call> closes it
    assert calls_of(parse_tool_body(body, FORMAT, tools=fx["tools"])) == expected_calls(fx)


@pytest.mark.parametrize("fx", params(ERRORS))
def test_a_truncated_reply_closes_no_body(fx: dict[str, Any]) -> None:
    """Cut by max_tokens: no ``</tool_call>`` came, so no body is complete and the core
    reports the open one unterminated (sent as content, never as a call). What the
    reader sent of it stays a prefix of what its parse would be."""
    raw = fx["raw_output"]
    assert bodies(raw) == [] and set(fx["expected_error"]["accept"]) >= {"no_tool_calls", "content_passthrough"}
    if "<tool_call>" in raw:
        check_reader(FORMAT, raw.split("<tool_call>", 1)[1], fx["tools"])


@pytest.mark.parametrize(
    "body",
    ["<arg_key>city</arg_key><arg_value>Paris</arg_value>", "", "<x>f<arg_key>a</arg_key><arg_value>1</arg_value>"],
    ids=["no-name", "empty", "markup-in-name"],
)
def test_a_body_without_a_name_is_malformed(body: str) -> None:
    with pytest.raises(ValueError):
        parse_tool_body(body, FORMAT)


# --- whole replies through the chat layer, on the real Qwen3 tokenizer ------------------------
#
# GLM's <think>, </think>, <tool_call> and </tool_call> are single tokens in Qwen3's vocabulary
# as in GLM's; <arg_key> and the rest are text over several tokens. The generation prompt is
# the fixture's, or its reference model's (GLM-4.7 and 5.3: ending <think>).

_PROMPTS = {m["repo"]: m["default_generation_prompt"] for m in family_json("glm")["reference_models"]}


@pytest.mark.parametrize("group", [1, 3, 0], ids=["token", "three", "one"])
@pytest.mark.parametrize("fx", params(ALL))
def test_a_whole_reply_gives_the_expected_calls_and_reasoning_and_content_up_to_blanks(
    fx: dict[str, Any], group: int, load_tokenizer: Any
) -> None:
    """Calls exact (names, arguments as JSON), reasoning exact; content equal after
    CanIToolCall's soft-v1 (stripped): the blanks GLM-4.5's template puts between content
    and a call are the chat layer's policy, not the family's. A cut reply makes no call."""
    prompt = fx.get("generation_prompt") or _PROMPTS[fx["models"][0]]
    got = text_reply(load_tokenizer("qwen3"), "glm47", fx, prompt, group=group)
    if "expected_error" in fx:
        assert got.calls == []
        return
    want = expected_reply(fx)
    assert (got.calls, got.reasoning) == (want.calls, want.reasoning)
    assert got.soft() == want.soft()
