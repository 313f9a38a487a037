"""Checks shared by the family tests (``tests/families/test_<family>.py``): a body reader fed
at every chunking against the family's parse of the whole body.

The oracle is the reader's contract (``detok_plugin.families._format.BodyReader``): what was
sent of a call's arguments is a prefix of the parse at the close (``parse_tool_body`` with the
request's tools), all of it once the reader says the call is done, the names are the
parse's, and how the body was cut never changes what was sent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from detok_plugin import parse_tool_body
from detok_plugin.families import tool_format

__all__ = ["Read", "calls_of", "check_reader", "read", "splits"]


class Read:
    """What a reader sent for one body: each call's name and joined arguments, and ``done``."""

    def __init__(self, names: dict[int, str], args: dict[int, str], done: list[bool], calls: int) -> None:
        self.names, self.args, self.done, self.calls = names, args, done, calls

    def key(self) -> tuple[Any, ...]:
        return (self.names, self.args, self.done, self.calls)


def read(fmt: str, pieces: Sequence[str], tools: Any = None) -> Read:
    """Feed ``pieces`` to a fresh reader of ``fmt``."""
    reader = tool_format(fmt).reader(tools)
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for piece in pieces:
        for k, name, text in reader.feed(piece):
            if name is not None:
                assert k not in names, f"call {k}'s name sent twice"
                names[k] = name
            args[k] = args.get(k, "") + text
    assert reader.args == [args.get(k, "") for k in range(reader.calls)]
    return Read(names, args, list(reader.done), reader.calls)


def splits(body: str) -> list[list[str]]:
    """The body whole, in one-character pieces, and cut in two at every place."""
    return [[body], list(body), *([body[:i], body[i:]] for i in range(1, len(body)))]


def calls_of(parsed: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    """``[(name, arguments_json)]`` with the arguments read back (compared as JSON)."""
    return [(name, json.loads(args)) for name, args in parsed]


def check_reader(fmt: str, body: str, tools: Any = None) -> None:
    """The reader's contract at every chunking ``splits`` makes, against the parse of ``body``."""
    want = parse_tool_body(body.strip(), fmt, tools=tools)
    whole = read(fmt, [body], tools)
    for pieces in splits(body):
        got = read(fmt, pieces, tools)
        assert got.key() == whole.key(), f"cut as {[len(p) for p in pieces]}"
    assert whole.names == {k: name for k, (name, _) in enumerate(want) if k < whole.calls}
    for k in range(whole.calls):
        assert want[k][1].startswith(whole.args.get(k, "")), (whole.args.get(k), want[k][1])
        if whole.done[k]:
            assert whole.args[k] == want[k][1]
