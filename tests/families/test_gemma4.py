"""Gemma 4 (``detok_plugin.families.gemma4``): every Gemma 4 fixture of CanIToolCall 0.1.1
through the parse and the reader, and the reader's hold rules piece by piece.

No PyPI package ships Gemma 4's tokenizer: the family is tested on the fixtures' recorded
texts (``raw_output``), and on their recorded ids (``output_token_ids``) through the chat
layer with the test zoo's stand-in (Gemma 3's vocabulary with Gemma 4's markers at their
ids, special; it decodes every fixture's ids to its ``raw_output``). The oracle: each fixture's ``expected`` calls (arguments compared as
JSON: ``1e-05`` is a number, ``"x,y} \\"q\\""`` one string), written by CanIToolCall from
Gemma 4's official chat template and from vLLM's, SGLang's and Ollama's tests; for the reader,
its contract against that parse (``family_checks``); per piece, the module's rules (derived
by hand). Where the bodies are in a reply is cut here by the format's notes (a
``<tool_call|>`` between ``<|"|>`` delimiters is text), not by the code under test.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from canitoolcall_fixtures import family_json, fixtures, params
from family_checks import calls_of, check_reader, expected_reply, read, text_reply
from fixture_chat import STRATEGIES, replay
from hypothesis import given
from hypothesis import strategies as st

from detok_plugin import TagSet, parse_tool_body
from detok_plugin.families import tool_format
from detok_plugin.families.gemma4 import Notation

FORMAT = "gemma4"
ALL = fixtures("gemma4")
COMPLETE = [fx for fx in ALL if "expected" in fx]
ERRORS = [fx for fx in ALL if "expected_error" in fx]

_Q = re.escape('<|"|>')
_BODY = re.compile(rf"<\|tool_call>((?:{_Q}.*?{_Q}|.)*?)<tool_call\|>", re.DOTALL)


def bodies(raw: str) -> list[str]:
    """The closed tool-call bodies of a reply, in order."""
    return [m.group(1) for m in _BODY.finditer(raw)]


def open_tail(raw: str) -> str | None:
    """The body a reply left open (cut before its ``<tool_call|>``), if any."""
    rest = _BODY.sub("", raw)
    return rest.split("<|tool_call>", 1)[1] if "<|tool_call>" in rest else None


def test_the_preset_names_gemma4s_markers() -> None:
    tags = TagSet.preset("gemma4")
    assert (tags.reasoning_open, tags.reasoning_close, tags.tool_open, tags.tool_close, tags.tool_format) == (
        "<|channel>thought\n", "<channel|>", "<|tool_call>", "<tool_call|>", "gemma4",
    )  # fmt: skip


@pytest.mark.parametrize("fx", params(COMPLETE))
def test_each_fixtures_bodies_parse_to_its_expected_calls(fx: dict[str, Any]) -> None:
    got = [call for body in bodies(fx["raw_output"]) for call in calls_of(parse_tool_body(body.strip(), FORMAT))]
    assert got == [(c["name"], c["arguments"]) for c in fx["expected"]["tool_calls"]]


@pytest.mark.parametrize("fx", params([fx for fx in COMPLETE if bodies(fx["raw_output"])]))
def test_the_reader_at_every_chunking_sends_a_prefix_of_the_parse_and_all_of_it_at_the_close(fx: dict[str, Any]) -> None:
    for body in bodies(fx["raw_output"]):
        check_reader(FORMAT, body)
        got = read(FORMAT, [body])
        assert got.done == [True]  # the object closed in the body: all of it went out


@pytest.mark.parametrize("fx", params([fx for fx in COMPLETE if "marker-in-arguments" in fx["tags"]]))
def test_markers_inside_a_string_are_its_text(fx: dict[str, Any]) -> None:
    [body] = bodies(fx["raw_output"])
    [(_, args)] = calls_of(parse_tool_body(body, FORMAT))
    assert "<tool_call|>" in args["text"] and "<|tool_call>" in args["text"]
    # The core asks the format before a close tag ends a body: inside the string it is text,
    # at the body's real end it is the close.
    text_is = tool_format(FORMAT).marker_is_text
    inner = body.index("<tool_call|>")
    assert text_is(body[:inner]) and not text_is(body)


@pytest.mark.parametrize("fx", params(ERRORS + [fx for fx in COMPLETE if "truncated" in fx["tags"]]))
def test_a_cut_or_malformed_body_is_refused_and_a_complete_one_before_it_kept(fx: dict[str, Any]) -> None:
    """Truncated (max_tokens inside a call): the open body's parse raises, so the core
    reports it and no call is made of it, and the reader never says it is done; a
    malformed closed body (no ``{...}``) raises too. A call closed before the cut parses
    (``truncated-second-parallel-call``)."""
    raw = fx["raw_output"]
    want = fx.get("expected", {}).get("tool_calls", [])
    assert len([body for body in bodies(raw) if _parses(body)]) == len(want)
    tail = open_tail(raw)
    if tail is not None:
        assert not _parses(tail)
        assert not any(read(FORMAT, list(tail)).done)


def _parses(body: str) -> bool:
    try:
        parse_tool_body(body.strip(), FORMAT)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    "body",
    [
        "call:f no brace",
        "f{a:1}",
        "call:{a:1}",
        "call:f{a:1",
        "call:f{a:1}}",
        "call:f{a:1} x",
        "call:f{a:}",
        'call:f{a:<|"|>x}',
        'call:f{a:<|"|>x<|"|> y}',
        "call:f{[1]}",
    ],
    ids=[
        "no-brace",
        "no-call-prefix",
        "no-name",
        "never-closed",
        "closed-twice",
        "text-after",
        "no-value",
        "open-string",
        "text-after-a-string",
        "value-without-key",
    ],
)
def test_malformed_bodies_raise_value_error(body: str) -> None:
    with pytest.raises(ValueError):
        parse_tool_body(body, FORMAT)


def test_a_bare_value_that_is_no_json_number_or_literal_is_kept_as_its_text() -> None:
    """Numbers as Python prints them are JSON numbers; other bare text (the notation has
    no quotes for it) stays a string, as vLLM 0.33's Gemma 4 parser keeps it."""
    [(_, args)] = parse_tool_body("call:f{a:1e-05,b:-0,c:1 b:2,d:True,e:nan,f:[x, 2]}", FORMAT)
    assert json.loads(args) == {"a": 1e-05, "b": 0, "c": "1 b:2", "d": "True", "e": "nan", "f": ["x", 2]}


def test_a_call_without_the_word_call_is_read_as_vllm_reads_it() -> None:
    """Some checkpoints write ``<|tool_call>:NAME{...}`` (vLLM 0.33's Gemma 4 parser reads it)."""
    assert calls_of(parse_tool_body(":get_time{}", FORMAT)) == [("get_time", {})]
    assert read(FORMAT, list(':get_time{tz:<|"|>UTC<|"|>}')).names == {0: "get_time"}


def test_each_piece_sends_what_the_rules_allow_at_once() -> None:
    """Per piece, derived by hand: the name at its ``{``; a string as it forms, its last
    characters held while they may begin ``<|"|>``; a bare value at the character that
    ends it; the closing brace at once."""
    r = tool_format(TagSet.preset("gemma4").tool_format).reader(None)
    steps = [
        ("call:get_wea", []),
        ("ther{ci", [(0, "get_weather", ""), (0, None, "{")]),
        ('ty:<|"|>東', [(0, None, '"city": "東')]),
        ('京<|"', [(0, None, "京")]),  # '<|"' may begin the closing delimiter: held
        ('x<|"|>,n:4', [(0, None, '<|\\"x", "n": ')]),  # it did not: sent, escaped; the string closes
        ("2", []),  # a bare value waits for its end: 42 or 420 or 42.5
        ("}", [(0, None, "42}")]),
    ]
    for piece, events in steps:
        assert r.feed(piece) == events, piece
    assert r.done == [True] and r.args == ['{"city": "東京<|\\"x", "n": 42}']


def test_a_long_string_in_one_character_pieces_holds_at_most_a_delimiters_start() -> None:
    """The conversion keeps only what may still change: here never more than the four
    characters that may begin ``<|"|>``, however long the string (the longest string among
    its attributes, whatever their names)."""
    value = 'line <| with a brace } and <|" almost a delimiter\n' * 400
    notation = Notation()
    out, longest = [], 0
    for c in 'text:<|"|>' + value + '<|"|>}':
        out.append(notation.feed(c))
        longest = max(longest, *(len(v) for s in Notation.__slots__ if isinstance(v := getattr(notation, s), str)))
    assert notation.closed and longest <= 4
    assert json.loads("{" + "".join(out)) == {"text": value}


# --- whole replies through the chat layer, on the real Qwen3 tokenizer ------------------------
#
# Gemma 4's markers (<|tool_call>, <|"|>, <|channel>, ...) are text over several Qwen3 tokens.

_PROMPTS = {m["repo"]: m["default_generation_prompt"] for m in family_json("gemma4")["reference_models"]}


@pytest.mark.parametrize("group", [1, 3, 0], ids=["token", "three", "one"])
@pytest.mark.parametrize("fx", params(ALL))
def test_a_whole_reply_gives_the_expected_calls_and_content_and_reasoning_up_to_blanks(
    fx: dict[str, Any], group: int, load_tokenizer: Any
) -> None:
    """Calls exact (names, arguments as JSON); content and reasoning equal after
    CanIToolCall's soft-v1 (stripped): the official template writes a newline before
    ``<channel|>`` that vLLM's own tests do not, and a blank between content and a call is
    the chat layer's policy. A cut or malformed call is no call."""
    prompt = fx["generation_prompt"] if fx.get("generation_prompt") is not None else _PROMPTS[fx["models"][0]]
    got = text_reply(load_tokenizer("qwen3"), "gemma4", fx, prompt, group=group)
    want = expected_reply(fx) if "expected" in fx else None
    assert got.calls == (want.calls if want else [])
    if want is not None:
        assert got.soft() == want.soft()


_Q_ = '<|"|>'
_ODD = 'a <|" b ' * 60  # delimiter starts that are not delimiters
SYNTHETIC = (
    "call:save{"
    + "long key " * 40
    + ":"
    + "1" * 300
    + ","
    + _Q_
    + "quoted: key"
    + _Q_
    + ":"
    + _Q_
    + _ODD
    + _Q_
    + ","
    + "nested:[{k:[1, 2.5e-3, "
    + _Q_
    + "}]"
    + _Q_
    + "]}, true, null],x:-0.25}"
)


@given(st.lists(st.integers(0, len(SYNTHETIC)), max_size=60))
def test_any_chunking_of_long_keys_bare_values_and_strings_streams_the_parse(cuts: list[int]) -> None:
    """Any cut through a long bare key, a long bare value, a quoted key and a long string
    with delimiter starts in it: the same events as whole, and all of the parse."""
    bounds = sorted(cuts)
    pieces = [SYNTHETIC[a:b] for a, b in zip([0, *bounds], [*bounds, len(SYNTHETIC)])]
    got, whole = read(FORMAT, pieces), read(FORMAT, [SYNTHETIC])
    assert got.key() == whole.key() and got.done == [True]
    [(name, args)] = parse_tool_body(SYNTHETIC, FORMAT)
    assert got.names == {0: name} and got.args[0] == args
    parsed = json.loads(args)
    assert parsed["long key " * 39 + "long key"] == int("1" * 300) and parsed["quoted: key"] == 'a <|" b ' * 60
    assert parsed["nested"] == [{"k": [1, 2.5e-3, "}]"]}, True, None] and parsed["x"] == -0.25


# --- the recorded ids through the chat layer, on the zoo's Gemma 4 tokenizer ------------------
#
# tokenizer_zoo's gemma4 (Gemma 3's vocabulary with Gemma 4's markers at their ids, special)
# decodes every fixture's output_token_ids to its raw_output (tests/core/test_tokenizer_zoo_fixtures.py).
# Special tokens are kept in the text, as the detok parser asks of a request with tools.


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fx", params(ALL))
def test_the_recorded_ids_under_each_chunking_give_the_expected_reply(
    fx: dict[str, Any], strategy: str, load_tokenizer: Any
) -> None:
    """Without streaming and under each of CanIToolCall's default chunkings: calls exact,
    content and reasoning equal after soft-v1 (the template's newline before
    ``<channel|>``, a blank before a call); a cut or malformed call is no call."""
    got = replay(load_tokenizer("gemma4"), "gemma4", fx, strategy, skip_special_tokens=False)
    if "expected_error" not in fx:
        want = expected_reply(fx)
        assert got.calls == want.calls
        assert ((got.content or "").strip() or None, (got.reasoning or "").strip() or None) == (
            (want.content or "").strip() or None,
            (want.reasoning or "").strip() or None,
        )
    else:
        assert got.calls == []
