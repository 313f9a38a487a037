"""Checks shared by the family tests (``tests/families/test_<family>.py``): a body reader fed
at every chunking against the family's parse of the whole body.

The oracle is the reader's contract (``detok_plugin.families._format.BodyReader``): what was
sent of a call's arguments is a prefix of the parse at the close (``parse_tool_body`` with the
request's tools), all of it once the reader says the call is done, the names are the
parse's, and how the body was cut never changes what was sent.

For a family without a tokenizer here, ``text_reply`` streams a fixture's recorded text,
encoded by another real tokenizer, through the core's chat layer (``ChatStream``): the
family's markers are then text over several tokens (or single tokens where that tokenizer
has them), which tests the tags and the bodies on real ids, not the family's vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from detok_plugin import ChatStream, TagSet, parse_tool_body
from detok_plugin.families import tool_format

__all__ = ["Read", "Reply", "calls_of", "check_reader", "expected_reply", "joined", "read", "splits", "text_reply"]


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


# --- a reply's recorded text through the core's chat layer ---------------------------------


class Reply(NamedTuple):
    """What a client assembles from one reply ("" read as absent, as CanIToolCall reads it)."""

    content: str | None
    reasoning: str | None
    calls: list[tuple[str, Any]]

    def soft(self) -> Reply:
        """CanIToolCall's ``soft-v1``: content and reasoning stripped, blank read as absent."""
        return self._replace(content=(self.content or "").strip() or None, reasoning=(self.reasoning or "").strip() or None)


def expected_reply(fx: dict[str, Any]) -> Reply:
    e = fx["expected"]
    return Reply(e["content"] or None, e["reasoning_content"] or None, [(c["name"], c["arguments"]) for c in e["tool_calls"]])


def text_reply(tokenizer: Any, preset: str, fx: dict[str, Any], prompt: str, *, group: int) -> Reply:
    """``fx``'s recorded text (``raw_output``) encoded by ``tokenizer`` and streamed through a
    ``ChatStream`` with ``preset``'s tags, the request's tools and ``prompt`` (the generation
    prompt), ``group`` ids per step (0: all at once)."""
    ids = tokenizer.encode(fx["raw_output"], add_special_tokens=False)
    chat = ChatStream(
        tokenizer,
        TagSet.preset(preset),
        prompt_ids=tokenizer.encode(prompt, add_special_tokens=False),
        skip_special_tokens=False,
        tools=lambda: fx["tools"],
        new_call_id=lambda name, fmt: f"call_{name}",
    )
    size = group or max(len(ids), 1)
    return joined(chat, [ids[i : i + size] for i in range(0, len(ids), size)] or [[]])


def joined(chat: ChatStream, steps: Sequence[Sequence[int]]) -> Reply:
    """``steps`` through ``chat`` (the last one finishes the reply), their deltas joined as an
    OpenAI client joins them: content, reasoning, and each call's name and arguments by index."""
    content, reasoning = [], []
    calls: dict[int, list[str]] = {}
    for n, step in enumerate(steps):
        fields = chat.message(step, finished=n == len(steps) - 1) or {}
        content.append(fields.get("content") or "")
        reasoning.append(fields.get("reasoning") or "")
        for call in fields.get("tool_calls", ()):
            name, args = calls.setdefault(call["index"], ["", ""])
            fn = call["function"]
            calls[call["index"]] = [name + (fn.get("name") or ""), args + fn.get("arguments", "")]
    got = [(name, json.loads(args)) for name, args in (calls[k] for k in sorted(calls))]
    return Reply("".join(content) or None, "".join(reasoning) or None, got)
