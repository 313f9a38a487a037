"""How the ``detok_*`` parser names plug into vLLM's chat layer.

vLLM 0.32/0.33 compose one unified ``vllm.parser.Parser`` per server from the two names
(``ParserManager._compose_parser``), with no registry for unified parsers.
:func:`register_chat_parsers` therefore (a) registers per preset (``detok_plugin.families``)
a reasoning parser and a tool parser under ``detok_<preset>`` in vLLM's own managers, so the
names pass vLLM's argument checks and the engine core's structured-output gate finds a real
reasoning parser (vLLM's ``BaseThinkingReasoningParser`` over the preset's tags:
:class:`DetokReasoningParser`), and (b) wraps ``_compose_parser`` (through the shared patch
registry) so that names beginning with ``detok`` give :class:`~.chat.DetokChatParser`; every
other name goes to vLLM's own composition, unchanged. Which names exist, and which pair, is
``parser_names``' (which also checks them at vLLM's argument validation).

A tokenizer whose vocabulary lacks the reasoning tags as single tokens (a model that does
not think) is tolerated, as vLLM's own ``qwen3`` parser tolerates it: the server starts,
the detok parser finds the tags in the text, and the structured-output gate, which reads
ids, waits for a reasoning end it cannot see (:class:`DetokReasoningParser`, one line says so).
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from detok_plugin import TagSet, families

from ..common.patches import PATCHES
from . import _framework
from .chat import DetokChatParser, DetokHarmonyParser, DetokToolParser, tokenizer_reasoning_tags
from .parser_names import HARMONY, PREFIX, detok_names, pair_problem

__all__ = [
    "HARMONY", "PREFIX", "DetokReasoningParser", "parser_class", "register_chat_parsers", "unregister_chat_parsers",
]

logger = logging.getLogger("vllm.detok_plugin")

_api = _framework.chat_api()
_Thinking: Any = _api.BaseThinkingReasoningParser


class DetokReasoningParser(_Thinking):  # type: ignore[misc]
    """vLLM's own thinking-token reasoning parser over a preset's tags (``start_token``,
    ``end_token``: class attributes of :func:`_reasoning_class`'s subclasses): what vLLM's
    engine core asks (``is_reasoning_end``) to gate structured outputs, and what its
    ``ReasoningConfig`` builds at start.

    vLLM's base refuses at construction a tokenizer that lacks either tag as a single token
    ("could not locate think start/end tokens"), which stops the server at start; vLLM's
    own ``qwen3`` parser starts on such a tokenizer. So does this one: a tag that is no
    single token has no id (``None``), and the base's id checks then never match it, as
    vLLM's ``qwen3`` engine finds no id either: without the close tag's id, the gate waits
    for a reasoning end it cannot see, and a structured output applies only with
    ``--structured-outputs-config.enable_in_reasoning true``. One line per process says so.
    The detok chat parser itself finds the tags in the text, whatever their tokens.
    """

    start_token: str = ""
    end_token: str = ""

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        vocab = tokenizer.get_vocab() if tokenizer is not None else {}
        # Magistral's are the tags its tokenizer has, as the chat parser reads them.
        self.start_token, self.end_token = tokenizer_reasoning_tags(tokenizer, self.start_token, self.end_token)  # type: ignore[assignment]
        if tokenizer is None or (self.start_token in vocab and self.end_token in vocab):
            super().__init__(tokenizer, *args, **kwargs)  # vLLM's own, unchanged
            return
        # vLLM's ReasoningParser.__init__, without the base's refusal.
        super(_Thinking, self).__init__(tokenizer, *args, **kwargs)
        self.start_token_id = vocab.get(self.start_token)
        self.end_token_id = vocab.get(self.end_token)
        if self.end_token_id is None:
            _text_tags_once(self.end_token)

    def adjust_request(self, request: Any) -> Any:
        """A tag written over several tokens, one of them special (Gemma 4's
        ``<|channel>thought``, Kimi K3's ``<|open|>think<|sep|>``), is seen only in text that
        keeps special tokens: the request keeps them (as vLLM's own ``kimi_k3`` parser
        sets), with or without tools. A tag that is one special token is found by its id."""
        request = super().adjust_request(request)
        if _tags_need_special_tokens(self.model_tokenizer, (self.start_token, self.end_token)):
            request.skip_special_tokens = False
        return request


#: Per tokenizer (by identity, kept alive with its entry) and tags: whether some tag holds a
#: special token's text but is not that token alone.
_NEEDS_SPECIALS: dict[tuple[int, tuple[str, str]], tuple[Any, bool]] = {}


def _tags_need_special_tokens(tokenizer: Any, tags: tuple[str, str]) -> bool:
    key = (id(tokenizer), tags)
    got = _NEEDS_SPECIALS.get(key)
    if got is not None and got[0] is tokenizer:
        return got[1]
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    specials = {t.content for t in added.values() if getattr(t, "special", False)}
    needs = any(tag != s and s in tag for tag in tags if tag for s in specials)
    if len(_NEEDS_SPECIALS) >= 64:
        _NEEDS_SPECIALS.clear()
    _NEEDS_SPECIALS[key] = (tokenizer, needs)
    return needs


_said_text_tags: set[str] = set()


def _text_tags_once(close_tag: str) -> None:
    if close_tag in _said_text_tags:
        return
    _said_text_tags.add(close_tag)
    logger.warning(
        "detok-plugin: %r is not a single token of this tokenizer: the detok parser finds it in the text, "
        "but vLLM's structured-output gate reads ids and waits for a reasoning end it cannot see (as "
        "vLLM's own qwen3 parser does here); pass --structured-outputs-config.enable_in_reasoning true "
        "for structured outputs",
        close_tag,
    )


@functools.cache
def _reasoning_class(open_tag: str, close_tag: str) -> type:
    """:class:`DetokReasoningParser` over these tags."""
    return type(
        "DetokReasoningParser",
        (DetokReasoningParser,),
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


def _compose(args: dict[str, Any]) -> Any:
    """ParserManager._compose_parser for detok names (``args``: its arguments by name); None
    if neither name is ours."""
    r_name, t_name = args.get("reasoning_parser_name"), args.get("tool_parser_name")
    # Keyed by the families' registry entries too: a family registered again is composed again.
    return _composed(r_name, t_name, bool(args.get("enable_auto_tools")), _registered(r_name), _registered(t_name))


def _registered(name: str | None) -> Any:
    """The registry entry (``families.preset``) of a detok name's preset, or None."""
    if not name or not name.startswith(PREFIX):
        return None
    try:
        return families.preset(name[len(PREFIX) :])
    except ValueError:
        return None


@functools.lru_cache(maxsize=64)  # a server composes one pair; a refused pair raises, uncached
def _composed(r_name: str | None, t_name: str | None, auto_tools: bool, *entries: Any) -> Any:
    problem = pair_problem(r_name, t_name)  # also checked at vLLM's argument validation (parser_names)
    if problem is not None:
        raise TypeError(problem)
    if HARMONY in (r_name, t_name):
        return _harmony_class(r_name == HARMONY, auto_tools and t_name == HARMONY)
    r_tags, t_tags = _preset(r_name), _preset(t_name)
    if r_tags is None and t_tags is None:
        return None
    tools = auto_tools and t_tags is not None
    reasoning = r_tags is not None
    if not tools and not reasoning:
        return None
    r, t = r_tags or t_tags, t_tags or r_tags
    assert r is not None and t is not None
    tags = TagSet(
        r.name if r == t else f"{r.name}+{t.name}",
        r.reasoning_open, r.reasoning_close, t.tool_open, t.tool_close, t.tool_format, t.tool_bare, t.bare_at_start,
        t.tool_ends_reasoning,  # what the model that writes the calls does inside its reasoning
    )
    return parser_class(tags, reasoning, tools)


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


@functools.lru_cache(maxsize=4)
def _signature(fn: Any) -> inspect.Signature:
    return inspect.signature(fn)


def _wrapped_compose(cls: Any, *args: Any, **kwargs: Any) -> Any:
    stock = PATCHES.stock(_api.ParserManager, "_compose_parser").__func__
    # ``get_parser`` passes every argument by name; any other caller's are bound to the
    # stock signature (a signature costs ~0.3 ms to read, so it is kept).
    named = _signature(stock).bind(cls, *args, **kwargs).arguments if args else kwargs
    ours = _compose(named)
    return ours if ours is not None else stock(cls, *args, **kwargs)


#: What we install (one object, so that the registry can tell it).
_OURS = classmethod(_wrapped_compose)


def register_chat_parsers() -> list[str]:
    """Register the ``detok_*`` parsers (``parser_names.detok_names``) and wrap
    ``_compose_parser``; safe to repeat. Returns why not (logged) when the installed vLLM
    does not fit, else []."""
    problems = _framework.chat_problems(_wrapped_compose)
    if problems:
        logger.error("detok-plugin: chat parsers NOT registered: %s", "; ".join(problems))
        return problems
    reasoning, tools = detok_names()
    for name in sorted(tools - {HARMONY}):
        _api.ToolParserManager.register_module(name, force=True, module=DetokToolParser)
    for name in sorted(reasoning - {HARMONY}):
        tags = TagSet.preset(name[len(PREFIX) :])
        assert tags.reasoning_open and tags.reasoning_close
        cls = _reasoning_class(tags.reasoning_open, tags.reasoning_close)
        _api.ReasoningParserManager.register_module(name, force=True, module=cls)
    _api.ToolParserManager.register_module(HARMONY, force=True, module=DetokToolParser)
    _api.ReasoningParserManager.register_module(HARMONY, force=True, module=_api.GptOssReasoningParser)
    with PATCHES.lock:
        if not PATCHES.is_ours(_api.ParserManager, "_compose_parser"):
            PATCHES.install(_api.ParserManager, "_compose_parser", _OURS)
    return []


def unregister_chat_parsers() -> None:
    """Put vLLM's ``_compose_parser`` back (the registered names stay, inert)."""
    PATCHES.uninstall(_api.ParserManager, "_compose_parser")
