"""How the ``detok_*`` parser names plug into vLLM's chat layer.

vLLM 0.32/0.33 compose one unified ``vllm.parser.Parser`` per server from the two names
(``ParserManager._compose_parser``), with no registry for unified parsers.
:func:`register_chat_parsers` therefore (a) registers per preset (``detok_plugin.families``)
a reasoning parser and a tool parser under ``detok_<preset>`` in vLLM's own managers, so the
names pass vLLM's argument checks and the engine core's structured-output gate finds a real
reasoning parser (vLLM's ``BaseThinkingReasoningParser`` over the preset's tags), and (b)
wraps ``_compose_parser`` (through the shared patch registry) so that names beginning with
``detok`` give :class:`~.chat.DetokChatParser`; every other name goes to vLLM's own
composition, unchanged.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from detok_plugin import TagSet

from ..common.patches import PATCHES
from . import _framework
from .chat import DetokChatParser, DetokHarmonyParser, DetokToolParser

__all__ = ["HARMONY", "PREFIX", "parser_class", "register_chat_parsers", "unregister_chat_parsers"]

logger = logging.getLogger("vllm.detok_plugin")

_api = _framework.chat_api()

#: Every parser name this module registers begins with it.
PREFIX = "detok_"

#: gpt-oss's parser name: harmony, read by ``harmony.HarmonyChannels`` (not a core preset).
HARMONY = PREFIX + "gpt_oss"


@functools.cache
def _reasoning_class(open_tag: str, close_tag: str) -> type:
    """vLLM's own thinking-token reasoning parser over these tags: what vLLM's engine core
    asks (``is_reasoning_end``) to gate structured outputs."""
    return type(
        "DetokReasoningParser",
        (_api.BaseThinkingReasoningParser,),
        {"start_token": open_tag, "end_token": close_tag, "__module__": "detok_plugin.integrations.vllm.chat"},
    )


@functools.cache
def parser_class(tags: TagSet, reasoning: bool, tools: bool) -> type[DetokChatParser]:
    """The unified parser for ``tags``, with a reasoning half and/or a tool half."""
    return type(
        f"DetokChatParser_{tags.name}",
        (DetokChatParser,),
        {
            "tags": tags,
            "reasoning_parser_cls": _reasoning_class(tags.reasoning_open, tags.reasoning_close)
            if reasoning and tags.reasoning_open and tags.reasoning_close
            else None,
            "tool_parser_cls": DetokToolParser if tools else None,
            "__module__": "detok_plugin.integrations.vllm.chat",
        },
    )


def _preset(name: str | None) -> TagSet | None:
    if not name or not name.startswith(PREFIX):
        return None
    return TagSet.preset(name[len(PREFIX) :])


def _compose(cls: Any, bound: inspect.BoundArguments) -> Any:
    """ParserManager._compose_parser for detok names; None if neither name is ours."""
    args = bound.arguments
    r_name, t_name = args.get("reasoning_parser_name"), args.get("tool_parser_name")
    if HARMONY in (r_name, t_name):
        return _harmony_compose(r_name, t_name, bool(args.get("enable_auto_tools")))
    r_tags, t_tags = _preset(r_name), _preset(t_name)
    if r_tags is None and t_tags is None:
        return None
    if (r_name and r_tags is None) or (t_name and t_tags is None):
        raise TypeError(
            f"--reasoning-parser {r_name} and --tool-call-parser {t_name}: a detok parser pairs only "
            f"with another detok parser (e.g. --reasoning-parser detok_qwen3 --tool-call-parser detok_qwen3)"
        )
    tools = bool(args.get("enable_auto_tools")) and t_tags is not None
    reasoning = r_tags is not None
    if not tools and not reasoning:
        return None
    r, t = r_tags or t_tags, t_tags or r_tags
    assert r is not None and t is not None
    tags = TagSet(
        r.name if r == t else f"{r.name}+{t.name}",
        r.reasoning_open, r.reasoning_close, t.tool_open, t.tool_close, t.tool_format,
    )
    return parser_class(tags, reasoning, tools)


def _harmony_compose(r_name: str | None, t_name: str | None, auto_tools: bool) -> type[DetokChatParser] | None:
    for name in (r_name, t_name):
        if name and name != HARMONY:
            raise TypeError(f"{HARMONY} pairs only with itself (--reasoning-parser {HARMONY} --tool-call-parser {HARMONY})")
    return _harmony_class(r_name == HARMONY, auto_tools and t_name == HARMONY)


@functools.cache
def _harmony_class(reasoning: bool, tools: bool) -> type[DetokChatParser]:
    """The harmony parser with vLLM's own ``GptOssReasoningParser`` as its reasoning half
    (what the engine core asks), and/or the tool half."""
    return type(
        "DetokHarmonyParser_gpt_oss",
        (DetokHarmonyParser,),
        {
            "reasoning_parser_cls": _api.GptOssReasoningParser if reasoning else None,
            "tool_parser_cls": DetokToolParser if tools else None,
            "__module__": "detok_plugin.integrations.vllm.chat",
        },
    )


def _wrapped_compose(cls: Any, *args: Any, **kwargs: Any) -> Any:
    stock = PATCHES.stock(_api.ParserManager, "_compose_parser").__func__
    bound = inspect.signature(stock).bind(cls, *args, **kwargs)
    ours = _compose(cls, bound)
    return ours if ours is not None else stock(cls, *args, **kwargs)


#: What we install (one object, so that the registry can tell it).
_OURS = classmethod(_wrapped_compose)


def register_chat_parsers() -> bool:
    """Register ``detok_<preset>`` parsers and wrap ``_compose_parser``; safe to repeat.
    Returns False (and logs why) when the installed vLLM does not fit."""
    problems = _framework.chat_problems(_wrapped_compose)
    if problems:
        logger.error("detok-plugin: chat parsers NOT registered: %s", "; ".join(problems))
        return False
    for name in TagSet.presets():
        tags = TagSet.preset(name)
        if tags.tool_open:
            _api.ToolParserManager.register_module(PREFIX + name, force=True, module=DetokToolParser)
        if tags.reasoning_open and tags.reasoning_close:
            cls = _reasoning_class(tags.reasoning_open, tags.reasoning_close)
            _api.ReasoningParserManager.register_module(PREFIX + name, force=True, module=cls)
    _api.ToolParserManager.register_module(HARMONY, force=True, module=DetokToolParser)
    _api.ReasoningParserManager.register_module(HARMONY, force=True, module=_api.GptOssReasoningParser)
    with PATCHES.lock:
        if not PATCHES.is_ours(_api.ParserManager, "_compose_parser"):
            PATCHES.install(_api.ParserManager, "_compose_parser", _OURS)
    return True


def unregister_chat_parsers() -> None:
    """Put vLLM's ``_compose_parser`` back (the registered names stay, inert)."""
    PATCHES.uninstall(_api.ParserManager, "_compose_parser")
