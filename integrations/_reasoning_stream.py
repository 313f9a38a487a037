"""The vLLM detokenizer's stream when the server splits reasoning or tool calls: stops apply
to content only.

vLLM matches stop strings in the detokenizer, before its chat layer splits reasoning from
the answer, so a stop string inside ``<think>`` ends the request with ``content: null``
(vllm-project/vllm#53066). With a detok chat parser (``--reasoning-parser detok_*``,
``integrations/vllm_chat.py``), the parser's ``adjust_request`` writes the reasoning tags
into the request's ``vllm_xargs`` (vLLM's field for plugins; it reaches the detokenizer
as ``SamplingParams.extra_args[REASONING_TAGS_KEY]``). The detokenizer then runs
:class:`ReasoningAwareStream`: the core with those tags, ``reasoning="inline"`` (the tags
and the reasoning stay in the text, so the joined text is the full decode and every
parser downstream still sees the tags it needs) and ``stop_in_reasoning=False`` (a stop
string inside the reasoning block is text, not a stop).

Why a request field and not a server setting: the detokenizer is built per request from
``(tokenizer, EngineCoreRequest)`` only, and the server's parser is chosen per server
while ``vllm_xargs`` travels with each request; the parser that needs the rule is the one
that asks for it, so the two cannot disagree.

Tool calls likewise: with a detok tool parser and a request whose tools are live, the
parser writes the tool tags (``detok_tool_tags``), and the stream runs them with
``tools="inline"``: the tags and bodies stay in the text, and a stop string inside a tool
call's body is part of the call, not a stop (the parser's own core applies none there, so
the two agree on where the reply ends).

This module imports no vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from detok_plugin import DetokenizerState, TagSet, TokenIdError

__all__ = ["REASONING_TAGS_KEY", "TOOL_TAGS_KEY", "ReasoningAwareStream", "stream_tags"]

#: The ``vllm_xargs`` / ``SamplingParams.extra_args`` keys: ``[open_tag, close_tag]``
#: (a tool close tag of ``""``: the body runs to the end, as ``[TOOL_CALLS]``'s).
REASONING_TAGS_KEY = "detok_reasoning_tags"
TOOL_TAGS_KEY = "detok_tool_tags"


def stream_tags(sampling_params: Any) -> TagSet | None:
    """The reasoning and tool tags a detok chat parser asked for on this request, or None."""
    extra = getattr(sampling_params, "extra_args", None)
    if not isinstance(extra, dict):
        return None
    reasoning = _pair(extra.get(REASONING_TAGS_KEY), close_may_be_empty=False)
    tool = _pair(extra.get(TOOL_TAGS_KEY), close_may_be_empty=True)
    if reasoning is None and tool is None:
        return None
    r_open, r_close = reasoning or (None, None)
    t_open, t_close = tool or (None, None)
    return TagSet("detok_chat", r_open, r_close, t_open, t_close or None)


def _pair(value: Any, *, close_may_be_empty: bool) -> tuple[str, str] | None:
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        return None
    if not value[0] or not (value[1] or close_may_be_empty):
        return None
    return value[0], value[1]


class Step(NamedTuple):
    """What a push or finish released: content text (reasoning and its tags inline)."""

    text: str
    finish_reason: str | None
    stop_reason: str | int | None


class ReasoningAwareStream:
    """``ServingStream``'s verbs (``push_text``, ``push``, ``finish``, ``finish_reason``,
    ``stop_reason``, ``token_ids``, ``finished``, ``path``) over a ``DetokenizerState``
    with reasoning and tool tags inline and stops that skip reasoning and tool bodies.

    The joined text is ``decode(prompt + out)[len(decode(prompt)):]``, cut at the first
    stop string that completes *outside* reasoning and tool-call bodies. ``token_ids`` is this stream's own list
    of the ids taken (up to the one that completed a stop).
    """

    __slots__ = ("_state", "token_ids", "finish_reason", "stop_reason", "_on_unknown")

    def __init__(self, state: DetokenizerState, on_unknown_id: Callable[[TokenIdError], None] | None = None) -> None:
        self._state = state
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self._on_unknown = on_unknown_id

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, *, tags: TagSet, on_unknown_id: Callable[[TokenIdError], None] | None = None, **options: Any
    ) -> ReasoningAwareStream:
        """Start a stream; ``options`` are ``DetokenizerState.from_tokenizer``'s (prompt,
        skip flags, stops, ...), as the vLLM adapter passes them to ``ServingStream``."""
        state = DetokenizerState.from_tokenizer(
            tokenizer, tags=tags, reasoning="inline", tools="inline", stop_in_reasoning=False, keep_log=False, **options
        )
        return cls(state, on_unknown_id)

    @property
    def finished(self) -> bool:
        return bool(self._state.finished)

    @property
    def path(self) -> str:
        return str(self._state.path)

    def push_text(self, token_id: int) -> str:
        """Add one id; return the text it released (reasoning included, inline)."""
        state = self._state
        try:
            delta = state.push(token_id)
        except TokenIdError as exc:
            if self._on_unknown is None or state.finished:
                raise
            self._on_unknown(exc)
            self.token_ids.append(token_id)  # counted, rendered as the decode renders it
            return ""
        self.token_ids.append(token_id)
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason
        return str(delta.text)

    def push(self, ids: Sequence[int]) -> Step:
        """Add several ids, one by one, up to a stop."""
        parts = []
        for token_id in ids:
            if self._state.finished:
                break
            parts.append(self.push_text(token_id))
        return Step("".join(parts), self.finish_reason, self.stop_reason)

    def finish(self) -> Step:
        """End the stream: release what is held."""
        text = "" if self._state.finished else self._state.finish().text
        return Step(text, self.finish_reason, self.stop_reason)
