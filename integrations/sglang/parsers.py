"""SGLang's chat parsers fed by the core: ``--tool-call-parser detok_<name>`` and
``--reasoning-parser detok_<name>``.

SGLang's OpenAI server splits a reply in two stages, each over text: a reasoning detector
(``ReasoningParser.DetectorMap``) turns the detokenizer's text deltas into reasoning and
normal text, and a tool-call detector (``FunctionCallParser.ToolCallParserEnum``) turns
the normal text into content and tool calls. :func:`install` registers, for each SGLang
name whose format the core has (:data:`TOOL_PRESETS`, :data:`REASONING_PRESETS`), one
detector under ``detok_<name>`` beside SGLang's own, so a server switches by one prefix
(``--tool-call-parser detok_qwen25 --reasoning-parser detok_qwen3``):

1. each detok detector is a subclass of SGLang's own detector of that name, with its
   parsing methods (``detect_and_parse``, ``parse_streaming_increment``, ``finish``, and
   ``has_tool_call`` for tool calls) fed by the core; what SGLang asks of a detector
   besides parsing (structural tags for constrained decoding, ``structure_info``, the
   required-tool parser, the think tokens for history) stays the stock one's;
2. SGLang hands detectors text, not ids: the core reads each text delta as its UTF-8
   bytes, the ids of :data:`TEXT_BYTES` (a byte-level table of the 256 bytes), so a marker
   split over any number of deltas, a character split inside one, and the text between
   them are what the core sees in a token stream (the chunking is SGLang's detokenizer's);
3. the reasoning stage (:class:`DetokReasoningDetector`) is a ``DetokenizerState`` with the
   preset's reasoning tags and, where a tool parser is active, its tool tags inline: a tool
   call's body passes to the tool stage whole, a ``<think>`` inside an argument is text;
   the tool stage (:class:`DetokToolDetector`) is a :class:`~detok_plugin.ChatStream` with
   the tool tags: a call goes out once the model has finished it, whole, and a call cut
   short (``max_tokens``) is never sent. Whitespace at a segment's edges is markup.

Limits: gpt-oss (harmony) is not offered (its channels are read by id in the vLLM shim);
a call's id is SGLang's (``_process_tool_call_id`` gives Kimi's ``functions.NAME:IDX`` ids
only under the stock names); a reasoning parser is given no tool parser name, so the
reasoning stage ends reasoning at a tool tag only where its own preset says so
(``tool_ends_reasoning``: not ``qwen3``, which SGLang pairs with ``qwen3_coder`` for
Qwen3.5). docs/sglang.md, "Chat parsers".
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from detok_plugin import ChatParts, ChatStream, DetokenizerState, Edge, TagSet, TokenTable, families, live_tags
from detok_plugin.families import mistral

from . import _framework

__all__ = [
    "PREFIX",
    "REASONING_PRESETS",
    "TEXT_BYTES",
    "TOOL_PRESETS",
    "install",
    "installed_names",
    "parser_problems",
    "uninstall",
]

#: What a detok detector's SGLang name starts with.
PREFIX = "detok_"

#: SGLang's tool-call parser name -> the core's preset that writes its format.
TOOL_PRESETS: Mapping[str, str] = {
    "qwen25": "qwen3", "qwen": "qwen3", "hermes": "hermes", "qwen3_coder": "qwen3_coder",
    "deepseekv3": "deepseek_r1", "deepseekv31": "deepseek_v31", "deepseekv32": "deepseek_v32",
    "deepseekv4": "deepseek_v4", "deepseekv41": "deepseek_v41", "llama3": "llama3",
    "pythonic": "llama4_pythonic", "mistral": "mistral", "kimi_k2": "kimi_k2", "kimi_k3": "kimi_k3",
    "glm": "glm45", "glm45": "glm45", "glm47": "glm47", "gemma4": "gemma4",
}

#: SGLang's reasoning parser name -> the core's preset whose reasoning tags it reads.
REASONING_PRESETS: Mapping[str, str] = {
    "qwen3": "qwen3", "qwen3-thinking": "qwen3", "deepseek-r1": "deepseek_r1", "deepseek-v3": "deepseek_v31",
    "deepseek-v4": "deepseek_v4", "deepseek-v41": "deepseek_v41", "glm45": "glm45", "kimi_k2": "kimi_k2",
    "kimi_k3": "kimi_k3", "mistral": "magistral", "gemma4": "gemma4",
}

#: Text as token ids: id ``b`` is the byte ``b``, so a text's UTF-8 bytes are its ids and any
#: cut of them decodes, through the core, to the text (a character completes at its last byte).
TEXT_BYTES = TokenTable("byte_level", tuple(bytes((b,)) for b in range(256)), frozenset(), name="UTF-8 bytes")

_TOOLS_MODULE = "sglang.srt.function_call.function_call_parser"
_REASONING_MODULE = "sglang.srt.parser.reasoning_parser"

#: (owner, method, its parameters after self): what a detok detector replaces, as SGLang
#: 0.5.23 calls it (``FunctionCallParser``, ``ReasoningParser``, ``serving_chat``).
_TOOL_METHODS = (
    ("detect_and_parse", ("text", "tools")),
    ("parse_streaming_increment", ("new_text", "tools")),
    ("finish", ("tools",)),
    ("has_tool_call", ("text",)),
)
_REASONING_METHODS = (
    ("detect_and_parse", ("text",)),
    ("parse_streaming_increment", ("new_text",)),
    ("finish", ()),
)


def _no_call_id(name: str, fmt: Any) -> str:
    return ""  # SGLang's serving layer gives each call its id (``_process_tool_call_id``)


def _text_stream(tags: TagSet | None, opened: str, tools: Any, *, streaming: bool) -> ChatStream:
    """A ``ChatStream`` over text (``TEXT_BYTES``), after ``opened`` (the reasoning open tag
    where the reply starts inside reasoning); ``tools``: SGLang's ``Tool`` models."""
    return ChatStream(
        TEXT_BYTES,
        tags,
        prompt_ids=list(opened.encode()),
        skip_special_tokens=False,
        tools=lambda: _tool_dicts(tools),
        new_call_id=_no_call_id,
        streaming=streaming,
    )


def _tool_dicts(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    return [t.model_dump() if hasattr(t, "model_dump") else dict(t) for t in tools]


class DetokToolDetector:
    """The parsing half of a ``detok_<name>`` tool-call detector (the class :func:`install`
    builds puts it before SGLang's own detector of that name). ``preset``: the core's."""

    preset = "qwen3"
    # SGLang's BaseFormatDetector's, read by its serving layer at the finish.
    prev_tool_call_arr: list[dict[str, Any]]
    streamed_args_for_tool: list[str]
    current_tool_id: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.detok_tags = live_tags(TagSet.preset(self.preset), False, True)
        self.detok_stream: ChatStream | None = None
        self.detok_sent: set[int] = set()

    def has_tool_call(self, text: str) -> bool:
        """Whether ``text`` holds a tool-call marker, or the core reads it otherwise than
        as it stands (a call, or whitespace at its edges): SGLang's non-streamed path
        returns a reply whose ``has_tool_call`` is False as it stands, and this keeps it
        the same as the streamed one (SGLang then logs that no call was parsed)."""
        tags = self.detok_tags
        if tags is None:
            return False
        if any(m and m in text for m in (tags.tool_open, tags.tool_bare)):
            return True
        content, calls = self._whole(text, None)
        return bool(calls) or content != text

    def detect_and_parse(self, text: str, tools: Any) -> Any:
        """A whole reply: the content, and each call the model finished (``tool_index``:
        the tool's place in the request, as SGLang's own detectors give it)."""
        content, calls = self._whole(text, tools)
        where = {t.function.name: i for i, t in enumerate(tools or ())}
        items = [_api().ToolCallItem(tool_index=where.get(name, -1), name=name, parameters=args) for name, args in calls]
        return _api().StreamingParseResult(normal_text=content, calls=items)

    def _whole(self, text: str, tools: Any) -> tuple[str, list[tuple[str, str]]]:
        chat = _text_stream(self.detok_tags, "", tools, streaming=False)
        parts = chat.step(text.encode(), True)
        return "".join(parts.content), list(chat.complete)

    def parse_streaming_increment(self, new_text: str, tools: Any) -> Any:
        """One text delta: its content, and the calls it finished (each whole)."""
        if self.detok_stream is None:
            self.detok_stream = _text_stream(self.detok_tags, "", tools, streaming=True)
        return self._result(self.detok_stream.step(new_text.encode(), False))

    def finish(self, tools: Any) -> Any:
        """The end of the reply: what the stream held (a call cut short is dropped)."""
        if self.detok_stream is None:
            return _api().StreamingParseResult()
        return self._result(self.detok_stream.step(b"", True))

    def _result(self, parts: ChatParts) -> Any:
        """A step's parts as SGLang's result; each call sent is kept where SGLang's serving
        layer looks for arguments it has not sent (``_check_for_unstreamed_tool_args``):
        all of them were."""
        api = _api()
        items = []
        for call in parts.tools.values():
            fn, index = call["function"], call["index"]
            args = fn.get("arguments", "")
            items.append(api.ToolCallItem(tool_index=index, name=fn.get("name"), parameters=args))
            if index not in self.detok_sent:
                self.detok_sent.add(index)
                self.prev_tool_call_arr.append({"name": fn.get("name"), "arguments": ""})
                self.streamed_args_for_tool.append("")
            self.prev_tool_call_arr[index]["arguments"] += args
            self.streamed_args_for_tool[index] += args
            self.current_tool_id = index
        return api.StreamingParseResult(normal_text="".join(parts.content), calls=items)


class _ReasoningStream:
    """One reply's text split into reasoning and normal text by the core
    (``DetokenizerState`` over ``TEXT_BYTES``, ``tools="inline"``): a tool call's body stays
    in the normal text for the tool stage, and markers inside it (a ``<think>`` in an
    argument) are the body's text, not reasoning tags; where the preset says so, a tool
    call opened inside reasoning ends it (``tool_ends_reasoning``)."""

    def __init__(self, tags: TagSet | None, opened: str) -> None:
        self.state = DetokenizerState.from_tokenizer(
            TEXT_BYTES, prompt_ids=list(opened.encode()), skip_special_tokens=False, eos_token_ids=(),
            tags=tags, reasoning="separate", tools="inline", keep_log=False,
        )
        self.reasoning, self.content = Edge(), Edge()

    def step(self, text: str, at_end: bool) -> tuple[str, str]:
        """``text``'s reasoning and normal text (and, ``at_end``, what the stream held)."""
        reasoning: list[str] = []
        content: list[str] = []
        for byte in text.encode():  # one id at a time: the order of the two channels
            self._take(self.state.push(byte), reasoning, content)
        if at_end:
            self._take(self.state.finish(), reasoning, content)
            self.reasoning.end()
            self.content.end()
        return "".join(reasoning), "".join(content)

    def _take(self, delta: Any, reasoning: list[str], content: list[str]) -> None:
        if delta.reasoning:
            self.content.end()  # reasoning opened: the content segment before it ended
            reasoning.append(self.reasoning.take(delta.reasoning))
        if delta.text:
            self.reasoning.end()  # reasoning closed: its trailing whitespace was markup
            content.append(self.content.take(delta.text))


class DetokReasoningDetector:
    """The parsing half of a ``detok_<name>`` reasoning detector (before SGLang's own in
    the class :func:`install` builds): reasoning and normal text from the preset's tags.
    A reply starts inside reasoning where SGLang's detector would (``force_reasoning``:
    the template opened it); ``stream_reasoning=False`` holds reasoning until it ends.
    With a tool parser active (``tool_call_parser_active``) the preset's tool tags are
    live too, so a tool call's body passes to the tool stage whole."""

    preset = "qwen3"
    always_forced = False

    def __init__(self, *args: Any, tokenizer: Any = None, tool_call_parser_active: bool = False, **kwargs: Any) -> None:
        takes = inspect.signature(super().__init__).parameters  # what SGLang's own detector takes
        for name, value in (("tokenizer", tokenizer), ("tool_call_parser_active", tool_call_parser_active)):
            if name in takes:
                kwargs[name] = value
        super().__init__(*args, **kwargs)
        p = TagSet.preset(self.preset)
        opening, closing = p.reasoning_open, p.reasoning_close
        if opening == mistral.THINK[0] and tokenizer is not None:  # Magistral 2506: <think> as text
            opening, closing = mistral.reasoning_tags(tokenizer.get_vocab())
        tags = TagSet(p.name, opening, closing, p.tool_open, p.tool_close, p.tool_format, p.tool_bare, p.bare_at_start, p.tool_ends_reasoning)
        self.detok_tags = live_tags(tags, True, tool_call_parser_active)
        # SGLang's: the template opened it (``qwen3-thinking``: always, by its name)
        forced = self.always_forced or bool(getattr(self, "force_reasoning", False))
        self.detok_opened = (opening or "") if forced else ""
        self.detok_stream: _ReasoningStream | None = None
        self.detok_held: list[str] = []

    def detect_and_parse(self, text: str) -> Any:
        reasoning, content = _ReasoningStream(self.detok_tags, self.detok_opened).step(text, True)
        return _reasoning_result(reasoning, content)

    def parse_streaming_increment(self, new_text: str) -> Any:
        if self.detok_stream is None:
            self.detok_stream = _ReasoningStream(self.detok_tags, self.detok_opened)
        return self._result(*self.detok_stream.step(new_text, False), False)

    def finish(self) -> Any:
        if self.detok_stream is None:
            return _reasoning_result("", "")
        return self._result(*self.detok_stream.step("", True), True)

    def _result(self, reasoning: str, content: str, at_end: bool) -> Any:
        if not getattr(self, "stream_reasoning", True):  # SGLang's option: reasoning whole, once it ends
            self.detok_held.append(reasoning)
            reasoning = ""
            if content or at_end:
                reasoning, self.detok_held = "".join(self.detok_held), []
        return _reasoning_result(reasoning, content)


def _reasoning_result(reasoning: str, content: str) -> Any:
    result = importlib.import_module(_REASONING_MODULE).StreamingParseResult
    return result(normal_text=content, reasoning_text=reasoning)


def _api() -> Any:
    """SGLang's tool-call result types (``core_types``), imported once SGLang is loaded."""
    return importlib.import_module("sglang.srt.function_call.core_types")


# --- registration ---------------------------------------------------------------------


def _maps() -> tuple[dict[str, Any], dict[str, Any]]:
    """SGLang's two registries: ``ToolCallParserEnum`` and ``DetectorMap``."""
    tools = importlib.import_module(_TOOLS_MODULE).FunctionCallParser.ToolCallParserEnum
    reasoning = importlib.import_module(_REASONING_MODULE).ReasoningParser.DetectorMap
    return tools, reasoning


def _method_problems(cls: Any, methods: tuple[tuple[str, tuple[str, ...]], ...], what: str) -> list[str]:
    problems = []
    for name, params in methods:
        fn = getattr(cls, name, None)
        if not callable(fn):
            problems.append(f"{what}.{name} is gone")
            continue
        got = tuple(inspect.signature(fn).parameters)[1:]
        if got != params:
            problems.append(f"{what}.{name} takes {got}, not {params}")
    return problems


def parser_problems() -> list[str]:
    """Why SGLang's chat parsers do not take detok detectors here ([] when they do): the
    two registries are dicts of classes, and the detector base classes' parsing methods,
    and the calls ``FunctionCallParser`` and ``ReasoningParser`` make, keep their shapes."""
    try:
        tools, reasoning = _maps()
        base_tool = importlib.import_module("sglang.srt.function_call.base_format_detector").BaseFormatDetector
        base_reasoning = importlib.import_module(_REASONING_MODULE).BaseReasoningFormatDetector
        _api().ToolCallItem(tool_index=0, name="f", parameters="{}")
        importlib.import_module(_REASONING_MODULE).StreamingParseResult(normal_text="", reasoning_text="")
    except Exception as exc:  # an SGLang without these modules or names
        return [f"SGLang's chat parsers cannot be read ({exc!r})"]
    problems = [f"{name} is not a dict" for name, m in (("ToolCallParserEnum", tools), ("DetectorMap", reasoning)) if not isinstance(m, dict)]
    problems += _method_problems(base_tool, _TOOL_METHODS, "BaseFormatDetector")
    problems += _method_problems(base_reasoning, _REASONING_METHODS, "BaseReasoningFormatDetector")
    fcp = importlib.import_module(_TOOLS_MODULE).FunctionCallParser
    for method, call in (("parse_stream_chunk", "parse_streaming_increment"), ("parse_stream_end", "finish")):
        if call not in inspect.getsource(getattr(fcp, method)):
            problems.append(f"FunctionCallParser.{method} no longer calls the detector's {call}")
    return problems


#: SGLang reasoning names whose ``ReasoningParser`` forces reasoning by the name itself.
ALWAYS_FORCED = frozenset({"qwen3-thinking"})


def _detok_class(mixin: type, stock: type, preset: str, name: str) -> type:
    """``mixin`` before SGLang's ``stock`` detector, taking what ``stock`` takes (SGLang
    passes ``tokenizer`` only to a class whose signature names it)."""
    attrs = {"preset": preset, "always_forced": name in ALWAYS_FORCED, "__module__": __name__}
    cls = type(f"Detok{stock.__name__}", (mixin, stock), attrs)
    params = list(inspect.signature(stock).parameters.values())
    if mixin is DetokReasoningDetector:  # it reads both, whether or not the stock one does
        names = {p.name for p in params}
        tail = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
        params = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD] + [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
            for n, d in (("tokenizer", None), ("tool_call_parser_active", False))
            if n not in names
        ] + tail
    cls.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return cls


def _additions(names: Mapping[str, str], stock: dict[str, Any], mixin: type) -> dict[str, type]:
    known = set(families.preset_names())
    return {
        PREFIX + name: _detok_class(mixin, stock[name], preset, name)
        for name, preset in names.items()
        if name in stock and preset in known and isinstance(stock[name], type)
    }


_INSTALLED: dict[str, list[str]] = {"tools": [], "reasoning": []}


def install(say: Callable[[int, str], None] | None = None) -> bool:
    """Register the detok detectors in SGLang's registries (where :func:`parser_problems`
    finds none; otherwise ``say`` gets one line and SGLang keeps only its own). Returns
    whether they are registered. Only the server's own process needs them: the scheduler
    and detokenizer processes skip the import (seconds: SGLang's OpenAI models)."""
    if _framework.process_name().startswith("sglang::"):
        return False  # a scheduler, detokenizer or data-parallel process: no chat parsing
    problems = parser_problems()
    if problems:
        if say is not None:
            say(40, f"detok-plugin: the detok_* chat parsers are NOT registered: {'; '.join(problems)}; SGLang keeps its own parsers")
        return False
    tools, reasoning = _maps()
    added_tools = _additions(TOOL_PRESETS, tools, DetokToolDetector)
    added_reasoning = _additions(REASONING_PRESETS, reasoning, DetokReasoningDetector)
    tools.update(added_tools)
    reasoning.update(added_reasoning)
    _INSTALLED["tools"] = sorted(added_tools)
    _INSTALLED["reasoning"] = sorted(added_reasoning)
    return True


def uninstall() -> bool:
    """Take the detok detectors out of SGLang's registries; whether any was there."""
    if not any(_INSTALLED.values()):
        return False
    tools, reasoning = _maps()
    for name in _INSTALLED["tools"]:
        tools.pop(name, None)
    for name in _INSTALLED["reasoning"]:
        reasoning.pop(name, None)
    _INSTALLED["tools"], _INSTALLED["reasoning"] = [], []
    return True


def installed_names() -> dict[str, list[str]]:
    """The detok names registered now: ``{"tools": [...], "reasoning": [...]}``."""
    return {k: list(v) for k, v in _INSTALLED.items()}
