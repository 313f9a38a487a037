"""The one module of the SGLang shim that imports SGLang, and the contract it checks.

Every SGLang name the shim uses comes through here: the scheduler's stop-string seam
(``sglang.srt.managers.schedule_batch.Req._check_str_based_finish`` and
``Req.check_match_stop_str_prefix``), the detokenizer's seam
(``sglang.srt.managers.detokenizer_manager.DetokenizerManager._decode_batch_token_id_output``),
SGLang's finish reason for a stop string, its detokenizer's state dictionary, and the
settings that take the Python detokenizer out of the path. They are private API: supporting
a new SGLang version is a change to this file (:data:`VERIFIED_SGLANG_VERSIONS`, and what
:func:`contract_problems` checks). SGLang is imported lazily (:func:`seams`), so importing
the shim costs nothing; SGLang's objects are typed ``Any`` here, so that the shim
type-checks without SGLang installed.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import importlib
import importlib.metadata
import inspect
import os
import sys
from typing import Any, NamedTuple

from ..common.patches import PATCHES

__all__ = [
    "PLUGINS_FLAG",
    "RUST_SERVER_FLAG",
    "VERIFIED_SGLANG_VERSIONS",
    "Seams",
    "contract_problems",
    "process_name",
    "rust_server",
    "scheduler_class",
    "seams",
    "sglang_version",
]

#: SGLang releases whose contract this shim was tested against.
VERIFIED_SGLANG_VERSIONS = frozenset({"0.5.23"})

#: SGLang's allow-list of general plugins (comma-separated entry-point names).
PLUGINS_FLAG = "SGLANG_PLUGINS"

#: SGLang's setting for its Rust HTTP server, which detokenizes in Rust (no Python
#: ``DetokenizerManager`` runs, so the plugin cannot act there).
RUST_SERVER_FLAG = "SGLANG_RUST_SERVER"

_INSTALL_HINT = "install SGLang 0.5.23 into this environment (detok-plugin never installs it)"


class Seams(NamedTuple):
    """SGLang's names the shim patches or builds on."""

    Req: Any  # sglang.srt.managers.schedule_batch.Req
    FINISH_MATCHED_STR: Any  # its finish reason for a matched stop string
    DetokenizerManager: Any  # sglang.srt.managers.detokenizer_manager.DetokenizerManager
    DecodeStatus: Any  # stock's per-request detokenizer state (a request handed over)
    max_states: int  # the capacity of its state dict (SGLANG_DETOKENIZER_MAX_STATES)
    context: int  # the prompt ids its detokenizer decodes before a request's output


@functools.cache  # an ImportError is not cached: the next call tries again
def seams() -> Seams:
    """SGLang's scheduler and detokenizer names (imports both modules)."""
    try:
        detokenizer_manager = importlib.import_module("sglang.srt.managers.detokenizer_manager")
        schedule_batch = importlib.import_module("sglang.srt.managers.schedule_batch")
    except ImportError as exc:
        raise ImportError(f"detok_plugin.integrations.sglang needs SGLang: {_INSTALL_HINT} ({exc})") from exc
    return Seams(
        schedule_batch.Req,
        schedule_batch.FINISH_MATCHED_STR,
        detokenizer_manager.DetokenizerManager,
        detokenizer_manager.DecodeStatus,
        int(getattr(detokenizer_manager, "DETOKENIZER_MAX_STATES", 1 << 16)),
        int(getattr(schedule_batch, "INIT_INCREMENTAL_DETOKENIZATION_OFFSET", 5)),
    )


def sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(importlib.import_module("sglang"), "__version__", "unknown"))


def rust_server() -> bool:
    """Whether :data:`RUST_SERVER_FLAG` is on, read as SGLang reads it (``envs``)."""
    try:
        envs = importlib.import_module("sglang.srt.environ").envs
        return bool(envs.SGLANG_RUST_SERVER.get())
    except Exception:  # an unreadable value: SGLang's own start fails on it, not here
        return os.environ.get(RUST_SERVER_FLAG, "").strip().lower() in ("1", "true", "yes", "on")


#: SGLang's process entry functions, by the title SGLang gives the process (plugins load
#: before it sets the title).
_ROLES = {
    "run_scheduler_process": "sglang::scheduler",
    "run_detokenizer_process": "sglang::detokenizer",
    "run_data_parallel_controller_process": "sglang::data_parallel_controller",
}


def scheduler_class() -> Any:
    """SGLang's ``Scheduler`` where this process has imported it (the scheduler's own
    process, which loads the plugins from its module), else None: the shim never imports
    it (a heavy module, and no other process builds one)."""
    return getattr(sys.modules.get("sglang.srt.managers.scheduler"), "Scheduler", None)


def process_name() -> str:
    """Which SGLang process this is (``sglang::scheduler``, ...), for a log line: the
    SGLang entry function on the stack, else the process's title or name."""
    frame = sys._getframe(1)
    while frame is not None:
        role = _ROLES.get(frame.f_code.co_name)
        if role is not None:
            return role
        frame = frame.f_back  # type: ignore[assignment]
    try:
        title = str(importlib.import_module("setproctitle").getproctitle())
    except Exception:
        title = ""
    if title.startswith("sglang::"):
        return title.split()[0]
    import multiprocessing

    return multiprocessing.current_process().name


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _names(fn: Any) -> frozenset[str]:
    """The names a function's code reads (attributes and globals)."""
    code = getattr(fn, "__code__", None)
    return frozenset(code.co_names) if code is not None else frozenset()


def _calls_with_one_positional(fn: Any, method: str) -> bool:
    """Whether every call of ``self.<method>(...)`` in ``fn``'s code passes exactly one
    argument, by position (no keyword, no unpacking): read from its bytecode."""
    calls = 0
    pending = False
    for ins in dis.get_instructions(fn):
        if ins.opname in ("LOAD_METHOD", "LOAD_ATTR") and ins.argval == method:
            pending = True
        elif pending and ins.opname in ("KW_NAMES", "CALL_KW", "CALL_FUNCTION_EX", "CALL_FUNCTION_KW"):
            return False
        elif pending and ins.opname in ("CALL", "CALL_FUNCTION", "CALL_METHOD"):
            if ins.arg != 1:
                return False
            calls += 1
            pending = False
    return calls > 0 and not pending


def contract_problems() -> list[str]:
    """Every way the installed SGLang differs from the contract the shim keeps; [] if none.
    SGLang's own methods are checked, whether or not ours stand in their place."""
    s = seams()
    return _scheduler_problems(s) + _detokenizer_problems(s)


def _stock(owner: Any, name: str) -> Any:
    """SGLang's ``owner.name``: the stock value behind ours where we patched it."""
    return PATCHES.stock(owner, name) or inspect.getattr_static(owner, name, None)


def _scheduler_problems(s: Seams) -> list[str]:
    problems = []
    req = s.Req
    check = _stock(req, "_check_str_based_finish")
    prefix = _stock(req, "check_match_stop_str_prefix")
    if check is None or _params(check) != ["self", "new_accepted_len"]:
        problems.append("Req._check_str_based_finish is not (self, new_accepted_len)")
    elif not {"finished_reason", "finished_len", "stop_strs"} <= _names(check):
        problems.append("Req._check_str_based_finish no longer sets finished_reason and finished_len from stop_strs")
    if prefix is None or _params(prefix) != ["self"]:
        problems.append("Req.check_match_stop_str_prefix is not (self)")
    problems += _caller_problems(req)
    if not getattr(req, "__dictoffset__", 0):  # the shim binds each request's own checks on it
        problems.append("Req instances have no __dict__ (__slots__)")
    for name in ("output_ids", "origin_input_ids_unpadded", "tokenizer", "sampling_params", "finished_reason"):
        if name not in _names(req.__init__):
            problems.append(f"Req has no {name}")
    if _params(s.FINISH_MATCHED_STR) != ["matched"]:
        problems.append("FINISH_MATCHED_STR is not (matched)")
    try:
        sp = importlib.import_module("sglang.srt.sampling.sampling_params").SamplingParams()
    except Exception as exc:
        return [*problems, f"cannot build SGLang's SamplingParams ({exc!r})"]
    for name in ("stop_strs", "stop_regex_strs", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
        if not hasattr(sp, name):
            problems.append(f"SamplingParams has no {name}")
    return problems


def _caller_problems(req: Any) -> list[str]:
    """How ``Req.update_finish_state`` calls the check: by name, with one positional argument
    (the request's bound check, ``ServingStream.watch``'s, takes it by position)."""
    update = getattr(req, "update_finish_state", None)
    if update is None or "_check_str_based_finish" not in _names(update):
        return ["Req.update_finish_state no longer calls _check_str_based_finish"]
    if not _calls_with_one_positional(update, "_check_str_based_finish"):
        return ["Req.update_finish_state no longer calls _check_str_based_finish with one positional argument"]
    return []


def _detokenizer_problems(s: Seams) -> list[str]:
    problems = []
    cls = s.DetokenizerManager
    decode = _stock(cls, "_decode_batch_token_id_output")
    if decode is None or _params(decode) != ["self", "recv_obj"]:
        problems.append("DetokenizerManager._decode_batch_token_id_output is not (self, recv_obj)")
    handle = getattr(cls, "handle_batch_token_id_out", None)
    if handle is None or "_decode_batch_token_id_output" not in _names(handle):
        problems.append("DetokenizerManager.handle_batch_token_id_out no longer calls _decode_batch_token_id_output")
    trim = getattr(cls, "trim_matched_stop", None)
    if trim is None or _params(trim) != ["self", "output", "finished_reason", "no_stop_trim"]:
        problems.append("DetokenizerManager.trim_matched_stop is not (self, output, finished_reason, no_stop_trim)")
    status = [f.name for f in dataclasses.fields(s.DecodeStatus)]
    if status[:5] != ["decoded_text", "decode_ids", "surr_offset", "read_offset", "sent_offset"]:
        problems.append("DecodeStatus is not (decoded_text, decode_ids, surr_offset, read_offset, sent_offset, ...)")
    for method, names in (("init_tokenizer", ("tokenizer",)), ("init_running_status", ("decode_status",))):
        fn = _stock(cls, method)  # init_tokenizer: SGLang's, behind ours (plugin._build_tables_at_start)
        if fn is None or not set(names) <= _names(fn):
            problems.append(f"DetokenizerManager.{method} no longer sets {', '.join(names)}")
    try:
        batch = importlib.import_module("sglang.srt.managers.io_struct").BatchTokenIDOutput
        fields = set(getattr(batch, "__struct_fields__", ()))  # a msgspec Struct
    except Exception as exc:
        return [*problems, f"cannot read BatchTokenIDOutput's fields ({exc!r})"]
    for name in (
        "rids", "decoded_texts", "decode_ids", "read_offsets", "finished_reasons", "no_stop_trim",
        "skip_special_tokens", "spaces_between_special_tokens",
    ):
        if name not in fields:
            problems.append(f"BatchTokenIDOutput has no {name}")
    return problems
