"""The JSON tool-call body reader (``detok_plugin.families._json_reader``): linear work on
long bodies. No timing: the strings the reader keeps. A string grown by ``+=`` on each
piece copies all it holds every time (quadratic in the body's length); one the reader
drops once read does not grow."""

from __future__ import annotations

import json
from typing import Any

import pytest

from detok_plugin.families import _json_reader, tool_format

N = 20_000
TEXT = ("def f(x):\n    return x * 2  # </tool_call> is text here\n" * (N // 50 + 1))[:N]

ARGS = '{"path": "a.py"}'
LONG = {
    # Arguments that stream as they form (an object): each piece is sent once read.
    "streamed_object": ("hermes", '{"name": "write", "arguments": {"path": "a.py", "text": ' + json.dumps(TEXT) + "}}", True),
    # Arguments that cannot stream (a string value): sent whole when the body closes.
    "string_arguments": ("hermes", '{"name": "write", "arguments": ' + json.dumps(TEXT) + "}", False),
    # Text before a call's opening marker (not what a template writes; a model may): the
    # reader looks for the marker and holds only what may still become it.
    "deepseek_text_before_the_call": (
        "deepseek",
        f"{TEXT}<｜tool▁call▁begin｜>function<｜tool▁sep｜>write\n```json\n{ARGS}\n```<｜tool▁call▁end｜>",
        True,
    ),
    "deepseek_v31_text_before_the_call": ("deepseek_v31", f"{TEXT}<｜tool▁call▁begin｜>write<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>", True),
    "kimi_k2_text_before_the_call": (
        "kimi_k2",
        f"{TEXT}<|tool_call_begin|>functions.write:0<|tool_call_argument_begin|>{ARGS}<|tool_call_end|>",
        True,
    ),
}


def _longest_text_kept(reader: Any) -> int:
    """The longest string among the reader's attributes, or in a list it keeps."""
    longest = 0
    for slot in type(reader).__slots__:
        value = getattr(reader, slot, None)
        values = value if isinstance(value, list) else [value]
        for v in values:
            for item in v if isinstance(v, list) else [v]:
                if isinstance(item, str):
                    longest = max(longest, len(item))
    return longest


@pytest.mark.parametrize("case", [pytest.param(c, id=c) for c in LONG])
def test_a_long_body_in_small_pieces_keeps_no_string_that_grows_with_it(case: str) -> None:
    """The reader before 8763614 kept each call's streamed arguments as one string grown
    per piece, before 5ffe950 a body that cannot stream grew its buffer per piece, and
    until the text-before-the-call cases were added a DeepSeek or Kimi head kept all text
    before a call's marker: each held the whole body (20,000 characters here, not a few)."""
    fmt, body, streams = LONG[case]
    reader = tool_format(fmt).reader(None)
    sent: list[str] = []
    kept = 0
    for at in range(0, len(body), 5):
        for _k, _name, args in reader.feed(body[at : at + 5]):
            sent.append(args)
        kept = max(kept, _longest_text_kept(reader))
    # A piece and a few characters held; a head (DeepSeek's, Kimi's) also holds its marker's
    # possible start and, once the marker is found, the head up to its arguments: not the body.
    bound = 64 if fmt == "hermes" else 128
    assert kept <= bound, f"{kept} characters kept in one string"
    if fmt != "hermes":
        assert (reader.calls, reader.done, "".join(sent)) == (1, [True], ARGS)
        return
    arguments = json.loads(body)["arguments"]
    if streams:
        assert reader.done == [True]
        assert json.loads("".join(sent)) == arguments
        assert reader.args == ["".join(sent)]
    else:
        assert reader.calls == 1 and "".join(sent) == "" and reader.done == [False]


def test_the_piece_scan_memo_is_bounded() -> None:
    """Scans of argument pieces are remembered for every reader; distinct pieces without
    end do not grow the memo past its bound."""
    reader = tool_format("hermes").reader(None)
    reader.feed('{"name": "f", "arguments": {"a": "')
    for i in range(_json_reader._SCANS_MAX + 100):
        assert reader.feed(f"x{i}") == [(0, None, f"x{i}")]
    assert len(_json_reader._SCANS) <= _json_reader._SCANS_MAX
    assert reader.feed('"}}') == [(0, None, '"}')]


@pytest.mark.parametrize(
    ("fmt", "body"),
    [
        pytest.param(
            "deepseek_v31",
            '<｜tool▁call▁begin｜>echo<｜tool▁sep｜>{"text": "a <｜tool▁call▁end｜> \\" <｜tool▁call▁end｜>", "n": 1}<｜tool▁call▁end｜>',
            id="deepseek_v31",
        ),
        pytest.param(
            "kimi_k2",
            '<|tool_call_begin|>functions.echo:0<|tool_call_argument_begin|>{"t": "ends with <|tool_call_end|>"}<|tool_call_end|>',
            id="kimi_k2",
        ),
    ],
)
def test_a_raw_closer_inside_a_json_string_does_not_end_the_arguments(fmt: str, body: str) -> None:
    """The raw-arguments readers stop at their closer only outside a JSON string (the
    format's ``marker_is_text``): at every split of the body, what streamed is the parse."""
    [(name, args)] = tool_format(fmt).parse(body, None)
    for cut in range(len(body) + 1):
        reader = tool_format(fmt).reader(None)
        events = reader.feed(body[:cut]) + reader.feed(body[cut:])
        assert [n for _, n, _ in events if n] == [name]
        assert json.loads("".join(a for _, _, a in events)) == json.loads(args), cut
