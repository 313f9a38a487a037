"""Tool-call ids, as vLLM's own parsers make them."""

from __future__ import annotations

from typing import Any

from detok_plugin import families

from . import _framework

__all__ = ["call_counter", "new_call_id"]


def call_counter(parser: Any) -> Any:
    """Where vLLM counts a parser's tool calls: the ``Parser`` base's stream state. What
    makes ids for a request's stream holds this, not the parser, which holds that stream:
    no reference cycle, so a finished request is freed when vLLM drops it."""
    return parser._stream_state  # the vLLM Parser base's own state


def new_call_id(state: Any, name: str, fmt: families.ToolFormat | None = None) -> str:
    """A tool-call id for ``name`` (the family's own kind where its template accepts no
    other, ``ToolFormat.call_id``), counted in ``state`` (:func:`call_counter`) as vLLM
    counts it."""
    if fmt is not None and fmt.call_id is not None:
        tool_id = fmt.call_id()
    else:
        make = _framework.chat_api().make_tool_call_id
        tool_id = make(id_type=state.tool_call_id_type, func_name=name, idx=state.history_tool_call_cnt)
    state.history_tool_call_cnt += 1
    return str(tool_id)
