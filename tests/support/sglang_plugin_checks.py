"""The SGLang plugin's switch, hooks, contract check and safety net, inside SGLang 0.5.23.

Runs in ``.venv-sglang`` (called by ``tests/integrations/sglang/test_sglang_plugin.py``),
one fresh interpreter per call: ``python tests/support/sglang_plugin_checks.py CHECK``
prints one JSON object (``everything``: all of them, in one process). ``load_plugins`` calls SGLang's own ``load_plugins()`` (what every
SGLang process calls first: the server's main process, the scheduler, the detokenizer, a
data-parallel controller) under the environment it was given; the others drive the plugin's
seams on SGLang's real ``Req`` and ``DetokenizerManager``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from array import array
from typing import Any

from sglang_replay import byte_ids, detokenizer_manager, enc

STOP = "\n\nUser:"


def _hooks() -> dict[str, bool]:
    from detok_plugin.integrations.sglang import detokenizer, scheduler
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager
    from sglang.srt.managers.schedule_batch import Req

    return {
        "check": vars(Req)["_check_str_based_finish"] is scheduler.check_str_based_finish,
        "prefix": vars(Req)["check_match_stop_str_prefix"] is scheduler.check_match_stop_str_prefix,
        "detokenizer": vars(DetokenizerManager)["_decode_batch_token_id_output"] is detokenizer.decode_batch_token_id_output,
    }


#: The switch's settings, each under SGLang's own ``load_plugins()`` in turn.
SETTINGS = {
    "on": {"DETOK_PLUGIN": "1"},
    "off": {"DETOK_PLUGIN": "0"},
    "sglang_plugins_names_it": {"SGLANG_PLUGINS": "detok_plugin"},
    "sglang_plugins_leaves_it_out": {"DETOK_PLUGIN": "1", "SGLANG_PLUGINS": "some_other_plugin"},
    "mistaken_value": {"DETOK_PLUGIN": "maybe"},
    "unset": {},
    "rust_server": {"DETOK_PLUGIN": "1", "SGLANG_RUST_SERVER": "1"},
}


def load_plugins() -> dict[str, Any]:
    """Each setting of ``SETTINGS``: SGLang's ``load_plugins()`` twice (the second is its
    own no-op), then, where the plugin is on, ``register()`` once more (a plugin called
    again in one process says nothing new); what each left in place and said on stderr.
    SGLang's once-per-process guard is reset between settings, and the plugin unregistered."""
    import sglang.srt.plugins as plugins
    from detok_plugin.integrations.sglang import contract_problems, register, unregister

    results = {}
    for name, env in SETTINGS.items():
        for key in ("DETOK_PLUGIN", "SGLANG_PLUGINS", "SGLANG_RUST_SERVER"):
            os.environ.pop(key, None)
        os.environ.update(env)
        unregister()
        plugins._plugins_loaded = False
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            plugins.load_plugins()
            plugins.load_plugins()
            hooks = _hooks()
            again = register() if all(hooks.values()) else None
        results[name] = {"hooks": hooks, "stderr": err.getvalue(), "again": again}
    results["problems"] = contract_problems()
    unregister()
    for key in ("DETOK_PLUGIN", "SGLANG_PLUGINS", "SGLANG_RUST_SERVER"):
        os.environ.pop(key, None)
    os.environ["DETOK_PLUGIN"] = "1"
    return results


def broken_contract() -> dict[str, Any]:
    """An SGLang whose stop check changed shape: one error line, SGLang left stock."""
    from sglang.srt.managers.schedule_batch import Req

    def changed(self: Any, new_accepted_len: int = 1, *, extra: bool = False) -> bool:
        return False

    Req._check_str_based_finish = changed
    return _register_on_changed_sglang()


def broken_call() -> dict[str, Any]:
    """An SGLang whose ``update_finish_state`` passes the step's count by keyword (the
    request's bound check takes it by position): one error line, SGLang left stock."""
    from sglang.srt.managers.schedule_batch import Req

    stock = Req.update_finish_state

    def changed(self: Any, new_accepted_len: int = 1) -> None:
        if self._check_str_based_finish(new_accepted_len=new_accepted_len):
            return

    Req.update_finish_state = changed
    try:
        return _register_on_changed_sglang()
    finally:
        Req.update_finish_state = stock


def _register_on_changed_sglang() -> dict[str, Any]:
    from detok_plugin.integrations.sglang import register, unregister

    unregister()
    logging.getLogger("sglang.detok_plugin").handlers.clear()  # the hand-over checks' capture
    err = io.StringIO()
    # On stderr, or through SGLang's logging where a module imported earlier set it up.
    handler = logging.StreamHandler(err)
    logging.getLogger("sglang.detok_plugin").addHandler(handler)
    try:
        with contextlib.redirect_stderr(err):
            on = register()
    finally:
        logging.getLogger("sglang.detok_plugin").removeHandler(handler)
    return {"on": on, "stderr": err.getvalue(), "hooks": _hooks()}


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.environ["DETOK_SGLANG_TOKENIZER"])
    tok.additional_stop_token_ids = None
    return tok


def _req(tok: Any, name: str, stop: list[str] | None, stop_regex: str | None = None) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=64, stop=stop, stop_regex=stop_regex)
    sp.normalize(tok)
    req = Req(name, "", array("q", enc(tok, "Q: ")), sp, stream=True, eos_token_ids={tok.eos_token_id}, vocab_size=len(tok))
    req.tokenizer = tok
    return req


class _Raises:
    """A stream that fails on its next push (a bug in the core, simulated); all else is
    the real stream's."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def push_text(self, token_id: int) -> str:
        raise RuntimeError("injected fault")


@contextlib.contextmanager
def _faulty_follow(fault: dict[str, bool]) -> Any:
    """``ServingStream.follow`` fails while ``fault["on"]`` (a bug in the core, simulated),
    for the streams built inside the block (a request binds its stream's ``follow``)."""
    from detok_plugin import ServingStream

    real = ServingStream.follow

    def follow(self: Any, ids: Any) -> bool:
        if fault["on"]:
            raise RuntimeError("injected fault")
        return real(self, ids)

    ServingStream.follow = follow  # type: ignore[method-assign]
    try:
        yield
    finally:
        ServingStream.follow = real  # type: ignore[method-assign]


def scheduler_hand_over() -> dict[str, Any]:
    """A request whose stop stream raises goes on under SGLang's stock check, logged; it
    still ends at a stop stock can see."""
    from detok_plugin.integrations.sglang import register

    register()
    tok = _tokenizer()
    ids = enc(tok, "one two") + enc(tok, " three END four")
    logs = io.StringIO()
    logging.getLogger("sglang.detok_plugin").addHandler(logging.StreamHandler(logs))
    finished_at = None
    fault = {"on": False}
    with _faulty_follow(fault):
        req = _req(tok, "faulty", ["END"])
        for step, token_id in enumerate(ids):
            req.output_ids.append(token_id)
            fault["on"] = step == 2
            req.update_finish_state()
            req.check_match_stop_str_prefix()
            if req.finished():
                finished_at = step + 1
                break
    return {
        "finished_at": finished_at, "reason": req.finished_reason.to_json() if req.finished_reason else None,
        "watch": req._detok_plugin_stops, "logs": logs.getvalue(), "expected_at": len(enc(tok, "one two three END")),
        "own_methods_left": sorted(set(vars(req)) & {"_check_str_based_finish", "check_match_stop_str_prefix"}),
    }


def _run_to_finish(req: Any, ids: list[int]) -> list[bool]:
    """Append each id as SGLang's scheduler does, then its checks; the prefix check's
    answers (the steps whose ids it held) until the request finishes."""
    held = []
    for token_id in ids:
        req.output_ids.append(token_id)
        req.update_finish_state()
        if req.finished():
            break
        held.append(req.check_match_stop_str_prefix())
    return held


def scheduler_lifecycle() -> dict[str, Any]:
    """A request's life under the plugin, on SGLang's real ``Req``: a retraction that drops
    its output ids (SGLang's ``req.output_ids = array("q")``) and one that cuts them, then
    the stop, spelled one token per character, completing after either; the prefix check
    holding exactly the ids of a partial stop; a request without stop strings and one with
    a stop regex answered as stock answers; a finished request freed with no garbage
    collection (no reference cycle), as stock's is."""
    import gc
    import weakref

    from detok_plugin.integrations.sglang import register

    register()
    tok = _tokenizer()
    chars = [i for c in STOP for i in enc(tok, c)]
    out: dict[str, Any] = {}
    req = _req(tok, "replaced", [STOP])
    _run_to_finish(req, enc(tok, "Hello there. ") + chars[:3])
    req.output_ids = array("q")  # a retraction that drops the output (disaggregated prefill, input embeds)
    before = enc(tok, "Hi again") + chars[:2]
    held = _run_to_finish(req, before + enc(tok, " x") + chars)
    out["replaced"] = {
        "reason": req.finished_reason.to_json() if req.finished_reason else None,
        "finished_len": req.finished_len, "expected_len": len(before) + len(enc(tok, " x")) + len(chars),
        "held": held, "expected_held": [False] * (len(before) - 2) + [True, True, False] + [True] * (len(chars) - 1),
    }
    req = _req(tok, "cut", [STOP])
    _run_to_finish(req, enc(tok, "Some words here") + chars[:4])
    del req.output_ids[2:]
    _run_to_finish(req, chars)
    out["cut"] = {"reason": req.finished_reason.to_json() if req.finished_reason else None,
                  "finished_len": req.finished_len, "expected_len": 2 + len(chars)}
    plain = _req(tok, "plain", None)
    out["no_stop_strings_held"] = _run_to_finish(plain, enc(tok, "a b\n\nUser: c"))
    regex = _req(tok, "regex", [STOP], stop_regex="U.er:")
    _run_to_finish(regex, enc(tok, "a b\n\nUser: c"))
    out["regex"] = {"reason": regex.finished_reason.to_json() if regex.finished_reason else None,
                    "own_methods": sorted(set(vars(regex)) & {"_check_str_based_finish", "check_match_stop_str_prefix"})}
    gc.disable()
    try:
        done = _req(tok, "freed", [STOP])
        _run_to_finish(done, enc(tok, "one") + chars)
        alive = weakref.ref(done)
        del done
        out["freed_without_gc"] = alive() is None
    finally:
        gc.enable()
    return out


def tokenizer_tables() -> dict[str, Any]:
    """Where each process's tokenizer table is built: SGLang's ``init_tokenizer`` of the
    detokenizer and, in the scheduler's process (which has imported its module), of the
    scheduler, wrapped by ``register()`` and put back by ``unregister()``; a scheduler's
    requests, with or without stop strings, start no build of their own."""
    import sglang.srt.managers.scheduler as scheduler_module
    from detok_plugin.integrations.common import tables
    from detok_plugin.integrations.common.patches import PATCHES
    from detok_plugin.integrations.sglang import register, unregister
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager

    owners = {"scheduler": scheduler_module.Scheduler, "detokenizer": DetokenizerManager}
    unregister()  # the earlier checks' registration
    stock = {name: owner.init_tokenizer for name, owner in owners.items()}
    register()
    wrapped = {name: PATCHES.is_ours(owner, "init_tokenizer") for name, owner in owners.items()}
    tables.join(timeout=120)  # the builds earlier checks started
    logs = io.StringIO()
    log = logging.getLogger("sglang.detok_plugin")
    handler = logging.StreamHandler(logs)
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        tok = _tokenizer()  # a new object: no table yet
        _run_to_finish(_req(tok, "no-stops", None), enc(tok, "a b c"))
        tables.join(timeout=120)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    unregister()
    restored = {name: owner.init_tokenizer is stock[name] for name, owner in owners.items()}
    register()
    return {
        "wrapped": wrapped, "restored": restored,
        "request_lines": [line for line in logs.getvalue().splitlines() if "tokenizer table" in line],
    }


def detokenizer_hand_over(rids: tuple[str, ...] = ("a", "b")) -> dict[str, Any]:
    """A request whose text stream raises goes on under SGLang's stock detokenizer, logged,
    and its joined text is still the whole decode; the other request of the batch (if any:
    a batch of one request takes its own path) is not touched; finished requests leave the
    plugin's state, as they leave stock's."""
    import types

    from detok_plugin.integrations.sglang import register
    register()
    tok = _tokenizer()
    m = detokenizer_manager(tok)
    context = enc(tok, "Q: ")
    ids = enc(tok, "Hi ") + byte_ids(tok, "你好🫨".encode()) + enc(tok, " ok")
    texts = dict.fromkeys(rids, "")
    rows = len(rids)
    logs = io.StringIO()
    logging.getLogger("sglang.detok_plugin").addHandler(logging.StreamHandler(logs))
    for step, token_id in enumerate(ids):
        last = step == len(ids) - 1
        batch = types.SimpleNamespace(
            rids=list(rids), decoded_texts=[""] * rows,
            decode_ids=[(context if step == 0 else []) + [token_id]] * rows,
            read_offsets=[len(context)] * rows,
            finished_reasons=[{"type": "length", "length": len(ids)} if last else None] * rows,
            no_stop_trim=[False] * rows, skip_special_tokens=[True] * rows, spaces_between_special_tokens=[True] * rows,
        )
        if step == 4:  # inside 你好's bytes
            faulty = m._detok_plugin_texts["a"]
            faulty.stream = _Raises(faulty.stream)
            faulty.push = faulty.stream.push_text
        for rid, text in zip(batch.rids, m._decode_batch_token_id_output(batch)):
            texts[rid] += text
    expected = tok.decode(context + ids, skip_special_tokens=True)[len(tok.decode(context, skip_special_tokens=True)) :]
    return {
        "texts": texts, "expected": expected, "logs": logs.getvalue(),
        "left": sorted(m._detok_plugin_texts), "stock_left": sorted(m.decode_status),
        "capacity": m._detok_plugin_texts.capacity,
    }


def everything() -> dict[str, Any]:
    """Every check, in one process (SGLang imports once): the broken contracts last."""
    os.environ["DETOK_PLUGIN"] = "1"
    return {
        "load_plugins": load_plugins(),
        "scheduler_hand_over": scheduler_hand_over(),
        "scheduler_lifecycle": scheduler_lifecycle(),
        "tokenizer_tables": tokenizer_tables(),
        "detokenizer_hand_over": detokenizer_hand_over(),
        "detokenizer_hand_over_alone": detokenizer_hand_over(("a",)),
        "broken_call": broken_call(),
        "broken_contract": broken_contract(),
    }


CHECKS = {
    f.__name__: f
    for f in (
        load_plugins, broken_contract, broken_call, scheduler_hand_over, scheduler_lifecycle, tokenizer_tables, detokenizer_hand_over,
        everything,
    )
}

if __name__ == "__main__":
    print(json.dumps(CHECKS[sys.argv[1]](), default=repr))
