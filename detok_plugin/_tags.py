"""Reasoning and tool-call markers (:class:`TagSet`) and a tool call's part of a Delta
(:class:`ToolCall`).

A :class:`TagSet` names the markers one model family writes and its tool-call format. The
presets and formats live one module per family in ``detok_plugin.families`` (its module
docstring has the table); ``TagSet.preset(name)`` reads them.

``[TOOL_CALLS]``, ``[THINK]``, ``[/THINK]`` and ``<|python_tag|>`` are control tokens that
``skip_special_tokens=True`` removes from the text, so the stream also recognises them by
token id.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from . import families

__all__ = ["TagSet", "ToolCall", "live_tags"]


@dataclass(frozen=True, slots=True)
class TagSet:
    """The markers of one model family. ``tool_close=None`` means the body runs to the end.

    ``tool_bare``: text that opens a body without ``tool_open`` and stays part of it
    (``Preset.bare_open``); ``bare_at_start``: only before any other text of the reply;
    ``tool_ends_reasoning``: ``tool_open`` inside reasoning ends it and opens a body
    (``Preset.tool_ends_reasoning``), else it is text of the reasoning.
    """

    name: str = "custom"
    reasoning_open: str | None = None
    reasoning_close: str | None = None
    tool_open: str | None = None
    tool_close: str | None = None
    tool_format: str = "hermes"  # a name in detok_plugin.families
    tool_bare: str | None = None
    bare_at_start: bool = False
    tool_ends_reasoning: bool = False

    @classmethod
    def preset(cls, name: str) -> TagSet:
        """The markers of a registered family's preset (``detok_plugin.families``)."""
        p, fmt = families.preset(name)
        return cls(
            p.name, p.reasoning_open, p.reasoning_close, p.tool_open, p.tool_close, fmt.name, p.bare_open, p.bare_at_start, p.tool_ends_reasoning
        )

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        return families.preset_names()


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call's part of a Delta.

    ``text`` is body text streamed in this delta. At the closing tag (or the end of the
    stream, for formats without one) a delta carries ``complete=True`` and either the
    parsed ``name`` and ``arguments`` (a JSON string, as OpenAI's API sends it) or
    ``error``: a malformed body is reported, never dropped. ``unterminated``: the error is
    that the stream ended inside the body (the model never finished it).
    """

    index: int
    text: str = ""
    name: str | None = None
    arguments: str | None = None
    complete: bool = False
    error: str | None = None
    unterminated: bool = False


@functools.cache
def live_tags(tags: TagSet, reasoning: bool, tools: bool) -> TagSet | None:
    """``tags`` with the halves not live in a request left out (one TagSet per combination;
    None when neither is): a reasoning half where the server splits reasoning, a tool half
    where it reads tool calls and the request has tools it did not switch off."""
    if not reasoning and not tools:
        return None
    key = (id(tags), reasoning, tools)
    kept = _LIVE.get(key)
    if kept is not None and kept[0] is tags:  # the entry keeps ``tags``: the id is still its
        return kept[1]
    if len(_LIVE) >= 256:  # a server has a few parsers; past that, start again
        _LIVE.clear()
    live = _live(tags, reasoning, tools)
    _LIVE[key] = (tags, live)
    return live


#: ``live_tags`` by (``id(tags)``, reasoning, tools): the same TagSet object for a parser's
#: every request, so that the stream's configuration is found by identity.
_LIVE: dict[tuple[int, bool, bool], tuple[TagSet, TagSet]] = {}


def _live(tags: TagSet, reasoning: bool, tools: bool) -> TagSet:
    return TagSet(
        tags.name,
        tags.reasoning_open if reasoning else None,
        tags.reasoning_close if reasoning else None,
        tags.tool_open if tools else None,
        tags.tool_close if tools else None,
        tags.tool_format,
        tags.tool_bare if tools else None,
        tags.bare_at_start,
        tags.tool_ends_reasoning and reasoning and tools,
    )
