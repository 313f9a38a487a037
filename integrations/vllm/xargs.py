"""The request field by which a ``detok_*`` chat parser tells the detokenizer its tags.

vLLM matches stop strings in the detokenizer, before its chat layer splits reasoning from
the answer, so a stop string inside ``<think>`` ends the request with ``content: null``
(vllm-project/vllm#53066). A detok chat parser's ``adjust_request`` therefore writes the
tags live in a request that has stop strings into its ``vllm_xargs`` (vLLM's field for
plugins; it reaches the detokenizer as ``SamplingParams.extra_args``), and the detokenizer
runs a ``TaggedServingStream`` with them: stops cut outside reasoning and tool bodies only.
Without stop strings the tags would change nothing in the text, so none are written.

Why a request field and not a server setting: the detokenizer is built per request from
``(tokenizer, EngineCoreRequest)`` only, and the server's parser is chosen per server
while ``vllm_xargs`` travels with each request; the parser that needs the rule is the one
that asks for it, so the two cannot disagree.
"""

from __future__ import annotations

from typing import Any

from detok_plugin import TagSet

__all__ = ["REASONING_TAGS_KEY", "TOOL_TAGS_KEY", "stream_tags", "tag_xargs"]

#: The ``vllm_xargs`` / ``SamplingParams.extra_args`` keys: ``[open_tag, close_tag]``
#: (a tool close tag of ``""``: the body runs to the end, as ``[TOOL_CALLS]``'s).
REASONING_TAGS_KEY = "detok_reasoning_tags"
TOOL_TAGS_KEY = "detok_tool_tags"


def tag_xargs(live: TagSet | None) -> dict[str, list[str]]:
    """The ``vllm_xargs`` entries for a request's live tags (none without)."""
    xargs: dict[str, list[str]] = {}
    if live is not None and live.reasoning_open and live.reasoning_close:
        xargs[REASONING_TAGS_KEY] = [live.reasoning_open, live.reasoning_close]
    if live is not None and live.tool_open:
        xargs[TOOL_TAGS_KEY] = [live.tool_open, live.tool_close or ""]
    return xargs


def stream_tags(sampling_params: Any) -> TagSet | None:
    """The reasoning and tool tags a detok chat parser asked for on this request, or None."""
    extra = getattr(sampling_params, "extra_args", None)
    if not isinstance(extra, dict):
        return None
    r, t = extra.get(REASONING_TAGS_KEY), extra.get(TOOL_TAGS_KEY)
    asked = (tuple(r) if type(r) is list else r, tuple(t) if type(t) is list else t)
    try:
        return _SEEN[asked]
    except KeyError:
        pass
    except TypeError:  # not a pair of strings (unhashable): refused, not kept
        return _tags(extra)
    if len(_SEEN) >= 256:  # a server sees one or two; anything past that starts again
        _SEEN.clear()
    got = _SEEN[asked] = _tags(extra)
    return got


#: The tags by what a request asked (one ``TagSet`` per pair of tags, so the stream's
#: configuration is found by identity).
_SEEN: dict[tuple[Any, Any], TagSet | None] = {}


def _tags(extra: dict[str, Any]) -> TagSet | None:
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
