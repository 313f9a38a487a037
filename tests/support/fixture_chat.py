"""A CanIToolCall fixture's token ids through the core's chat layer (``ChatStream``), as a
server streams them: grouped by each of the suite's default chunking strategies
(``canitoolcall.chunking``, stdlib only) and once without streaming.

What comes back is what a client would assemble: the content and reasoning joined, and each
call's name and arguments (the arguments read back as JSON, so ``3`` is not ``"3"``). A
family test compares it with the fixture's ``expected``; nothing here knows a family.
"""

from __future__ import annotations

import json
from typing import Any

from canitoolcall.chunking import DEFAULT_STRATEGIES, split
from family_checks import Reply, expected_reply, joined

from detok_plugin import ChatStream, TagSet

__all__ = ["STRATEGIES", "Reply", "expected_reply", "replay"]

#: The suite's default strategies by id (``one``, ``special``, ``token``, ``rand:1:8`` ...),
#: and ``nonstream``: the reply returned whole.
STRATEGIES = ("nonstream", *(s.id for s in DEFAULT_STRATEGIES))


def replay(tokenizer: Any, preset: str, fx: dict[str, Any], strategy: str, *, skip_special_tokens: bool = True) -> Reply:
    """``fx``'s output ids through a ``ChatStream`` with ``preset``'s tags, the request's
    tools and the fixture's generation prompt, grouped by ``strategy`` (``STRATEGIES``)."""
    ids = list(fx["output_token_ids"])
    prompt = tokenizer.encode(fx.get("generation_prompt") or "", add_special_tokens=False)
    streaming = strategy != "nonstream"
    chat = ChatStream(
        tokenizer,
        TagSet.preset(preset),
        prompt_ids=prompt,
        skip_special_tokens=skip_special_tokens,
        tools=lambda: fx["tools"],
        new_call_id=lambda name, fmt: f"call_{name}",
        streaming=streaming,
    )
    if not streaming:
        fields = chat.message(ids, finished=True) or {}
        return Reply(fields.get("content") or None, fields.get("reasoning") or None, _read(chat.complete))
    [chosen] = [s for s in DEFAULT_STRATEGIES if s.id == strategy]
    return joined(chat, split(ids, chosen, _special_ids(tokenizer)))


_SPECIAL: dict[int, tuple[Any, frozenset[int]]] = {}


def _special_ids(tokenizer: Any) -> frozenset[int]:
    """The tokenizer's special ids (the ``special`` strategy's cuts), read once per tokenizer."""
    known = _SPECIAL.get(id(tokenizer))
    if known is None or known[0] is not tokenizer:
        known = _SPECIAL[id(tokenizer)] = (
            tokenizer,
            frozenset(i for i, t in tokenizer.added_tokens_decoder.items() if t.special),
        )
    return known[1]


def _read(calls: list[Any]) -> list[tuple[str, Any]]:
    return [(name, json.loads(args)) for name, args in calls]
