"""The XML tool-call body reader (``detok_plugin.families._xml_reader``): what it sends at any
chunking, and that reading a long body costs linear work.

The oracle for what is sent: the reader's documented rules (the streamed arguments are a
prefix of the parse at the close, the family's parse through ``parse_tool_body``
with the request's tools, and all of it for a call closed in the body), the same text fed
whole, and, piece by piece, what the rules allow (derived by hand).
The oracle for cost, without timing: the text handed to the reader's regex searches, and
the longest string it holds, while 20,000 one-character pieces stream.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
from canitoolcall.chunking import DEFAULT_STRATEGIES, split
from canitoolcall_fixtures import fixtures, params
from family_checks import Reply, check_reader, expected_reply, read
from hypothesis import given
from hypothesis import strategies as st
from tokenizer_zoo_more import FIXTURE_MODELS

from detok_plugin import ChatStream, TagSet, parse_tool_body
from detok_plugin.families import tool_format
from detok_plugin.families._xml_reader import Search, XmlBodyReader

PROPS = {"path": {"type": "string"}, "content": {"type": "string"}, "count": {"type": "integer"}, "options": {"type": "object"}}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"properties": PROPS}}} for n in ("write_file", "read_file")]

CODE = 'if a < b and c </ d:\n    x = "</param" + \'<parameter\' + "</parameter\\"" + "<b>"\n\n'
BODIES = {
    "qwen3_strings_and_typed": (
        "qwen3_xml",
        "<function=write_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
        f"<parameter=content>\n{CODE}\n</parameter>\n<parameter=count>\n42\n</parameter>\n"
        '<parameter=options>\n{"mode": "w", "lines": [1, 2]}\n</parameter>\n</function>',
    ),
    "qwen3_two_calls": (
        "qwen3_xml",
        "\n<function=read_file>\n<parameter=path>\n東京/a.txt\n</parameter>\n</function>\n"
        "<function=write_file>\n<parameter=content>\n\n\nline\n\n</parameter>\n<parameter=count>\n-3\n</parameter>\n</function>\n",
    ),
    "qwen3_key_twice": (
        "qwen3_xml",
        "<function=write_file>\n<parameter=path>\na\n</parameter>\n<parameter=path>\nb\n</parameter>\n</function>",
    ),
    "qwen3_json_body": ("qwen3_xml", '  {"name": "write_file", "arguments": {"path": "a", "count": 1}}'),
    "glm45_strings_and_typed": (
        "glm45",
        "write_file\n<arg_key>path</arg_key>\n<arg_value>src/a.py</arg_value>\n"
        f"<arg_key>content</arg_key>\n<arg_value>{CODE}</arg_valu!</arg_value>\n"
        '<arg_key>count</arg_key>\n<arg_value>7</arg_value>\n<arg_key>options</arg_key>\n<arg_value>{"a": [1]}</arg_value>\n',
    ),
    "glm45_key_twice": (
        "glm45",
        "write_file\n<arg_key>path</arg_key>\n<arg_value>a</arg_value>\n<arg_key>path</arg_key>\n<arg_value>b</arg_value>\n",
    ),
    # A body that ends inside a value (an EOS token's text in </arg_value>, fuzz seed 38412):
    # the parse keeps the value to the stripped body's end, so its trailing blanks are held.
    "glm45_value_never_closed": (
        "glm45",
        "write_file\n<arg_key>count</arg_key>\n<arg_value>3</arg_value>\n"
        "<arg_key>path</arg_key>\n<arg_value>src/a  b.py</arg_<|im_end|>value> \n\t\u3000\n",
    ),
    "glm45_typed_value_never_closed": ("glm45", "read_file\n<arg_key>count</arg_key>\n<arg_value>12 \n"),
    "qwen3_value_never_closed": ("qwen3_xml", "<function=write_file>\n<parameter=content>\nline  \n\n  x \n\n "),
    # Qwen3.8 writing about its own format (CanIToolCall's q38-marker-in-arguments): inline
    # tags are text; a </parameter> ends a value at a line start or where markup follows it.
    "qwen3_close_tags_inline": (
        "qwen3_xml",
        "<function=write_file>\n<parameter=path>\nnotes.md\n</parameter>\n<parameter=content>\n"
        "Close tags inline: </parameter> and </function> and <parameter=path> are text here.\n</parameter>\n</function>",
    ),
    "qwen3_compact": (
        "qwen3_xml",
        "<function=write_file><parameter=path>a </parameter> \n<parameter=count>7</parameter></function>",
    ),
    "qwen3_close_tag_left_out": (
        "qwen3_xml",
        "<function=write_file>\n<parameter=path>\na.md\n<parameter=count>\n3\n</parameter>\n<parameter=content>\nx\n</function>",
    ),
    "qwen3_inline_close_then_the_end": ("qwen3_xml", "<function=write_file>\n<parameter=content>\nx </parameter> \n"),
}


def _read(fmt: str, pieces: list[str]) -> tuple[XmlBodyReader, dict[int, str], dict[int, str]]:
    """Feed ``pieces``; each call's streamed name, and its streamed arguments joined."""
    reader = tool_format(fmt).reader(TOOLS)
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for piece in pieces:
        for k, name, text in reader.feed(piece):
            if name is not None:
                names[k] = name
            args[k] = args.get(k, "") + text
    return reader, names, args


@given(st.sampled_from(sorted(BODIES)), st.lists(st.integers(0, 400), max_size=40))
def test_any_chunking_streams_what_the_whole_body_does_and_a_prefix_of_the_parse(case: str, cuts: list[int]) -> None:
    fmt, body = BODIES[case]
    bounds = sorted(c for c in cuts if c <= len(body))
    pieces = [body[a:b] for a, b in zip([0, *bounds], [*bounds, len(body)])]
    reader, names, args = _read(fmt, pieces)
    whole, whole_names, whole_args = _read(fmt, [body])
    assert (names, args, reader.done) == (whole_names, whole_args, whole.done)
    assert reader.args == [args[k] for k in range(reader.calls)]
    want = parse_tool_body(body.strip(), fmt, tools=TOOLS)  # type: ignore[arg-type]
    assert names == {k: n for k, (n, _) in enumerate(want) if k < reader.calls}
    if case.endswith("_key_twice"):
        # The first value went out before the second key showed; the parse keeps the last
        # (rule 3: the reader stops there, and the chat layer logs the mismatch).
        assert args == {0: '{"path": "a"'} and reader.feed("more") == []
        return
    for k in range(reader.calls):
        assert want[k][1].startswith(args[k])
        if reader.done[k]:
            assert args[k] == want[k][1]


def test_each_piece_sends_what_the_rules_allow_at_once() -> None:
    """Per piece, derived by hand from the module's rules: a string value streams as it
    forms, its possible last newline is held, text that may become the closing tag is held,
    and a typed value goes whole at its close."""
    reader = tool_format("qwen3_xml").reader(TOOLS)
    steps = [
        ("<function=write_file>\n<parameter=path>\nsrc/a", [(0, "write_file", ""), (0, None, '{"path": "src/a')]),
        (".py\n", [(0, None, ".py")]),  # the newline may be the value's last: held
        ("</param", []),  # may be the closing tag: held
        ("eter>\n<parameter=count>\n4", [(0, None, '", "count": ')]),  # an integer: held to its close
        ("2\n</parameter>\n</function>", [(0, None, "42}")]),
    ]
    for piece, events in steps:
        assert reader.feed(piece) == events, piece
    assert reader.done == [True]
    assert reader.args == ['{"path": "src/a.py", "count": 42}']


@pytest.mark.parametrize(
    "case", ["qwen3_close_tags_inline", "qwen3_compact", "qwen3_close_tag_left_out", "qwen3_inline_close_then_the_end"]
)
def test_qwen3_value_ends_at_every_cut(case: str) -> None:
    """The bodies whose values end by each rule of the grammar (an inline ``</parameter>``
    that markup or the body's end follows, one at a line start, a close tag left out), cut in
    two at every place and fed one character at a time: ``family_checks.check_reader``."""
    check_reader(*BODIES[case], TOOLS)


@pytest.mark.parametrize(
    "after",
    [
        pytest.param("<parameter=path>\na\n</parameter>\n</function>", id="close-tag-left-out"),
        pytest.param("</parameter>\nstray\n<parameter=path>\na\n</parameter>\n</function>", id="close-tag-then-text"),
    ],
)
def test_a_line_start_is_seen_after_the_text_before_it_was_dropped(after: str) -> None:
    """A typed value over ``_TRIM_AT`` characters, the body cut right after the newline
    before a tag: the reader drops the text it no longer needs, but the tag is still at a line
    start (the grammar looks one character back), so what was sent is the parse. The reader
    at c84488c dropped the newline too, and sent the tag as the value's text."""
    value = json.dumps({"lines": ["x" * 40] * 40})
    body = f"<function=write_file>\n<parameter=options>\n{value}\n{after}"
    cut = len(body) - len(after)
    want = parse_tool_body(body, "qwen3_xml", tools=TOOLS)
    got = read("qwen3_xml", [body[:cut], body[cut:]], TOOLS)
    assert (got.args, got.done) == ({0: want[0][1]}, [True])


def test_an_inline_close_tag_waits_for_what_follows_it() -> None:
    """Per piece, derived by hand from the grammar (``qwen3_coder``): a ``</parameter>`` not
    at a line start ends the value only where markup (or the body's end) follows it, so it is
    held until the next text decides; at a line start it ends the value at once."""
    reader = tool_format("qwen3_xml").reader(TOOLS)
    steps = [
        ("<function=write_file>\n<parameter=content>\nTags: ", [(0, "write_file", ""), (0, None, '{"content": "Tags:')]),
        ("</parameter>", []),  # the value's end if markup follows: held
        ("\n", []),
        (" and", [(0, None, " </parameter>\\n and")]),  # text follows: it was text
        (" </function>.\n</parameter>", [(0, None, ' </function>."')]),  # at a line start: the end
        ("\n<parameter=path>\nx.md</parameter>", [(0, None, ', "path": "x.md')]),  # held again
        ("\n<parameter=count>\n3</parameter>", [(0, None, '", "count": ')]),  # markup followed
        ("</function>", [(0, None, "3}")]),
    ]
    for piece, events in steps:
        assert reader.feed(piece) == events, piece
    assert reader.done == [True]
    assert reader.args == ['{"content": "Tags: </parameter>\\n and </function>.", "path": "x.md", "count": 3}']


# --- CanIToolCall's marker-in-arguments replies on their real tokenizers, arguments streamed ---

#: Replies whose values hold markup (inline, or a compact body's close tags), by fixture id.
MARKUP_IN_VALUES = [
    fx
    for fx in fixtures("qwen3-xml")
    if "marker-in-arguments" in fx["tags"]
    or fx["id"] in ("qwen3-xml/bug-coder-text-after-call", "qwen3-xml/vllm-coder-missing-close-parameter")
]


def _tokenizer_for(load_tokenizer: Any, repo: str) -> Any:
    [name] = [n for n, repos in FIXTURE_MODELS.items() if repo in repos]
    return load_tokenizer(name)


@pytest.mark.parametrize("fx", params(MARKUP_IN_VALUES))
def test_markup_in_values_streams_the_fixtures_calls_at_every_chunking(load_tokenizer: Any, fx: dict[str, Any]) -> None:
    """The recorded ids through ``ChatStream`` with ``stream_arguments`` (the reader's events
    go out as they come), grouped by each of CanIToolCall's default chunkings: the client's
    joined calls are the fixture's, and, one id per step (``token``), the arguments went out in several
    pieces (the reader sent them, not only the parse at the close). Content and reasoning
    compare as CanIToolCall's soft match (the blank lines the template writes after
    ``</think>`` are another rule's)."""
    tok = _tokenizer_for(load_tokenizer, fx["tokenizer"]["repo"])
    ids = list(fx["output_token_ids"])
    prompt = tok.encode(fx["generation_prompt"] or "", add_special_tokens=False)
    special = frozenset(i for i, t in tok.added_tokens_decoder.items() if t.special)
    for strategy in DEFAULT_STRATEGIES:
        chat = ChatStream(
            tok, TagSet.preset("qwen3_coder"), prompt_ids=prompt, tools=lambda: fx["tools"],
            new_call_id=lambda name, fmt: f"call_{name}", stream_arguments=True,
        )  # fmt: skip
        got, pieces = _joined_counting_arguments(chat, split(ids, strategy, special))
        assert got.soft() == expected_reply(fx).soft(), strategy.id
        assert strategy.id != "token" or pieces > len(got.calls), pieces


def _joined_counting_arguments(chat: ChatStream, steps: list[list[int]]) -> tuple[Reply, int]:
    """``family_checks.joined``'s reply, and how many deltas carried a piece of arguments."""
    calls: dict[int, list[str]] = {}
    content, reasoning, pieces = "", "", 0
    for n, step in enumerate(steps):
        fields = chat.message(step, finished=n == len(steps) - 1) or {}
        content += fields.get("content") or ""
        reasoning += fields.get("reasoning") or ""
        for call in fields.get("tool_calls", ()):
            fn = call["function"]
            slot = calls.setdefault(call["index"], ["", ""])
            slot[0] += fn.get("name") or ""
            slot[1] += fn.get("arguments") or ""
            pieces += bool(fn.get("arguments"))
    got = [(name, json.loads(args)) for name, args in (calls[k] for k in sorted(calls))]
    return Reply(content or None, reasoning or None, got), pieces


# --- linear work: no timing, the text the reader searches and holds -------------------------

N = 20_000
LINES = "for i in range(n):\n    if a[i] < b:\n        out.append('</p>')\n"


def _long(n: int) -> str:
    return (LINES * (n // len(LINES) + 1))[:n]


JSON_VALUE = json.dumps({"lines": _long(N).splitlines()})
LONG = {
    "qwen3_string_value": ("qwen3_xml", f"<function=write_file>\n<parameter=content>\n{_long(N)}\n</parameter>\n</function>"),
    "qwen3_typed_value": ("qwen3_xml", f"<function=write_file>\n<parameter=options>\n{JSON_VALUE}\n</parameter>\n</function>"),
    "qwen3_text_before_the_call": (
        "qwen3_xml",
        f"{_long(N)}<function=write_file>\n<parameter=path>\na\n</parameter>\n</function>",
    ),
    "qwen3_text_between_parameters": (
        "qwen3_xml",
        f"<function=write_file>\n<parameter=path>\na\n</parameter>{_long(N)}<parameter=count>\n1\n</parameter>\n</function>",
    ),
    "glm45_string_value": ("glm45", f"write_file\n<arg_key>content</arg_key>\n<arg_value>{_long(N)}</arg_value>\n"),
    "glm45_typed_value": ("glm45", f"write_file\n<arg_key>options</arg_key>\n<arg_value>{JSON_VALUE}</arg_value>\n"),
    "glm45_blank_run": ("glm45", "write_file\n<arg_key>content</arg_key>\n<arg_value>a" + " \n" * (N // 2) + "b</arg_value>\n"),
    "qwen3_blank_run": ("qwen3_xml", f"<function=write_file>\n<parameter=content>\na{' ' * N}b\n</parameter>\n</function>"),
    "glm45_long_name": ("glm45", f"{'write_file ' * (N // 11)}\n<arg_key>path</arg_key>\n<arg_value>a</arg_value>\n"),
    "glm45_text_between_parameters": (
        "glm45",
        f"write_file\n<arg_key>path</arg_key>\n<arg_value>a</arg_value>{_long(N)}<arg_key>count</arg_key>\n<arg_value>1</arg_value>\n",
    ),
}


class _CountingPattern:
    """A compiled pattern that counts the characters each search is handed (from ``pos``)."""

    def __init__(self, pattern: re.Pattern[str], count: list[int]) -> None:
        self.pattern, self.count = pattern, count

    def search(self, string: str, pos: int = 0) -> re.Match[str] | None:
        self.count[0] += len(string) - pos
        return self.pattern.search(string, pos)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pattern, name)


def _count_searches(monkeypatch: pytest.MonkeyPatch, reader: XmlBodyReader) -> list[int]:
    """Wrap every compiled pattern the reader searches with in a counter: its dialect's, and
    those of its family module (the head's)."""
    count = [0]

    def wrap(value: Any) -> Any:
        if isinstance(value, re.Pattern):
            return _CountingPattern(value, count)
        if isinstance(value, Search):
            return Search(wrap(value.tag), wrap(value.tail))
        return value

    family = sys.modules[reader.dialect.head.__module__]
    for name, value in list(vars(family).items()):
        if isinstance(value, (re.Pattern, Search)):
            monkeypatch.setattr(family, name, wrap(value))
    reader.dialect = reader.dialect._replace(**{f: wrap(getattr(reader.dialect, f)) for f in reader.dialect._fields})
    return count


def _longest_text_held(reader: XmlBodyReader) -> int:
    """The longest string among the reader's attributes (its buffer, whatever its name)."""
    return max(len(v) for s in type(reader).__slots__ if isinstance(v := getattr(reader, s, None), str))


@pytest.mark.parametrize("case", [pytest.param(c, id=c) for c in LONG])
def test_a_long_body_in_one_character_pieces_is_searched_and_held_in_linear_work(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each character is handed to a search a bounded number of times (a search resumes
    where the last stopped), and the reader holds a bounded string (about _TRIM_AT). The
    reader at a156c98 searched from the step's start on every feed (2e8 to 4e8 characters
    here, not 2e5) and held the whole body (20,000 characters, not 2,000)."""
    fmt, body = LONG[case]
    reader = tool_format(fmt).reader(TOOLS)
    assert isinstance(reader, XmlBodyReader)
    searched = _count_searches(monkeypatch, reader)
    held = 0
    for ch in body:
        reader.feed(ch)
        held = max(held, _longest_text_held(reader))
    assert searched[0] <= 10 * len(body), f"{searched[0]} characters searched for a body of {len(body)}"
    assert held <= 2000, f"{held} characters held"
    want = parse_tool_body(body.strip(), fmt, tools=TOOLS)  # type: ignore[arg-type]
    assert reader.calls == 1 and want[0][1].startswith(reader.args[0])
    if fmt == "qwen3_xml":
        assert reader.args[0] == want[0][1]
