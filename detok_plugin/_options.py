"""``StreamConfig``: what a stream's options fix at construction, built once per options.

A stream keeps only what changes per token (``_state``) and its request's two numbers
(``min_tokens``, ``max_tokens``, which differ per request); everything else its options
decide (the stop token ids, the patterns live in each channel and their automata) is one
frozen object, cached, so every request with the same options shares it and a request with
options never seen before pays for one build.

Channels: content, reasoning and tool bodies each have their own patterns, because what
may be matched depends on where the text is (a stop does not apply inside reasoning unless
asked, vllm-project/vllm#53066; inside a tool body only its close tag does).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from ._delta import CONTENT, REASONING, TOOL, Reasoning, Tools
from ._matcher import Matcher
from ._opening import Opened, open_decoder
from ._tables import TokenTable
from ._tags import TagSet

__all__ = ["Pattern", "StreamConfig", "check_limits", "forget", "id_tags", "open_with_config", "stream_config"]

PatternKind = Literal["stop", "r_open", "r_close", "t_open", "t_close", "t_bare"]


class Pattern(NamedTuple):
    """One string a channel's automaton looks for: a stop, or a reasoning/tool tag."""

    kind: PatternKind
    text: str


class StreamConfig(NamedTuple):
    """The options of a stream, resolved. Shared by every stream with the same options.

    A ``NamedTuple``: built once per options never seen before, on the path of opening a
    request, where a frozen dataclass's ``__init__`` costs ten times a tuple's."""

    #: Stop token ids and EOS ids: the ids that end the stream.
    stop_ids: frozenset[int]
    #: The EOS ids among them (``stop_reason`` is None for these, the id for the others).
    eos_ids: frozenset[int]
    include_stop: bool
    tags: TagSet | None
    reasoning: Reasoning
    tools: Tools
    #: Per channel (content, reasoning, tool): the patterns live in it, in list order.
    patterns: tuple[tuple[Pattern, ...], ...]
    #: Per channel: the automaton over its patterns, or None when it has none.
    matchers: tuple[Matcher | None, ...]
    #: Per channel: whether a stop string is among its patterns.
    has_stops: tuple[bool, ...]
    #: Whether a stop string contains U+FFFD (then held text that would render as U+FFFD
    #: can complete a stop, and must be checked).
    fffd_stops: bool


@functools.lru_cache(maxsize=1024)
def stream_config(
    stops: tuple[str, ...],
    stop_ids: frozenset[int],
    eos_ids: frozenset[int],
    include_stop: bool,
    tags: TagSet | None,
    reasoning: Reasoning,
    stop_in_reasoning: bool,
    tools: Tools = "separate",
) -> StreamConfig:
    """The shared :class:`StreamConfig` for these options (``stop_ids`` includes EOS)."""
    patterns = _channel_patterns(stops, tags, stop_in_reasoning)
    # A stop kept in the output need not be held: its characters leave either way.
    matchers = tuple(
        Matcher.build(tuple([p.text for p in ps]), tuple([not (p.kind == "stop" and include_stop) for p in ps]))
        if ps
        else None
        for ps in patterns
    )
    return StreamConfig(
        stop_ids=stop_ids,
        eos_ids=eos_ids,
        include_stop=include_stop,
        tags=tags,
        reasoning=reasoning,
        tools=tools,
        patterns=patterns,
        matchers=matchers,
        # Stops come first in every channel's patterns (_channel_patterns).
        has_stops=tuple([bool(ps) and ps[0].kind == "stop" for ps in patterns]),
        fffd_stops=any("\ufffd" in s for s in stops),
    )


def _channel_patterns(
    stops: tuple[str, ...], tags: TagSet | None, stop_in_reasoning: bool
) -> tuple[tuple[Pattern, ...], ...]:
    """Per channel, the patterns live in it. Stops come first: for equal ends the first
    listed wins (``Matcher.match``), as vLLM's ``check_stop_strings`` ranks stops."""
    content = [Pattern("stop", s) for s in stops]
    reasoning = list(content) if stop_in_reasoning else []
    tool: list[Pattern] = []
    if tags is not None:
        if tags.reasoning_open and tags.reasoning_close:
            content += [Pattern("r_open", tags.reasoning_open), Pattern("r_close", tags.reasoning_close)]
            reasoning.append(Pattern("r_close", tags.reasoning_close))
        if tags.tool_open:
            content.append(Pattern("t_open", tags.tool_open))
            if tags.tool_ends_reasoning and tags.reasoning_close:  # a call in an unclosed <think>
                reasoning.append(Pattern("t_open", tags.tool_open))
            if tags.tool_bare:  # a body opened without the tag: its text stays in the body
                content.append(Pattern("t_bare", tags.tool_bare))
            if tags.tool_close:
                tool.append(Pattern("t_close", tags.tool_close))
    result = [(), (), ()]  # type: list[tuple[Pattern, ...]]
    result[CONTENT], result[REASONING], result[TOOL] = tuple(content), tuple(reasoning), tuple(tool)
    return tuple(result)


def id_tags(table: TokenTable, tags: TagSet) -> Mapping[int, Pattern]:
    """Tag tokens whose text the decode drops (special tokens under skip_special_tokens):
    the stream recognises them by id."""
    by_text = table.special_ids_by_text
    found: dict[int, Pattern] = {}
    for kind, text in (
        ("r_open", tags.reasoning_open),
        ("r_close", tags.reasoning_close),
        ("t_open", tags.tool_open),
        ("t_close", tags.tool_close),
    ):
        if text and text in by_text:
            found[by_text[text]] = Pattern(kind, text)  # type: ignore[arg-type]
    return found


def forget() -> None:
    """Drop what streams have learnt: the cached configurations and stop automata, and
    with them their scan memos (``Matcher.steps``, the one table filled in as streams run).
    Running streams go on exactly with what they hold; the next ones build theirs again."""
    stream_config.cache_clear()
    _configs.clear()
    Matcher.build.cache_clear()


def check_limits(min_tokens: int, max_tokens: int | None) -> None:
    """Refuse limits no request can mean, as vLLM's ``SamplingParams`` refuses them (a
    stream with ``max_tokens=0`` took one id before it could end). ``min_tokens`` above
    ``max_tokens`` means something: ``max_tokens`` ends the stream before any stop counts."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if min_tokens < 0:
        raise ValueError(f"min_tokens must be at least 0, got {min_tokens}")


def open_with_config(
    tokenizer: Any,
    prompt_ids: Sequence[int],
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
    stop: str | Iterable[str] | None,
    stop_token_ids: Iterable[int] | None,
    eos_token_ids: Iterable[int] | None,
    include_stop: bool,
    limits: tuple[int, int | None],
    request_id: str | None,
    channels: tuple[TagSet | None, Reasoning, bool, Tools] = (None, "separate", False, "separate"),
) -> tuple[Opened, StreamConfig]:
    """A new stream's decoder on the prompt and its shared configuration, the limits
    checked: what every stream opens with. ``eos_token_ids`` None means the tokenizer's
    own; ``channels`` are the tags, ``reasoning``, ``stop_in_reasoning`` and ``tools``."""
    if limits != _NO_LIMITS:
        check_limits(*limits)
    opened = open_decoder(tokenizer, prompt_ids, skip_special_tokens, spaces_between_special_tokens, request_id)
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    stop_ids = tuple(stop_token_ids or ())
    eos_ids = None if eos_token_ids is None else tuple(eos_token_ids)
    key = (stops, stop_ids, opened.eos_token_ids if eos_ids is None else eos_ids, include_stop, channels)
    cfg = _configs.get(key)
    if cfg is None:
        eos = frozenset(key[2])
        tags, reasoning, stop_in_reasoning, tools = channels
        cfg = stream_config(stops, frozenset(stop_ids) | eos, eos, include_stop, tags, reasoning, stop_in_reasoning, tools)
        if len(_configs) >= 1024:  # options never seen before, request after request
            _configs.clear()
        _configs[key] = cfg
    return opened, cfg


_NO_LIMITS = (0, None)  # min_tokens, max_tokens unset: nothing to check

# stream_config by the options as a request gives them (tuples, not yet sets): one lookup.
_configs: dict[tuple[Any, ...], StreamConfig] = {}
