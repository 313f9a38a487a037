"""Tool-call and reasoning formats, one module per model family; :data:`FAMILIES` is the registry.

Each family module defines one :class:`Family`: its :class:`ToolFormat` (the finished
parse, the streaming reader, what a server must know) and the presets (:class:`Preset`:
the markers) that write it. The core parses finished bodies through :func:`tool_format`,
``TagSet.preset`` reads :func:`preset`, a chat layer reads bodies as they stream through
the format's ``reader``, and the vLLM shim registers a ``detok_<preset>`` parser per preset.

========== ======================== ============================== =====================
preset     reasoning                tool call                      module (format)
========== ======================== ============================== =====================
qwen3      ``<think>``/``</think>`` ``<tool_call>``/``</tool_call>`` hermes (hermes)
hermes     (same as qwen3)
llama3     none                     ``<|python_tag|>`` to the end    llama3 (llama3)
llama4_pythonic none                ``[f(a=1), ...]`` to the end     llama4_pythonic (llama4_pythonic)
mistral    none                     ``[TOOL_CALLS]`` to the end      mistral (mistral)
magistral  ``[THINK]``/``[/THINK]``   ``[TOOL_CALLS]`` to the end      mistral (mistral)
deepseek_r1 ``<think>``/``</think>`` ``<｜tool▁calls▁begin｜>`` ...  deepseek_r1 (deepseek)
deepseek_v31 (same as deepseek_r1)  (same as deepseek_r1)          deepseek_v31 (deepseek_v31)
deepseek_v32 ``<think>``/``</think>`` ``<｜DSML｜function_calls>`` ...  deepseek_v4 (deepseek_v4)
deepseek_v4 (same as deepseek_v32)  ``<｜DSML｜tool_calls>`` ...    deepseek_v4 (deepseek_v4)
deepseek_v41 (same as deepseek_v32) ``<｜DSML｜ calls>`` ...        deepseek_v41 (deepseek_v41)
kimi_k2    ``<think>``/``</think>`` ``<|tool_calls_section_begin|>`` kimi_k2 (kimi_k2)
qwen3_coder ``<think>``/``</think>`` ``<tool_call>``/``</tool_call>`` qwen3_coder (qwen3_xml)
glm45      ``<think>``/``</think>`` ``<tool_call>``/``</tool_call>`` glm45 (glm45)
glm47      (same as glm45)          (same as glm45)                glm47 (glm45)
gemma4     ``<|channel>thought\\n`` ``<|tool_call>``/``<tool_call|>`` gemma4 (gemma4)
           /``<channel|>``
kimi_k3    ``<|open|>think<|sep|>`` ``<|open|>tools<|sep|>``       kimi_k3 (kimi_k3)
           /``<|close|>think<|sep|>`` /``<|close|>tools<|sep|>``
========== ======================== ============================== =====================

Adding a family: one module that builds a ``FAMILY``, and one entry in :data:`FAMILIES`
(or, from outside the package, :func:`register`). A format whose arguments are JSON builds
its reader from :class:`JsonBodyReader` and a :class:`Dialect` (its head, how its
arguments end); the XML ones from ``_xml_reader``. Its test module feeds the reader at
every chunking and checks what was sent against the parse (``tests/families/``).
"""

from __future__ import annotations

from . import (
    deepseek_r1,
    deepseek_v4,
    deepseek_v31,
    deepseek_v41,
    gemma4,
    glm45,
    glm47,
    hermes,
    kimi_k2,
    kimi_k3,
    llama3,
    llama4_pythonic,
    mistral,
    qwen3_coder,
)
from ._format import BodyReader, Event, Family, Preset, ToolFormat, Tools
from ._json_reader import Dialect, JsonBodyReader, may_become_head

__all__ = [
    "FAMILIES",
    "BodyReader",
    "Dialect",
    "Event",
    "Family",
    "JsonBodyReader",
    "Preset",
    "ToolFormat",
    "may_become_head",
    "parse_tool_body",
    "preset",
    "preset_names",
    "register",
    "tool_format",
    "unregister",
]

#: The registry: every family the package ships.
FAMILIES: tuple[Family, ...] = (
    hermes.FAMILY,
    llama3.FAMILY,
    llama4_pythonic.FAMILY,
    mistral.FAMILY,
    deepseek_r1.FAMILY,
    deepseek_v31.FAMILY,
    deepseek_v4.FAMILY,
    deepseek_v41.FAMILY,
    kimi_k2.FAMILY,
    qwen3_coder.FAMILY,
    glm45.FAMILY,
    glm47.FAMILY,
    gemma4.FAMILY,
    kimi_k3.FAMILY,
)

_FORMATS: dict[str, ToolFormat] = {}
_PRESETS: dict[str, tuple[Preset, ToolFormat]] = {}


def register(family: Family) -> None:
    """Add a family (its format and presets by name; a name given again is replaced)."""
    _FORMATS[family.format.name] = family.format
    for p in family.presets:
        _PRESETS[p.name] = (p, family.format)


def unregister(name: str) -> None:
    """Remove the format called ``name`` and the presets that write it."""
    _FORMATS.pop(name, None)
    for preset_name in [n for n, (_, fmt) in _PRESETS.items() if fmt.name == name]:
        del _PRESETS[preset_name]


for _family in FAMILIES:
    register(_family)


def tool_format(name: str) -> ToolFormat:
    """The tool format called ``name``; ``ValueError`` for an unknown one."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool format {name!r}; choose one of {sorted(_FORMATS)}") from None


def preset(name: str) -> tuple[Preset, ToolFormat]:
    """The markers called ``name`` and the format they write; ``ValueError`` for an unknown one."""
    try:
        return _PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown tag preset {name!r}; choose one of {sorted(_PRESETS)}") from None


def preset_names() -> tuple[str, ...]:
    return tuple(sorted(_PRESETS))


def parse_tool_body(body: str, fmt: str, *, tools: Tools = None) -> list[tuple[str, str]]:
    """Parse a finished tool-call body into ``[(name, arguments_json), ...]``.

    Raises ``ValueError`` (``json.JSONDecodeError`` is one) for a malformed body.
    ``tools`` (OpenAI's request field, as plain dicts) types the values of the formats
    that are typed by schema (``qwen3_xml``, ``glm45``); without it they stay strings.

    >>> parse_tool_body('{"name": "get_time", "arguments": {"tz": "東京"}}', "hermes")
    [('get_time', '{"tz": "東京"}')]
    """
    return tool_format(fmt).parse(body, tools)
