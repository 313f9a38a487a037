"""One chat delta's pieces (:class:`ChatParts`) as ``ChatStream`` gathers them, and the
records it passes between its steps.

A tool call is the dict OpenAI's ``tool_calls`` delta item is (``detok_plugin._chat``'s module
docstring names its fields); the pieces of one call in one delta merge into one dict.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from ._errors import TokenIdError

__all__ = ["Call", "ChatParts", "Fields", "Merged", "push_skipping_unknown"]

#: One chat delta's fields (``reasoning``, ``content``, ``tool_calls``), as OpenAI names them.
Fields = dict[str, Any]


class ChatParts:
    """One delta's pieces; tool-call pieces of one call merge into one tool-call dict (the
    fields the module docstring names)."""

    __slots__ = ("reasoning", "content", "tools")

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}

    def tool(self, index: int, *, id: str | None = None, name: str | None = None, args: str = "") -> None:
        call = self.tools.get(index)
        if call is None:
            call = self.tools[index] = {"index": index, "function": {}}
            if name is not None:
                call.update(id=id, type="function")
                call["function"]["name"] = name
        if args:
            fn = call["function"]
            fn["arguments"] = fn.get("arguments", "") + args

    def fields(self, include_reasoning: bool = True) -> Fields | None:
        """The delta's fields, or None when it has none."""
        fields: Fields = {}
        if self.reasoning and include_reasoning:
            fields["reasoning"] = "".join(self.reasoning)
        if self.content:
            fields["content"] = "".join(self.content)
        if self.tools:
            fields["tool_calls"] = list(self.tools.values())
        return fields or None


class Call(NamedTuple):
    """A complete call's name and arguments, typed by the request's schema."""

    name: str
    arguments: str


class Merged:
    """A Delta's three channels, for ids pushed one by one."""

    __slots__ = ("text", "reasoning", "tool_calls")

    def __init__(self, text: str, reasoning: str, tool_calls: tuple[Any, ...]) -> None:
        self.text, self.reasoning, self.tool_calls = text, reasoning, tool_calls


def push_skipping_unknown(state: Any, ids: Sequence[int], log: logging.Logger) -> Merged:
    """``state.push(ids)`` one id at a time, an id the tokenizer does not know (a padded
    vocabulary) skipped and logged, as the decode skips it: the pushes' Deltas merged."""
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[Any] = []
    for tid in ids:
        if state.finished:
            break
        try:
            d = state.push(tid)
        except TokenIdError as exc:
            log.warning("detok-plugin: %s; the chat parser skips it", exc)
            continue
        text.append(d.text)
        reasoning.append(d.reasoning)
        calls.extend(d.tool_calls)
    return Merged("".join(text), "".join(reasoning), tuple(calls))
