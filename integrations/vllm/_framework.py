"""The one module of the vLLM shim that imports vLLM, and the contract it checks.

Every vLLM name the shim uses comes through here: the detokenizer seam
(``vllm.v1.engine.detokenizer.IncrementalDetokenizer.from_new_request``), the chat layer's
parser classes and managers, the serve arguments' validation (``validate_api_server_args``
in vLLM's launcher module), the Rust-frontend setting, and vLLM's logging. They are private
API: supporting a new vLLM version is a change to this file (:data:`VERIFIED_VLLM_VERSIONS`,
and what :func:`contract_problems`, :func:`chat_problems` and :func:`validator_problems`
check). vLLM is imported lazily (:func:`detokenizer_api`, :func:`chat_api`), so importing
the shim costs nothing.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import sys
from types import ModuleType
from typing import Any, NamedTuple

__all__ = [
    "LAUNCHER_MODULE",
    "RUST_FRONTEND_FLAG",
    "VALIDATOR",
    "VERIFIED_VLLM_VERSIONS",
    "ChatApi",
    "adjust_harmony_output_format",
    "chat_api",
    "chat_problems",
    "contract_problems",
    "detokenizer_api",
    "launcher_module",
    "logger_module",
    "parser_names",
    "rust_frontend",
    "validator_problems",
    "vllm_version",
]

#: vLLM releases whose contract this shim was tested against.
VERIFIED_VLLM_VERSIONS = frozenset({"0.32.0", "0.33.0"})

_INSTALL_HINT = "install vLLM 0.32 or 0.33 into this environment (detok-plugin never installs it)"


@functools.cache  # an ImportError is not cached: the next call tries again
def detokenizer_api() -> tuple[ModuleType, ModuleType]:
    """vLLM's ``v1.engine.detokenizer`` and ``v1.engine.output_processor`` modules."""
    try:
        from vllm.v1.engine import detokenizer, output_processor
    except ImportError as exc:
        raise ImportError(f"detok_plugin.integrations.vllm needs vLLM: {_INSTALL_HINT} ({exc})") from exc
    return detokenizer, output_processor


class ChatApi(NamedTuple):
    """The names of vLLM's chat layer the ``detok_*`` parsers build on."""

    DeltaMessage: Any
    FunctionCall: Any
    Parser: Any
    ParserManager: Any
    ReasoningParserManager: Any
    BaseThinkingReasoningParser: Any
    GptOssReasoningParser: Any
    ToolParser: Any
    ToolParserManager: Any
    make_tool_call_id: Any
    extract_function_from_recipient: Any
    is_function_recipient: Any


@functools.cache
def chat_api() -> ChatApi:
    """vLLM 0.32/0.33's chat-layer names (the unified ``vllm.parser.Parser``)."""
    try:
        from vllm.entrypoints.generate.base.protocol import DeltaMessage, FunctionCall
        from vllm.entrypoints.openai.parser.harmony_utils import extract_function_from_recipient, is_function_recipient
        from vllm.parser.abstract_parser import Parser
        from vllm.parser.parser_manager import ParserManager
        from vllm.reasoning.abs_reasoning_parsers import ReasoningParserManager
        from vllm.reasoning.basic_parsers import BaseThinkingReasoningParser
        from vllm.reasoning.gptoss_reasoning_parser import GptOssReasoningParser
        from vllm.renderers.chat_utils import make_tool_call_id
        from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager
    except ImportError as exc:
        raise ImportError(f"the detok_* chat parsers need vLLM 0.32 or 0.33: {_INSTALL_HINT} ({exc})") from exc
    return ChatApi(
        DeltaMessage, FunctionCall, Parser, ParserManager, ReasoningParserManager, BaseThinkingReasoningParser,
        GptOssReasoningParser, ToolParser, ToolParserManager, make_tool_call_id, extract_function_from_recipient,
        is_function_recipient,
    )


def adjust_harmony_output_format(request: Any) -> Any:
    """vLLM's harmony adjustment of a request: a structured-output constraint applies to the
    ``final`` message only (``vllm.parser.harmony._adjust_output_format``)."""
    from vllm.parser.harmony import _adjust_output_format

    return _adjust_output_format(request)


def logger_module() -> ModuleType | None:
    """``vllm.logger`` (whose ``configure_logging`` every vLLM entry point calls), or None."""
    try:
        import vllm.logger as vllm_logger
    except ImportError:
        return None
    return vllm_logger


#: vLLM's module whose ``setup_server`` validates the serve arguments in the API-server
#: process before it builds the engine (0.32 defines the validator there; 0.33 imports it
#: there from ``vllm.entrypoints.common.cli_args``, and ``setup_server`` looks it up there).
LAUNCHER_MODULE = "vllm.entrypoints.launchers.launcher"

#: The validator in it: ``validate_api_server_args(args)``, which checks the parser names.
VALIDATOR = "validate_api_server_args"

#: vLLM 0.32/0.33's setting for its Rust frontend (``vllm serve`` answers HTTP from
#: ``vllm-rs``, which detokenizes and parses in Rust: no Python plugin acts there).
RUST_FRONTEND_FLAG = "VLLM_USE_RUST_FRONTEND"


def launcher_module() -> ModuleType | None:
    """vLLM's launcher module if it is imported in this process (an API server), else None."""
    return sys.modules.get(LAUNCHER_MODULE)


def validator_problems(launcher: ModuleType) -> list[str]:
    """How the launcher's validator differs from what the names check wraps; [] if nothing."""
    fn = getattr(launcher, VALIDATOR, None)
    if not callable(fn):
        return [f"{LAUNCHER_MODULE}.{VALIDATOR} is gone"]
    if _params(fn) != ["args"]:
        return [f"{LAUNCHER_MODULE}.{VALIDATOR} takes {_params(fn)}, not (args)"]
    return []


def parser_names(args: Any) -> tuple[str | None, str | None]:
    """(reasoning parser, tool parser) as ``vllm serve``'s arguments name them:
    ``--reasoning-parser`` (else the structured-outputs config's, as ``EngineArgs`` merges
    them) and ``--tool-call-parser``."""
    reasoning = getattr(args, "reasoning_parser", None) or getattr(
        getattr(args, "structured_outputs_config", None), "reasoning_parser", None
    )
    return reasoning or None, getattr(args, "tool_call_parser", None) or None


def rust_frontend() -> bool:
    """Whether :data:`RUST_FRONTEND_FLAG` is set, read as vLLM reads it (``vllm.envs``)."""
    try:
        import vllm.envs as envs

        return bool(getattr(envs, RUST_FRONTEND_FLAG, False))
    except Exception:  # an unreadable value: vLLM's own start fails on it, not here
        return False


@functools.cache  # read per register(), and importlib.metadata reads the disk
def vllm_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def contract_problems(ours: Any = None) -> list[str]:
    """Every way the installed vLLM differs from the detokenizer contract the adapter keeps;
    [] if none. ``ours``: the factory we installed, whose signature is ours to choose."""
    detokenizer, output_processor = detokenizer_api()
    problems: list[str] = []
    cls = getattr(detokenizer, "IncrementalDetokenizer", None)
    if cls is None:
        return ["vllm.v1.engine.detokenizer.IncrementalDetokenizer is gone"]
    if getattr(output_processor, "IncrementalDetokenizer", None) is not cls:
        problems.append("vllm.v1.engine.output_processor no longer builds detokenizers through IncrementalDetokenizer")
    factory = cls.__dict__.get("from_new_request")
    if not isinstance(factory, classmethod):
        problems.append("IncrementalDetokenizer.from_new_request is not a classmethod")
    elif factory is not ours and _params(factory.__func__) != ["cls", "tokenizer", "request"]:
        problems.append(f"from_new_request takes {_params(factory.__func__)}, not (cls, tokenizer, request)")
    wanted = {
        "update": ["self", "new_token_ids", "stop_terminated"],
        "get_next_output_text": ["self", "finished", "delta"],
        "num_output_tokens": ["self"],
    }
    for name, params in wanted.items():
        fn = getattr(cls, name, None)
        if fn is None or _params(fn) != params:
            problems.append(f"IncrementalDetokenizer.{name} is not ({', '.join(params)})")
    if not isinstance(inspect.getattr_static(cls, "output_token_ids", None), property):
        problems.append("IncrementalDetokenizer.output_token_ids is not a property")
    return problems + _request_problems()


def _request_problems() -> list[str]:
    try:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.engine import EngineCoreRequest
    except ImportError as exc:
        return [f"cannot import SamplingParams or EngineCoreRequest ({exc})"]
    problems = []
    sp = SamplingParams()
    for name in (
        "stop", "include_stop_str_in_output", "min_tokens", "skip_special_tokens",
        "spaces_between_special_tokens", "detokenize", "output_kind",
    ):
        if not hasattr(sp, name):
            problems.append(f"SamplingParams has no {name}")
    fields = getattr(EngineCoreRequest, "__struct_fields__", ())
    for name in ("request_id", "prompt_token_ids", "sampling_params", "resumable"):
        if name not in fields:
            problems.append(f"EngineCoreRequest has no {name}")
    return problems


def chat_problems(ours: Any = None) -> list[str]:
    """How the installed vLLM differs from what the chat parsers need; [] if nothing.
    ``ours``: the ``_compose_parser`` function we installed, if any."""
    api = chat_api()
    problems = []
    compose = api.ParserManager.__dict__.get("_compose_parser")
    if not isinstance(compose, classmethod):
        problems.append("vllm.parser.ParserManager._compose_parser is not a classmethod")
    elif compose.__func__ is not ours:
        params = _params(compose.__func__)
        for name in ("tool_parser_name", "reasoning_parser_name", "enable_auto_tools"):
            if name not in params:
                problems.append(f"ParserManager._compose_parser takes no {name}")
    wanted = ("parse_delta", "parse", "is_reasoning_end", "adjust_request", "set_prompt_token_ids")
    problems += [f"vllm.parser.Parser has no {m}" for m in wanted if not hasattr(api.Parser, m)]
    return problems
