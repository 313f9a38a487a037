"""The differential fuzz's host layers (``fuzz.py``): the vLLM adapter inside vLLM's real
``OutputProcessor``, and the TGI shim's ``RequestText``, checked as ``_fuzz_layers`` checks
the core's streams.

vLLM is driven as ``tests/integrations/vllm/test_vllm_integration.py`` drives it: an
``EngineCoreRequest`` per stream, engine outputs replayed one or several ids per step, the
engine ending the stream at its length or on a stop token or EOS (which the detokenizer
is not fed unless ``include_stop_str_in_output``), DELTA or CUMULATIVE outputs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
from collections.abc import Iterator
from typing import Any

from _fuzz_cases import Case, Tok
from _fuzz_layers import Check, _chunks
from _fuzz_oracle import Opts, Oracle, reference, released, whole


def vllm_missing() -> str | None:
    """Why the vLLM layer cannot run here, or None."""
    try:
        import vllm.v1.engine.output_processor  # noqa: F401
    except ImportError as exc:
        return f"vLLM is not installed ({exc}): pip install detok-plugin[vllm]"
    return None


@contextlib.contextmanager
def vllm_plugin_on() -> Iterator[None]:
    """vLLM's detokenizer factory is the plugin's while the block runs (switched on through
    its real entry point, ``DETOK_PLUGIN=1``), and stock again after."""
    from detok_plugin.integrations import vllm as shim

    saved = os.environ.get("DETOK_PLUGIN")
    os.environ["DETOK_PLUGIN"] = "1"
    try:
        if not shim.register():
            raise RuntimeError("the vLLM plugin did not switch on")
        yield
    finally:
        shim.unregister()
        if saved is None:
            os.environ.pop("DETOK_PLUGIN", None)
        else:
            os.environ["DETOK_PLUGIN"] = saved


@functools.cache
def _vllm() -> Any:
    """vLLM's modules."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.tokenizers.hf import get_cached_tokenizer
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor

    return RequestOutputKind, SamplingParams, get_cached_tokenizer, EngineCoreOutput, EngineCoreRequest, FinishReason, OutputProcessor


@functools.cache
def _vllm_tokenizer(name: str, tok: Any) -> Any:
    return _vllm()[2](tok)


def vllm(c: Case, t: Tok) -> list[str]:
    """One request through vLLM's ``OutputProcessor`` with the plugin's detokenizer (inside
    ``vllm_plugin_on``)."""
    from detok_plugin.integrations.vllm import VllmDetokenizer

    Kind, SamplingParams, _, EngineCoreOutput, EngineCoreRequest, FinishReason, OutputProcessor = _vllm()
    rng = random.Random(c.extra)
    kind = Kind.DELTA if rng.random() < 0.6 else Kind.CUMULATIVE
    out, end = list(c.out), rng.choice(("length", "stop_token", "eos"))
    if end == "eos" and t.eos:
        out.append(t.eos[0])
    elif end == "eos":
        end = "length"
    terminated = end != "length"
    engine_stop = out[-1] if end == "stop_token" else None
    m = min(c.min_tokens, len(out) - 1) if terminated else min(c.min_tokens, len(out))
    o = Oracle(t.tok, c.prompt, out, c.skip, c.spaces, t.probes)
    opts = Opts(c.stops, include=c.include, min_tokens=m, last_is_stop=terminated)
    want = reference(o, opts, None, c.skip)
    if not isinstance(want.stop_reason, str):  # ended by the engine: vLLM drops a cut character
        k_text = next(k for k in (want.taken, want.taken - 1) if k >= 0 and o.text(k) == want.text)
        want = want._replace(text=whole(o, k_text, t.tok, c.skip))
    params = SamplingParams(
        n=1, max_tokens=len(out), output_kind=kind, stop=list(c.stops), include_stop_str_in_output=c.include,
        min_tokens=m, skip_special_tokens=c.skip, spaces_between_special_tokens=c.spaces,
    )
    request = EngineCoreRequest(
        request_id="r", external_req_id="r", prompt_token_ids=list(c.prompt), mm_features=None, sampling_params=params,
        pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
    )
    op = OutputProcessor(_vllm_tokenizer(t.name, t.tok), log_stats=False)
    op.add_request(request, None)
    if not isinstance(op.request_states["r"].detokenizer, VllmDetokenizer):
        return ["vLLM built its stock detokenizer: the plugin is not on (run inside vllm_plugin_on)"]
    check, joined, token_ids, finish = Check(o, want), "", [], (None, None)  # type: ignore[var-annotated]
    steps = [ids for _, ids in _chunks(c._replace(out=out, chunks=c.chunks + (1,)))]
    k = 0
    for n, ids in enumerate(steps):
        k += len(ids)
        done = n == len(steps) - 1
        stopped = done and terminated
        processed = op.process_outputs([EngineCoreOutput(
            request_id="r", new_token_ids=list(ids),
            finish_reason=(FinishReason.STOP if stopped else FinishReason.LENGTH) if done else None,
            stop_reason=engine_stop if stopped else None,
        )])
        for ro in processed.request_outputs:
            (co,) = ro.outputs
            if kind == Kind.DELTA:
                joined += co.text
                token_ids += co.token_ids
            else:
                if not co.text.startswith(joined):
                    check.problems.append(f"CUMULATIVE text went back: {co.text!r} after {joined!r}")
                joined, token_ids = co.text, list(co.token_ids)
            finish = (co.finish_reason, co.stop_reason)
        live = finish[0] is None and not processed.reqs_to_abort
        check.step(joined, k, live, released(o, k, opts, None, c.skip) if live else None)
        if not live:
            break
    if op.has_unfinished_requests():
        check.problems.append("the request is still unfinished")
    want_reason = want.stop_reason if want.stop_reason is not None or not terminated else engine_stop
    check.eq("text", joined, want.text)
    check.eq("finish", finish, (want.finish_reason or "length", want_reason))
    check.eq("token_ids", token_ids, out[: want.taken])
    return check.problems


def tgi(c: Case, t: Tok) -> list[str]:
    """One request's ``RequestText`` (the TGI shim's text and stop decision): stops (one
    may be a special token's text, matched on its id), EOS, ``max_new_tokens``, the kept stop."""
    from detok_plugin.integrations.tgi.request import (
        FINISH_EOS_TOKEN,
        FINISH_LENGTH,
        FINISH_STOP_SEQUENCE,
        RequestText,
        Settings,
        special_stop_ids,
    )

    rng = random.Random(c.extra)
    out, stops = list(c.out), list(c.stops)
    if t.special and rng.random() < 0.25:  # a stop that is a special token's text
        sp = rng.choice(t.special)
        out.insert(rng.randrange(len(out) + 1), sp)
        stops.append(t.tok.convert_ids_to_tokens(sp))
    max_new = min(c.max_tokens or len(out), len(out))
    r = RequestText.build(
        t.tok, c.prompt, stop_sequences=stops, eos_token_ids=c.eos, max_new_tokens=max_new,
        settings=Settings(keep_stop=c.include),
    )
    o = Oracle(t.tok, c.prompt, out, True, True, t.probes)
    kept = tuple(s for s in stops if s)
    stop_ids = frozenset(c.eos) | frozenset(special_stop_ids(t.tok, kept))
    opts = Opts(kept, stop_ids, frozenset(c.eos), c.include, 0, max_new)
    want = reference(o, opts, None, True)
    check, code = Check(o, want), None
    for k, tid in enumerate(out, 1):
        code = r.push(tid)
        check.step(r.text, k, code is None, released(o, k, opts, None, True) if code is None else None)
        if code is not None:
            break
    if want.finish_reason != "stop":
        want_code = FINISH_LENGTH
    else:
        want_code = FINISH_STOP_SEQUENCE if want.stop_reason is not None else FINISH_EOS_TOKEN
    check.eq("text", r.text, want.text)
    check.eq("finish code", code, want_code)
    check.eq("ids taken", r.generated_tokens, want.taken)
    check.eq("texts per id", len(r.texts), want.taken)
    return check.problems
