"""What one model family's tool-call format is, as data: its markers, the parse of a finished
body, the reader of a body as it streams, and what a server must know of it.

A family module (``hermes.py``, ``kimi_k2.py``, ...) builds one :class:`Family`; the
registry (``families/__init__.py``) lists them. Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

__all__ = ["BodyReader", "Event", "Family", "Preset", "ToolFormat", "Tools", "markers_count"]

#: One thing a reader makes safe to send: (call number within the body, the call's name
#: when it is first known, a piece of its ``arguments`` JSON).
Event = tuple[int, "str | None", str]

#: OpenAI's request field ``tools``, as plain dicts (the XML formats type values by it).
Tools: TypeAlias = "Sequence[Mapping[str, Any]] | None"


class BodyReader(Protocol):
    """One tool-call body, fed as the core streams it.

    ``feed(text)`` returns the events that text makes safe to send; ``calls`` is how many
    calls have had their name sent, ``args[k]`` what was sent of call k's arguments and
    ``done[k]`` whether all of it. What was sent is always a prefix of the finished parse.
    """

    calls: int
    done: list[bool]

    @property
    def args(self) -> list[str]: ...

    def feed(self, text: str) -> list[Event]: ...


def markers_count(body: str) -> bool:
    """A format's ``marker_is_text`` where no text position is known: every marker counts."""
    return False


@dataclass(frozen=True, slots=True)
class Preset:
    """The markers one model family writes; ``tool_close=None``: a body runs to the end.

    ``bare_open``: text that opens a body without ``tool_open`` and stays part of it, for a
    model that leaves the opener out (Qwen3-Coder's ``<function=``, Llama 3's JSON call
    written without ``<|python_tag|>``); ``bare_at_start``: only where nothing but
    whitespace came before it in the reply (a JSON answer later in a reply is text).
    ``tool_ends_reasoning``: a ``tool_open`` inside reasoning ends the reasoning and opens a
    body, for a family whose model writes its call in a ``<think>`` it never closed (Qwen3.5,
    llama.cpp's ``test-chat``); elsewhere a marker inside reasoning is text of it (Magistral
    thinks about ``[TOOL_CALLS]`` between ``[THINK]`` tags).
    """

    name: str
    reasoning_open: str | None
    reasoning_close: str | None
    tool_open: str | None
    tool_close: str | None
    bare_open: str | None = None
    bare_at_start: bool = False
    tool_ends_reasoning: bool = False


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """A tool-call body format.

    ``parse(body, tools)`` reads a finished body into ``[(name, arguments_json), ...]`` and
    raises ``ValueError`` on a malformed one; ``reader(tools)`` makes a :class:`BodyReader`.
    ``typed_by_schema``: values are text until the request's tool schemas type them (the
    XML formats). ``keeps_special_tokens``: the body's markers are special tokens, so a
    request with tools must keep special tokens in its text. ``call_id``: makes the only
    tool-call ids the family's chat template accepts back; None: any id (the server's own).

    ``marker_is_text(body)``: whether a marker that starts right after ``body`` (the body's
    text so far) is text of a value, not a marker: inside a JSON string, or inside an XML
    parameter value. It is the one boundary rule for markers in bodies: the core asks it
    before a tool close tag ends a body, and the finished parse and the readers split a
    body by it.
    ``call_close``: the marker that ends one call of a body of several (DeepSeek's
    ``<｜tool▁call▁end｜>``); a reply cut inside a body keeps the calls finished before it.
    """

    name: str
    parse: Callable[[str, Tools], list[tuple[str, str]]]
    reader: Callable[[Tools], BodyReader]
    typed_by_schema: bool = False
    keeps_special_tokens: bool = False
    call_id: Callable[[], str] | None = None
    marker_is_text: Callable[[str], bool] = markers_count
    call_close: str | None = None


@dataclass(frozen=True, slots=True)
class Family:
    """One family module's whole contribution: its format and the presets that use it."""

    format: ToolFormat
    presets: tuple[Preset, ...]
