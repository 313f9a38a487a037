"""vLLM's real ``OutputProcessor`` with detok-plugin switched on, against the full decode and
against stock vLLM (``detok_plugin.integrations.vllm``).

Engine outputs are replayed from real multilingual text tokenized by Qwen3 (byte-level BPE)
and Mistral v1 (SentencePiece with byte fallback), one and several tokens per step, many
requests interleaved in every step, as vLLM's own ``MockEngineCore`` does. The oracle is the
tokenizer's own decode (``helpers.expected``), cut where a stop string completes.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("vllm.v1.engine.output_processor", reason="vLLM is not installed")

import tokenizer_zoo  # noqa: E402
from detok_plugin.integrations import vllm as shim  # noqa: E402
from detok_plugin.integrations.vllm import _framework as vllm_framework  # noqa: E402
from detok_plugin.integrations.vllm import plugin as vllm_plugin  # noqa: E402
from helpers import MULTILINGUAL, expected, shown_by_a_server  # noqa: E402
from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402
from vllm.tokenizers.hf import get_cached_tokenizer  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.engine import detokenizer as vllm_detokenizer  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor  # noqa: E402
from vllm.v1.engine.parallel_sampling import ParentRequest  # noqa: E402

DELTA = RequestOutputKind.DELTA
CUMULATIVE = RequestOutputKind.CUMULATIVE
FINAL_ONLY = RequestOutputKind.FINAL_ONLY
KINDS = [pytest.param(k, id=k.name.lower()) for k in (DELTA, CUMULATIVE, FINAL_ONLY)]
TOKENIZERS = [pytest.param("qwen3", id="qwen3"), pytest.param("mistral_v1", id="mistral_v1")]
STEPS = [pytest.param(1, id="1-per-step"), pytest.param(3, id="3-per-step")]

# What the outputs continue: a chat turn, a Japanese turn, and nothing (the SentencePiece
# leading-space rule and byte-level merges across the prompt boundary both matter).
PROMPTS = ("User: write something.\nAssistant:", "Q: 続けてください。\nA:", "")


# --- fixtures: the tokenizer as vLLM holds it, and the switch ---------------------------


@functools.cache
def vllm_tokenizer(name: str) -> Any:
    """``name`` as vLLM's ``CachedHfTokenizer.from_pretrained`` hands it to OutputProcessor."""
    return get_cached_tokenizer(tokenizer_zoo.load(name))


@contextlib.contextmanager
def detokenizer(plugin: bool) -> Iterator[None]:
    """vLLM with the plugin switched on through its real entry point, or stock."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DETOK_PLUGIN", "1" if plugin else "0")
        assert shim.register() is plugin
        try:
            yield
        finally:
            shim.unregister()
    assert not shim.is_registered()


@pytest.fixture(autouse=True)
def _stock_after_each_test():
    yield
    shim.unregister()


# --- the replay engine --------------------------------------------------------------


@dataclass
class Req:
    """One request: its prompt, what the engine samples for each of its n sequences, and
    how the engine ends them (LENGTH, or STOP on a stop token / EOS: ``stop_token``)."""

    prompt: list[int]
    outs: list[list[int]]
    params: dict[str, Any] = field(default_factory=dict)
    stop_token: int | None = None
    eos: bool = False


@dataclass
class Seq:
    """What a client saw for one sequence: each output's text, the ids, how it ended."""

    texts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    kind: RequestOutputKind = DELTA

    @property
    def text(self) -> str:
        if self.kind == DELTA:
            return "".join(self.texts)
        return self.texts[-1] if self.texts else ""

    def cumulative(self) -> list[str]:
        """The text the client holds after each output."""
        if self.kind != DELTA:
            return list(self.texts)
        out, acc = [], ""
        for t in self.texts:
            acc += t
            out.append(acc)
        return out


def make_request(rid: str, req: Req, kind: RequestOutputKind) -> EngineCoreRequest:
    params = SamplingParams(
        n=len(req.outs), max_tokens=max(len(o) for o in req.outs), output_kind=kind, **req.params
    )
    return EngineCoreRequest(
        request_id=rid,
        external_req_id=rid,
        prompt_token_ids=list(req.prompt),
        mm_features=None,
        sampling_params=params,
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )


def add(op: OutputProcessor, rid: str, req: Req, kind: RequestOutputKind) -> dict[str, list[int]]:
    """Add ``req`` as AsyncLLM does (n > 1 fans out to children); internal id -> its ids."""
    request = make_request(rid, req, kind)
    if len(req.outs) == 1:
        op.add_request(request, None)
        return {rid: req.outs[0]}
    parent = ParentRequest(request)
    ids = {}
    for idx, out in enumerate(req.outs):
        child_id, child_params = parent.get_child_info(idx)
        child = copy.copy(request)
        child.request_id = child_id
        child.sampling_params = child_params
        op.add_request(child, None, parent, idx)
        ids[child_id] = out
    return ids


def replay(
    tokenizer: Any, reqs: Sequence[Req], *, kind: RequestOutputKind = DELTA, step: int = 1,
    op: OutputProcessor | None = None,
) -> list[list[Seq]]:
    """Run every request through one OutputProcessor, all interleaved in each engine step,
    ``step`` ids per request per step; stop when the engine has nothing left."""
    op = op or OutputProcessor(tokenizer, log_stats=False)
    live: dict[str, list[Any]] = {}  # internal id -> [ids, position, request]
    for i, req in enumerate(reqs):
        for cid, out in add(op, f"r{i}", req, kind).items():
            live[cid] = [out, 0, req]
    seqs: dict[tuple[str, int], Seq] = defaultdict(lambda: Seq(kind=kind))
    while live:
        outputs = []
        for cid, entry in list(live.items()):
            out, pos, req = entry
            chunk = out[pos : pos + step]
            entry[1] = pos + len(chunk)
            done = entry[1] >= len(out)
            stopped = done and (req.stop_token is not None or req.eos)
            outputs.append(
                EngineCoreOutput(
                    request_id=cid,
                    new_token_ids=list(chunk),
                    finish_reason=(FinishReason.STOP if stopped else FinishReason.LENGTH) if done else None,
                    stop_reason=req.stop_token if stopped and not req.eos else None,
                )
            )
            if done:
                del live[cid]
        processed = op.process_outputs(outputs)
        for cid in processed.reqs_to_abort:  # a stop string: the engine drops the request
            live.pop(cid, None)
        for ro in processed.request_outputs:
            for co in ro.outputs:
                seq = seqs[(ro.request_id, co.index)]
                seq.texts.append(co.text)
                if kind == DELTA:
                    seq.token_ids.extend(co.token_ids)
                else:
                    seq.token_ids = list(co.token_ids)
                seq.finish_reason, seq.stop_reason = co.finish_reason, co.stop_reason
    assert not op.has_unfinished_requests()
    return [[seqs[(f"r{i}", j)] for j in range(len(req.outs))] for i, req in enumerate(reqs)]


def run_both(name: str, reqs: Sequence[Req], **kw: Any) -> tuple[list[list[Seq]], list[list[Seq]]]:
    tok = vllm_tokenizer(name)
    with detokenizer(plugin=True):
        ours = replay(tok, reqs, **kw)
    with detokenizer(plugin=False):
        stock = replay(tok, reqs, **kw)
    return ours, stock


# --- the oracle ---------------------------------------------------------------------


@dataclass(frozen=True)
class Want:
    text: str
    token_ids: list[int]
    stop_reason: str | None  # a stop string, when one cut the text


def _first_stop(text: str, stops: Sequence[str], after: int) -> tuple[str, int, int] | None:
    """The stop completing earliest past ``after`` (ties: list order, as vLLM documents)."""
    best = None
    for s in stops:
        i = text.find(s, max(0, after - len(s) + 1))
        if i != -1 and (best is None or i + len(s) < best[2]):
            best = (s, i, i + len(s))
    return best


def want(tok: Any, req: Req, out: list[int]) -> Want:
    """The full decode, cut where vLLM's rules cut it.

    A stop string counts at the first token k > min_tokens whose ids complete it in the
    full decode (the characters ids[:k] decode to, as far as they agree with the full
    decode); the ids after k are dropped. A stop token that ended the stream contributes no
    text unless include_stop_str_in_output.
    """
    p = req.params
    skip = p.get("skip_special_tokens", True)
    stops = [p["stop"]] if isinstance(p.get("stop"), str) else list(p.get("stop") or ())
    include = p.get("include_stop_str_in_output", False)
    min_tokens = p.get("min_tokens", 0)
    terminated = req.stop_token is not None or req.eos
    ids = out[:-1] if terminated and not include else out
    full = expected(tok, req.prompt, ids, skip)
    done = 0
    for k in range(1, len(ids) + 1) if stops else ():
        upto = len(os.path.commonprefix([expected(tok, req.prompt, ids[:k], skip), full]))
        hit = _first_stop(full[:upto], stops, done)
        if hit and k > min_tokens:
            s, start, end = hit
            return Want(full[: end if include else start], list(out[:k]), s)
        done = upto
    return Want(shown_by_a_server(tok, req.prompt, ids, skip), list(out), None)  # vLLM drops a cut character


def encode(name: str, text: str) -> list[int]:
    return vllm_tokenizer(name).encode(text, add_special_tokens=False)


def corpus(name: str) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, output ids) for each multilingual text after each prompt."""
    tok = vllm_tokenizer(name)
    pairs = []
    for i, text in enumerate(MULTILINGUAL):
        prompt = PROMPTS[i % len(PROMPTS)]
        p = tok.encode(prompt, add_special_tokens=True) if prompt else []
        pairs.append((p, tok.encode(text + " " + MULTILINGUAL[(i + 3) % len(MULTILINGUAL)], add_special_tokens=False)))
    return pairs


def check(name: str, reqs: Sequence[Req], seqs: list[list[Seq]]) -> None:
    """Each sequence: text and ids as the oracle says; nothing taken back, no stray U+FFFD."""
    tok = vllm_tokenizer(name)
    for req, per_req in zip(reqs, seqs):
        for out, seq in zip(req.outs, per_req):
            w = want(tok, req, out)
            assert seq.text == w.text
            assert seq.token_ids == w.token_ids
            if w.stop_reason is not None:
                assert (seq.finish_reason, seq.stop_reason) == ("stop", w.stop_reason)
            held = seq.cumulative()
            for before, after in zip(held, held[1:]):
                assert after.startswith(before)  # nothing emitted is ever taken back
            for t in held:
                assert w.text.startswith(t)  # so a U+FFFD in a delta is one the decode has


# --- the switch ---------------------------------------------------------------------


def test_settings_read_the_flag_in_one_place():
    S = shim.Settings.from_env
    assert S({"DETOK_PLUGIN": "1"}).enabled and S({"DETOK_PLUGIN": "on"}).enabled
    assert not S({"DETOK_PLUGIN": "0", "VLLM_PLUGINS": "detok_plugin"}).enabled  # explicit off wins
    assert S({"VLLM_PLUGINS": "lora_filesystem_resolver,detok_plugin"}).enabled
    assert not S({"VLLM_PLUGINS": "lora_filesystem_resolver"}).enabled
    assert not S({}).enabled  # installed is not switched on
    odd = S({"DETOK_PLUGIN": "maybe", "VLLM_PLUGINS": "detok_plugin"})
    assert not odd.enabled and "DETOK_PLUGIN='maybe'" in odd.source


def test_an_odd_flag_value_warns_once_and_keeps_stock(monkeypatch, caplog):
    monkeypatch.setenv("DETOK_PLUGIN", "maybe")
    monkeypatch.setattr(vllm_plugin, "_Startup", vllm_plugin._StartupState())  # a fresh process
    with caplog.at_level(logging.DEBUG, logger="vllm.detok_plugin"):
        assert not shim.register()
        assert not shim.register()  # vLLM may call it again in the same process
    assert not shim.is_registered()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [
        "detok-plugin: off (DETOK_PLUGIN='maybe' is not one of 1/0/true/false/yes/no/on/off; ignored); "
        "vLLM keeps its stock detokenizer"
    ]


def test_entry_point_is_declared():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == shim.PLUGIN_NAME]
    assert ep.load() is shim.register


@pytest.mark.parametrize(
    "env, on",
    [
        pytest.param({"VLLM_PLUGINS": "detok_plugin"}, True, id="VLLM_PLUGINS-names-it"),
        pytest.param({"DETOK_PLUGIN": "1"}, True, id="DETOK_PLUGIN=1"),
        pytest.param({}, False, id="unset"),
        pytest.param({"VLLM_PLUGINS": "lora_filesystem_resolver"}, False, id="VLLM_PLUGINS-omits-it"),
    ],
)
def test_vllm_plugin_loader_switches_it(monkeypatch, env, on):
    """vLLM's own ``load_general_plugins`` reaches ``register`` and the flag decides."""
    import vllm.plugins

    monkeypatch.delenv("DETOK_PLUGIN", raising=False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()
    assert shim.is_registered() is on


@pytest.mark.parametrize("name", TOKENIZERS)
def test_plugin_is_in_the_path_only_when_on(name):
    tok = vllm_tokenizer(name)
    prompt, out = corpus(name)[0]
    req = Req(prompt, [out])
    for plugin in (True, False):
        with detokenizer(plugin):
            op = OutputProcessor(tok, log_stats=False)
            add(op, "r0", req, DELTA)
            made = op.request_states["r0"].detokenizer
            assert isinstance(made, shim.VllmDetokenizer) is plugin
            assert isinstance(made, vllm_detokenizer.FastIncrementalDetokenizer) is not plugin


@pytest.mark.parametrize("stop", [None, ["@@@"]], ids=["no-stops", "stops"])
def test_adapter_reuses_the_tokenizers_cached_table(monkeypatch, stop):
    """Per-request setup never rebuilds the table: it is cached per tokenizer object."""
    from detok_plugin import _table_build

    tok = vllm_tokenizer("qwen3")
    _table_build.build_table(tok)

    def rebuild(tokenizer):
        raise AssertionError("the table was rebuilt for a request")

    monkeypatch.setattr(_table_build, "_try_build", rebuild)
    prompt, out = corpus("qwen3")[0]
    with detokenizer(plugin=True):
        op = OutputProcessor(tok, log_stats=False)
        for i in range(3):
            add(op, f"r{i}", Req(prompt, [out], {"stop": stop}), DELTA)
        assert {op.request_states[f"r{i}"].detokenizer.path for i in range(3)} == {"byte_level"}


def test_steps_at_rest_do_not_call_into_the_reference_stream(monkeypatch):
    """The serving stream takes every id here itself: at rest by one lookup, the ids of a
    split character by the reference's own decoder (the first is not whole alone, the
    others meet held bytes), and an id whose text may start a stop, or that follows a stop
    partly matched (the id after the newline), by the boundary's remembered move or the
    reference's boundary. The reference's push_text is never called, and the text stays
    exact."""
    from detok_plugin import DetokenizerState

    calls = []
    real = DetokenizerState.push_text
    monkeypatch.setattr(DetokenizerState, "push_text", lambda self, i: calls.append(i) or real(self, i))
    tok = vllm_tokenizer("qwen3")
    words, emoji, newline = encode("qwen3", " hello small world"), encode("qwen3", "🫨"), encode("qwen3", "\n")
    assert len(emoji) == 3 and len(newline) == 1
    ids = [*words, *emoji, *words, *newline, *words]
    for kind in (DELTA, CUMULATIVE):
        det = shim.VllmDetokenizer(tok, make_request("r", Req(words, [ids], {"stop": ["\n\nUser:"]}), kind))
        calls.clear()
        text = ""
        for i in ids:
            assert det.update([i], False) is None
            text += det.get_next_output_text(False, True)
        text += det.get_next_output_text(True, True)
        assert text == tok.decode(words + ids)[len(tok.decode(words)) :]
        assert calls == [], kind


def test_resumable_requests_stay_stock():
    """A streaming-input session keeps one detokenizer across finished chunks; the plugin
    leaves those to vLLM's own."""
    tok = vllm_tokenizer("qwen3")
    prompt, out = corpus("qwen3")[0]
    with detokenizer(plugin=True):
        op = OutputProcessor(tok, log_stats=False)
        request = make_request("r0", Req(prompt, [out]), DELTA)
        request.resumable = True
        op.add_request(request, None)
        assert type(op.request_states["r0"].detokenizer) is vllm_detokenizer.FastIncrementalDetokenizer


def test_register_is_idempotent_and_unregister_restores_stock(monkeypatch):
    stock = vllm_detokenizer.IncrementalDetokenizer.__dict__["from_new_request"]
    monkeypatch.setenv("DETOK_PLUGIN", "1")
    assert shim.register() and shim.register()
    assert shim.is_registered()
    assert shim.unregister() and not shim.unregister()
    assert vllm_detokenizer.IncrementalDetokenizer.__dict__["from_new_request"] is stock


def test_the_on_line_waits_for_vllms_logging_and_goes_out_once_through_it(monkeypatch):
    """vLLM's API server loads plugins before it configures logging: the "on" line must not
    be dropped then, but come out through vLLM's own handler once vLLM configures it."""
    import io

    import vllm.logger as vllm_logger
    from vllm.config.logging import LoggingConfig

    vllm_root = logging.getLogger("vllm")
    saved = (vllm_root.handlers[:], vllm_root.propagate, vllm_root.level, logging.getLogRecordFactory())
    configure = vllm_logger.configure_logging
    monkeypatch.setattr(vllm_logger, "configure_logging", configure)
    monkeypatch.setenv("DETOK_PLUGIN", "1")
    shim.unregister()
    monkeypatch.setattr(vllm_plugin, "_Startup", vllm_plugin._StartupState())  # nothing earlier tests left waiting
    vllm_root.handlers = []
    out = io.StringIO()
    monkeypatch.setattr(vllm_logger.envs, "VLLM_LOGGING_STREAM", "ext://sys.stdout", raising=False)
    try:
        assert shim.register()
        assert shim.register()  # a second call in the same process says nothing more
        with contextlib.redirect_stdout(out):
            vllm_logger.configure_logging(LoggingConfig())
            logging.getLogger("vllm").handlers[0].flush()
        lines = [line for line in out.getvalue().splitlines() if "detok-plugin: on" in line]
        assert len(lines) == 1 and "INFO" in lines[0] and f"vLLM {vllm_framework.vllm_version()}" in lines[0]
        assert vllm_logger.configure_logging is configure  # vLLM's own function is back
        shim.unregister()
        # Off says so too, in one INFO line through vLLM's logging, once per process.
        vllm_root.handlers = []
        monkeypatch.setenv("DETOK_PLUGIN", "0")
        out = io.StringIO()
        assert not shim.register() and not shim.register()
        with contextlib.redirect_stdout(out):
            vllm_logger.configure_logging(LoggingConfig())
            logging.getLogger("vllm").handlers[0].flush()
        lines = [line for line in out.getvalue().splitlines() if "detok-plugin" in line]
        assert len(lines) == 1 and "INFO" in lines[0], lines
        assert lines[0].endswith("detok-plugin: off (DETOK_PLUGIN=0); vLLM keeps its stock detokenizer")
        assert vllm_logger.configure_logging is configure
    finally:
        vllm_root.handlers, vllm_root.propagate = saved[0], saved[1]
        vllm_root.setLevel(saved[2])
        logging.setLogRecordFactory(saved[3])
        shim.unregister()


def test_unverified_version_is_named_and_contract_checked(monkeypatch, caplog):
    monkeypatch.setenv("DETOK_PLUGIN", "1")
    monkeypatch.setattr(vllm_framework, "vllm_version", lambda: "9.9.9")
    with caplog.at_level(logging.WARNING, logger="vllm.detok_plugin"):
        assert shim.register()
    assert "vLLM 9.9.9 is not a version detok-plugin has verified" in caplog.text


def test_broken_contract_keeps_stock_and_says_why(monkeypatch, caplog):
    monkeypatch.setenv("DETOK_PLUGIN", "1")
    monkeypatch.setattr(vllm_framework, "vllm_version", lambda: "9.9.9")

    def update(self, new_token_ids, stop_terminated, extra):  # a future signature
        return None

    monkeypatch.setattr(vllm_detokenizer.IncrementalDetokenizer, "update", update)
    with caplog.at_level(logging.WARNING, logger="vllm.detok_plugin"):
        assert not shim.register()
    assert not shim.is_registered()
    assert "NOT switched on" in caplog.text and "IncrementalDetokenizer.update" in caplog.text


def test_adapter_mirrors_vllms_method_signatures():
    import inspect

    base = vllm_detokenizer.BaseIncrementalDetokenizer
    for name in ("update", "get_next_output_text", "num_output_tokens"):
        assert inspect.signature(getattr(shim.VllmDetokenizer, name)).parameters.keys() == (
            inspect.signature(getattr(base, name)).parameters.keys()
        )
    assert isinstance(inspect.getattr_static(shim.VllmDetokenizer, "output_token_ids"), property)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_adapter_is_an_incremental_detokenizer_with_stocks_public_attributes(name, kind):
    """What vLLM's factory returns with the plugin on is an IncrementalDetokenizer, and
    every public attribute a stock detokenizer has reads the same on it (output_text once
    the stream has ended: while it runs, stock's includes what its stop buffer holds)."""
    tok = vllm_tokenizer(name)
    prompt, out = corpus(name)[0]
    req = Req(prompt, [out], params={"stop": ["\n\nUser:", "。"], "min_tokens": 2})
    built = {}
    for plugin in (False, True):
        with detokenizer(plugin):
            d = vllm_detokenizer.IncrementalDetokenizer.from_new_request(tok, make_request("r", req, kind))
            for k in range(0, len(out), 3):
                if d.update(out[k : k + 3], False) is not None:
                    break
            d.get_next_output_text(True, False)
            built[plugin] = d
    stock, ours = built[False], built[True]
    assert isinstance(ours, vllm_detokenizer.IncrementalDetokenizer) and isinstance(ours, shim.VllmDetokenizer)
    public = {a for a in dir(stock) if not a.startswith("_")} - {"from_new_request"}
    # Stock's own machinery, not its contract: the tokenizers DecodeStream and its helpers.
    machinery = {"stream", "decode_next", "last_special", "added_token_ids", "prefix_offset", "read_offset",
                 "tokens", "prompt_len"}
    for attr in sorted(public - machinery):
        value = getattr(stock, attr)
        if callable(value):
            assert callable(getattr(ours, attr)), attr
            continue
        if attr == "tokenizer":  # stock keeps the Rust tokenizer or the wrapper; ours the wrapper
            assert getattr(ours, attr) is tok
            continue
        assert getattr(ours, attr) == value, attr


# --- exactness through the real OutputProcessor -------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("name", TOKENIZERS)
def test_many_requests_interleaved_equal_the_full_decode(name, step, kind):
    reqs = [Req(p, [o], {"skip_special_tokens": skip}) for (p, o) in corpus(name) for skip in (True, False)]
    with detokenizer(plugin=True):
        seqs = replay(vllm_tokenizer(name), reqs, kind=kind, step=step)
    check(name, reqs, seqs)


def _stop_reqs(name: str, **params: Any) -> list[Req]:
    """For each text, stops taken from inside its output (two of them), one that a chat
    transcript would use, one absent. Stops may end inside byte-fallback runs."""
    tok = vllm_tokenizer(name)
    reqs = []
    for prompt, out in corpus(name):
        text = expected(tok, prompt, out)
        stops = []
        for at, size in ((len(text) // 2, 3), (len(text) // 4, 2)):
            stops.append(text[at : at + size])
        reqs.append(Req(prompt, [out], {"stop": stops + ["\n\nUser:", "@@@@"], **params}))
    return reqs


@pytest.mark.parametrize("include", [False, True], ids=["exclude-stop", "include-stop"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("name", TOKENIZERS)
def test_stop_strings(name, step, kind, include):
    reqs = _stop_reqs(name, include_stop_str_in_output=include)
    with detokenizer(plugin=True):
        seqs = replay(vllm_tokenizer(name), reqs, kind=kind, step=step)
    check(name, reqs, seqs)
    assert all(s[0].finish_reason == "stop" for s in seqs)


@pytest.mark.parametrize("min_tokens", [0, 4, 12])
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("name", TOKENIZERS)
def test_min_tokens_delays_stop_strings(name, step, min_tokens):
    tok = vllm_tokenizer(name)
    reqs = []
    for prompt, out in corpus(name):
        text = expected(tok, prompt, out)
        reqs.append(Req(prompt, [out], {"stop": [text[1:3], " "], "min_tokens": min_tokens}))
    with detokenizer(plugin=True):
        seqs = replay(tok, reqs, step=step)
    check(name, reqs, seqs)


def test_min_tokens_with_a_stop_inside_a_byte_run_agrees_with_stock():
    """Mistral v1 writes newlines as byte pieces (one run for "\\n\\n"): a newline that
    showed by token min_tokens does not stop the stream later, in the plugin as in stock
    vLLM, whose stream shows a run's characters as they come."""
    name = "mistral_v1"
    tok = vllm_tokenizer(name)
    prompt, out = next((p, o) for p, o in corpus(name) if "tabs\n\n" in expected(tok, p, o))
    newlines = [k for k, i in enumerate(out) if tok.convert_ids_to_tokens(i) == "<0x0A>"]
    first = next(k for k in newlines if k + 1 in newlines)  # the run's first byte piece
    reqs = [Req(prompt, [out], {"stop": ["\n"], "min_tokens": m}) for m in range(first - 1, first + 3)]
    ours, stock = run_both(name, reqs)
    check(name, reqs, ours)
    assert [s[0].text for s in ours] == [s[0].text for s in stock]


@pytest.mark.parametrize("include", [False, True], ids=["exclude-stop", "include-stop"])
@pytest.mark.parametrize("skip", [True, False], ids=["skip-special", "keep-special"])
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("name", TOKENIZERS)
def test_stop_token_ids_and_eos_end_in_the_engine(name, step, skip, include):
    """The engine ends the stream on a stop token or EOS (stop_terminated); the last id is
    kept, and its text only with include_stop_str_in_output."""
    tok = vllm_tokenizer(name)
    eos = tok.eos_token_id
    stop_token = encode(name, "。")[-1]
    reqs = []
    for i, (prompt, out) in enumerate(corpus(name)):
        params = {"skip_special_tokens": skip, "include_stop_str_in_output": include}
        if i % 2:
            reqs.append(Req(prompt, [out + [eos]], params, eos=True))
        else:
            reqs.append(Req(prompt, [out + [stop_token]], {**params, "stop_token_ids": [stop_token]}, stop_token=stop_token))
    with detokenizer(plugin=True):
        seqs = replay(tok, reqs, step=step)
    check(name, reqs, seqs)
    for req, (seq,) in zip(reqs, seqs):
        assert seq.finish_reason == "stop"
        assert seq.stop_reason == req.stop_token


@pytest.mark.parametrize("spaces", [True, False], ids=["spaces", "no-spaces"])
@pytest.mark.parametrize("name", TOKENIZERS)
def test_special_tokens_in_the_output(name, spaces):
    tok = vllm_tokenizer(name)
    specials = [i for i in sorted(tok.all_special_ids)][:3]
    reqs = []
    for prompt, out in corpus(name):
        mixed = out[:3] + specials + out[3:6] + specials[:1] + specials[:1] + out[6:]
        for skip in (True, False):
            reqs.append(Req(prompt, [mixed], {"skip_special_tokens": skip, "spaces_between_special_tokens": spaces}))
    with detokenizer(plugin=True):
        seqs = replay(tok, reqs, step=2)
    check(name, reqs, seqs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", TOKENIZERS)
def test_n_greater_than_one(name, kind):
    """Parallel sampling: n children per request, each its own stream, aggregated by vLLM."""
    pairs = corpus(name)
    reqs = [
        Req(p, [o, pairs[(i + 1) % len(pairs)][1], o[: len(o) // 2]], {"stop": ["@@@", "。"]})
        for i, (p, o) in enumerate(pairs)
    ]
    with detokenizer(plugin=True):
        seqs = replay(vllm_tokenizer(name), reqs, kind=kind, step=2)
    check(name, reqs, seqs)
    assert all(len(s) == 3 for s in seqs)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_detokenize_false_yields_ids_and_no_text(name):
    reqs = [Req(p, [o], {"detokenize": False, "skip_special_tokens": False}) for p, o in corpus(name)]
    for plugin in (True, False):
        with detokenizer(plugin):
            seqs = replay(vllm_tokenizer(name), reqs, kind=CUMULATIVE, step=2)
        for req, (seq,) in zip(reqs, seqs):
            assert seq.text == "" and seq.token_ids == req.outs[0] and seq.finish_reason == "length"


def test_stream_interval_batches_outputs():
    name = "qwen3"
    reqs = _stop_reqs(name)
    with detokenizer(plugin=True):
        op = OutputProcessor(vllm_tokenizer(name), log_stats=False, stream_interval=4)
        seqs = replay(vllm_tokenizer(name), reqs, step=1, op=op)
    check(name, reqs, seqs)


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("stop", [["@@@"], None], ids=["stops", "no-stops"])
def test_out_of_vocabulary_id_is_skipped_like_decode_and_logged(caplog, stop, step, name):
    """A model's padded vocabulary can sample an id past the tokenizer: the decode skips
    it; the stream must not fail the server, and says what it skipped. Also inside a split
    character or a SentencePiece byte run, and on a second pass that walks the tables the
    first learnt (the state then rebuilds a run from ids that include the unknown one)."""
    tok = vllm_tokenizer(name)
    bad = len(tok) + 7
    reqs, insides = [], 0
    for prompt, out in corpus(name)[:6]:
        reqs.append(Req(prompt, [out[:5] + [bad] + out[5:]], {"stop": stop}))
        inside = [k for k in range(1, len(out)) if tok.decode(prompt + out[:k]).endswith("\ufffd")]
        if inside:
            insides += 1
            reqs.append(Req(prompt, [out[: inside[0]] + [bad] + out[inside[0] :]], {"stop": stop}))
    assert insides >= 2
    with detokenizer(plugin=True), caplog.at_level(logging.WARNING, logger="vllm.detok_plugin"):
        for _ in range(2):
            check(name, reqs, replay(tok, reqs, step=step))
    assert f"token id {bad}" in caplog.text


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("kind", [DELTA, CUMULATIVE], ids=["delta", "cumulative"])
@pytest.mark.parametrize("ending", ["length", "stop-string", "stop-token"])
@pytest.mark.parametrize("step", STEPS)
def test_the_call_vllm_does_not_make_is_answered_exactly(name, kind, ending, step):
    """vLLM asks a DELTA request for deltas and the others for the whole text, and the
    adapter keeps text for that call only; the other call is answered exactly too. Three
    adapters on one request: asked only for deltas, only for the whole text, and the two
    calls in turn; after every step they agree with the deltas joined, and at the end with
    the full decode."""
    tok = vllm_tokenizer(name)
    prompt, out = corpus(name)[1]
    full = expected(tok, prompt, out, True)
    params: dict[str, Any] = {}
    if ending == "stop-string":
        params["stop"] = [full[len(full) // 2 : len(full) // 2 + 2]]
    req = Req(prompt, [out], params, stop_token=out[-1] if ending == "stop-token" else None)
    request = make_request("r0", req, kind)
    with detokenizer(plugin=True):
        by_delta, whole, mixed = (vllm_detokenizer.IncrementalDetokenizer.from_new_request(tok, request) for _ in range(3))
    assert isinstance(by_delta, shim.VllmDetokenizer)
    joined, mixed_joined, stopped = "", "", None
    for k, pos in enumerate(range(0, len(out), step)):
        chunk = out[pos : pos + step]
        terminated = ending == "stop-token" and pos + step >= len(out)
        stopped = by_delta.update(list(chunk), terminated)
        assert whole.update(list(chunk), terminated) == stopped == mixed.update(list(chunk), terminated)
        finished = stopped is not None or terminated or pos + step >= len(out)
        joined += by_delta.get_next_output_text(finished, delta=True)
        assert whole.get_next_output_text(finished, delta=False) == joined
        if k % 3 == 2:
            assert mixed.get_next_output_text(finished, delta=False) == joined
        else:
            mixed_joined += mixed.get_next_output_text(finished, delta=True)
            assert mixed_joined == joined
        if finished:
            break
    w = want(tok, req, out)
    assert (w.stop_reason is not None) is (ending == "stop-string")
    assert (joined, by_delta.output_token_ids, stopped) == (w.text, w.token_ids, w.stop_reason)
    assert whole.output_token_ids == by_delta.output_token_ids == mixed.output_token_ids


# --- where stock vLLM and the plugin differ: stock is the one that is wrong ----------


@pytest.mark.parametrize("name", TOKENIZERS)
def test_ordinary_text_agrees_with_stock(name):
    """On the corpus with no stops, stock and plugin end with the same texts and ids: the
    differences are the named cases below, and timing."""
    reqs = [Req(p, [o], {"skip_special_tokens": skip}) for (p, o) in corpus(name) for skip in (True, False)]
    for kind in (DELTA, CUMULATIVE):
        ours, stock = run_both(name, reqs, kind=kind, step=2)
        for (a,), (b,) in zip(ours, stock):
            assert (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason)


def _mid_char_prompt(name: str) -> Req:
    """The prompt ends inside a character that the output completes (a client that sends
    ids, a template cut on a byte boundary)."""
    ids = encode(name, "答えは🫨です。続けて、ゆっくり考えてください。")
    cut = next(k for k in range(1, len(ids)) if "\ufffd" in vllm_tokenizer(name).decode(ids[:k]))
    return Req(ids[:cut], [ids[cut:]])


def _length_mid_char(name: str) -> Req:
    """max_tokens lands inside a character."""
    ids = encode(name, "答えは🫨です")
    cut = next(k for k in range(1, len(ids)) if vllm_tokenizer(name).decode(ids[:k]).endswith("\ufffd"))
    return Req(encode(name, "Q:"), [ids[:cut]])


def _held_stop_prefix(name: str) -> Req:
    """A long stop string is configured and never comes near."""
    prompt, out = corpus(name)[3]
    return Req(prompt, [out], {"stop": ["<|the-end-of-this-answer|>"]})


def _first_token_with(name: str, ids: list[int], prefix: str) -> int:
    tok = vllm_tokenizer(name)
    return next(k for k in range(1, len(ids) + 1) if tok.decode(ids[:k]).startswith(prefix))


def _stop_before_split_char(name: str) -> Req:
    """The token that completes the stop also starts a character the next token ends."""
    ids = encode(name, "🫨 👨 ok")
    return Req(encode(name, "Q:"), [ids], {"stop": [" "]})


def _stop_within_min_tokens(name: str) -> Req:
    """A stop completed by token min_tokens (does not count), and a longer one completed
    after it (counts): vLLM's rule stops on the second."""
    ids = encode(name, "🫨 👨 ok")
    return Req(encode(name, "Q:"), [ids], {"stop": [" 👨", " "], "min_tokens": _first_token_with(name, ids, "🫨 ")})


def _stray_byte(name: str) -> Req:
    """A complete byte-fallback character followed by a stray continuation byte: the
    tokenizer decodes the whole byte run as one U+FFFD per byte."""
    tok = vllm_tokenizer(name)
    ids = encode(name, "ok 🫨")[1:] + tok.convert_tokens_to_ids(["<0x80>"]) + encode(name, "ok")
    return Req(encode(name, "Q:"), [ids])


@dataclass(frozen=True)
class StockError:
    """A case where stock vLLM and the plugin differ, and what stock gets wrong."""

    build: Any
    field: str  # the Seq field where stock is wrong, or "timing"
    why: str
    tokenizers: tuple[str, ...] = ("qwen3", "mistral_v1")


#: Every difference from stock vLLM the tests know of, by name.
STOCK_WRONG: dict[str, StockError] = {
    "prompt_ends_mid_character": StockError(
        _mid_char_prompt, "text",
        "stock repeats prompt text in the output: its DecodeStream, primed with a prompt that "
        "ends inside a character, emits the prompt's last characters again",
    ),
    "held_stop_prefix": StockError(
        _held_stop_prefix, "timing",
        "stock holds max(len(stop)) - 1 characters back at every step, with no partial stop in "
        "sight; the plugin holds only a genuine partial match (same final text)",
    ),
    "stop_before_split_character": StockError(
        _stop_before_split_char, "token_ids",
        "stock keeps an id past the one completing the stop: its DecodeStream holds a token's "
        "complete characters while the token's last character is incomplete",
        ("qwen3",),
    ),
    "stop_within_min_tokens": StockError(
        _stop_within_min_tokens, "stop_reason",
        "stock stops on a stop string completed by token min_tokens, which vLLM's own rule says "
        "does not count (same root: it sees that token's text one token late)",
        ("qwen3",),
    ),
    "stray_byte_after_complete_character": StockError(
        _stray_byte, "timing",
        "stock streams a byte-fallback character that the decode then renders as U+FFFD, and "
        "its DecodeStream resets (vllm-project/vllm#17448); it cannot take the text back",
        ("mistral_v1",),
    ),
}

_STOCK_CASES = [
    pytest.param(name, case, id=f"{name}-{case}")
    for case, err in STOCK_WRONG.items()
    for name in err.tokenizers
]


@pytest.mark.parametrize("name, case", _STOCK_CASES)
def test_where_stock_differs_stock_is_wrong(name, case):
    err = STOCK_WRONG[case]
    req = err.build(name)
    ours, stock = run_both(name, [req], kind=DELTA, step=1)
    check(name, [req], ours)  # the plugin is right on every field
    a, b = ours[0][0], stock[0][0]
    w = want(vllm_tokenizer(name), req, req.outs[0])
    if err.field == "timing":
        held_a, held_b = a.cumulative(), b.cumulative()
        behind = [(x, y) for x, y in zip(held_a, held_b) if not w.text.startswith(y)]
        late = [k for k, (x, y) in enumerate(zip(held_a, held_b)) if len(x) > len(y)]
        assert behind or late, "no difference left: drop the case"
        assert all(len(x) >= len(y) for x, y in zip(held_a, held_b) if w.text.startswith(y))
    else:
        assert getattr(b, err.field) != getattr(w, err.field)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_length_cut_mid_character_shows_what_stock_shows(name):
    """max_tokens lands inside a character: the decode ends in U+FFFD, which vLLM never
    releases; the plugin drops it too (docs/design.md, "A character cut by max_tokens")."""
    req = _length_mid_char(name)
    ours, stock = run_both(name, [req], kind=DELTA, step=1)
    check(name, [req], ours)
    tok = vllm_tokenizer(name)
    assert expected(tok, req.prompt, req.outs[0], True).endswith("\ufffd")
    assert ours[0][0].text == stock[0][0].text == shown_by_a_server(tok, req.prompt, req.outs[0], True)
    assert "\ufffd" not in ours[0][0].text


@pytest.mark.parametrize("name", TOKENIZERS)
def test_stock_agrees_elsewhere_on_the_stop_corpus(name):
    """Stops, min_tokens, stop tokens: where stock's final text, ids or stop reason differ
    from the plugin's, the request is one of the named cases' kind (checked by oracle)."""
    tok = vllm_tokenizer(name)
    reqs = _stop_reqs(name) + _stop_reqs(name, include_stop_str_in_output=True)
    ours, stock = run_both(name, reqs, step=1)
    check(name, reqs, ours)
    for req, (a,), (b,) in zip(reqs, ours, stock):
        assert a.text == b.text
        if (a.token_ids, a.stop_reason) != (b.token_ids, b.stop_reason):
            w = want(tok, req, req.outs[0])
            assert (b.token_ids, b.stop_reason) != (w.token_ids, w.stop_reason)


def test_stop_ending_in_byte_fallback_run():
    """The stop ends at the byte that completes it (the core scans a held byte run as if
    final when a stop could end there), so vLLM keeps exactly the ids up to it."""
    name = "mistral_v1"
    ids = encode(name, "aᄀ b")  # ▁a <0xE1> <0x84> <0x80> ▁b
    req = Req(encode(name, "Q:"), [ids], {"stop": ["ᄀ"]})
    with detokenizer(plugin=True):
        seqs = replay(vllm_tokenizer(name), [req], step=len(ids))
    assert seqs[0][0].token_ids == ids[:4]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_stop_tie_follows_list_order(name):
    """Two stops ending on the same character: the first in list order, as stock ranks them."""
    req = Req(encode(name, "Q:"), [encode(name, " The abc song")], {"stop": ["bc", "abc"]})
    with detokenizer(plugin=True):
        seqs = replay(vllm_tokenizer(name), [req], step=1)
    assert (seqs[0][0].text, seqs[0][0].stop_reason) == (" The a", "bc")
