"""A request's setup inside vLLM's real ``OutputProcessor``: ``add_request`` builds the
plugin's detokenizer without reading the prompt, and the stream opens at the request's
first ids (``VllmDetokenizer._open``), where stock vLLM decodes the prompt too.

Pinned here: what vLLM reads before any id (no ids, no text; an abort before the first id
sends what stock sends); every shape a first step can take (one id, several, a stop token
with and without ``include_stop_str_in_output``, an empty step first, a stop string inside
the first step, ``path`` read before it) streams invariant 1's text and keeps vLLM's ids;
and a prompt the stream cannot open on is found at the first step, where the request stays
stock (stock's own outputs, one ERROR line), as it did when the stream opened in add_request.
Before any request: the tokenizer's table, built when vLLM builds its ``OutputProcessor``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("vllm.v1.engine.output_processor", reason="vLLM is not installed: pip install detok-plugin[vllm]")

import tokenizer_zoo  # noqa: E402
from detok_plugin.integrations import vllm as shim  # noqa: E402
from detok_plugin.integrations.common import tables  # noqa: E402
from helpers import MULTILINGUAL, expected, shown_by_a_server  # noqa: E402
from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402
from vllm.tokenizers.hf import get_cached_tokenizer  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector  # noqa: E402

#: vLLM's own ``OutputProcessor.__init__`` (the plugin wraps it while registered).
STOCK_INIT = OutputProcessor.__init__

LOGGER = "vllm.detok_plugin"
KINDS = [pytest.param(kind, id=kind.name) for kind in RequestOutputKind]
NAMES = [pytest.param(name, id=name) for name in tokenizer_zoo.NAMES]


@pytest.fixture(scope="module", params=NAMES)
def tok(request: pytest.FixtureRequest) -> Any:
    return get_cached_tokenizer(tokenizer_zoo.load(request.param))


@contextmanager
def plugin(on: bool) -> Iterator[None]:
    """The plugin through its entry point while requests are added, or vLLM stock."""
    if not on:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DETOK_PLUGIN", "1")
        assert shim.register()
        try:
            yield
        finally:
            shim.unregister()


def _ids(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)  # type: ignore[no-any-return]


def _request(prompt: list[int], kind: RequestOutputKind = RequestOutputKind.DELTA, **params: Any) -> EngineCoreRequest:
    params.setdefault("max_tokens", 256)
    return EngineCoreRequest(
        request_id="r", external_req_id="r", prompt_token_ids=prompt, mm_features=None,
        sampling_params=SamplingParams(output_kind=kind, **params), pooling_params=None, arrival_time=0.0,
        lora_request=None, cache_salt=None, data_parallel_rank=None,
    )


class Run:
    """One request through an ``OutputProcessor`` with a queue (as ``AsyncLLM`` keeps one):
    its text, ids and finish, as the client gets them."""

    def __init__(self, tok: Any, request: EngineCoreRequest, *, on: bool) -> None:
        self.kind = request.sampling_params.output_kind  # type: ignore[union-attr]
        self.queue = RequestOutputCollector(self.kind, "r")
        self.op = OutputProcessor(tok, log_stats=False)
        with plugin(on):
            self.op.add_request(request, None, queue=self.queue)
        self.text, self.token_ids, self.finish = "", [], (None, None)  # type: str, list[int], tuple[Any, Any]

    @property
    def detokenizer(self) -> Any:
        return self.op.request_states["r"].detokenizer

    def step(self, ids: list[int], finish: FinishReason | None = None) -> None:
        self.op.process_outputs([EngineCoreOutput(request_id="r", new_token_ids=ids, finish_reason=finish)])
        self._take()

    def abort(self) -> None:
        self.op.abort_requests(["r"], internal=True)
        self._take()

    def _take(self) -> None:
        out = self.queue.get_nowait()
        if out is None:
            return
        (co,) = out.outputs
        cumulative = self.kind != RequestOutputKind.DELTA
        self.text = co.text if cumulative else self.text + co.text
        self.token_ids = list(co.token_ids) if cumulative else self.token_ids + list(co.token_ids)
        self.finish = (co.finish_reason, co.stop_reason)


@pytest.mark.parametrize("kind", KINDS)
def test_before_its_first_id_a_request_has_no_ids_and_an_abort_sends_what_stock_sends(tok: Any, kind: Any) -> None:
    prompt = _ids(tok, MULTILINGUAL[0])
    ours, stock = Run(tok, _request(prompt, kind), on=True), Run(tok, _request(prompt, kind), on=False)
    det = ours.detokenizer
    assert isinstance(det, shim.VllmDetokenizer)
    assert (det.num_output_tokens(), det.output_token_ids) == (0, [])
    ours.abort()
    stock.abort()
    assert (ours.text, ours.token_ids, ours.finish) == (stock.text, stock.token_ids, stock.finish) == ("", [], ("abort", None))


def _eos(tok: Any) -> int:
    return tok.eos_token_id  # type: ignore[no-any-return]


# Each shape of a request's first steps: (steps of output ids, whether the last id is a stop
# token the engine ended on, include_stop_str_in_output, read ``path`` before the first step).
SHAPES = {
    "one-id": ([1], False, False, False),
    "several-ids": ([5, 1], False, False, False),
    "all-in-one-step": ([40], False, False, False),
    "stop-token-alone": ([1], True, False, False),
    "stop-token-in-a-step": ([4], True, False, False),
    "stop-token-kept": ([3, 1], True, True, False),
    "empty-step-first": ([0, 0, 2, 1], False, False, False),
    "path-read-first": ([1, 3], False, False, True),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_first_step_streams_the_decode(tok: Any, shape: str, kind: Any) -> None:
    sizes, stop_token, include, read_path = SHAPES[shape]
    prompt = _ids(tok, MULTILINGUAL[1])
    out = _ids(tok, MULTILINGUAL[0] + MULTILINGUAL[4])[: sum(sizes)]
    if stop_token:
        out[-1] = _eos(tok)
    run = Run(tok, _request(prompt, kind, include_stop_str_in_output=include), on=True)
    if read_path:
        assert run.detokenizer.path in ("byte_level", "sentencepiece", "generic")
    start = 0
    for n, size in enumerate(sizes):
        last = n == len(sizes) - 1
        reason = (FinishReason.STOP if stop_token else FinishReason.LENGTH) if last else None
        run.step(out[start : start + size], reason)
        start += size
    fed = out[:-1] if stop_token and not include else out
    assert run.text == shown_by_a_server(tok, prompt, fed, skip=True)
    assert run.token_ids == out
    assert run.finish == ("stop" if stop_token else "length", None)


@pytest.mark.parametrize("kind", KINDS)
def test_a_stop_string_inside_the_first_step_cuts_there(tok: Any, kind: Any) -> None:
    prompt = _ids(tok, "Q: ")
    out = _ids(tok, " alpha beta gamma delta epsilon")
    run = Run(tok, _request(prompt, kind, stop=[" gamma"]), on=True)
    run.step(out)
    # vLLM keeps the ids up to the one that completed the stop: the first prefix whose
    # decode holds it.
    kept = next(k for k in range(1, len(out) + 1) if " gamma" in expected(tok, prompt, out[:k], skip=True))
    assert run.text == " alpha beta"
    assert run.token_ids == out[:kept]
    assert run.finish == ("stop", " gamma")


@pytest.mark.parametrize("kind", KINDS)
def test_a_prompt_the_stream_cannot_open_on_stays_stock_from_the_first_step(tok: Any, kind: Any, caplog: Any) -> None:
    """An id past the tokenizer in the prompt (vLLM's input processor refuses one before it
    gets here; a request built by hand does not): add_request does not read the prompt, the
    first step finds it, and stock serves the request from its first id, as stock alone would."""
    prompt = [*_ids(tok, "Q: "), len(tok) + 7, *_ids(tok, " A:")]
    out = _ids(tok, " hello there, world")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        ours = Run(tok, _request(prompt, kind), on=True)
        assert isinstance(ours.detokenizer, shim.VllmDetokenizer)
        assert "stays stock" not in caplog.text
        stock = Run(tok, _request(prompt, kind), on=False)
        for run in (ours, stock):
            run.step(out[:2])
            run.step(out[2:], FinishReason.LENGTH)
    assert "request r stays stock: TokenIdError" in caplog.text
    assert (ours.text, ours.token_ids, ours.finish) == (stock.text, stock.token_ids, stock.finish)
    assert ours.token_ids == out


def _table_lines(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if "tokenizer table ready" in r.getMessage()]


def test_the_tokenizer_table_is_built_when_vllm_builds_its_output_processor(caplog: Any) -> None:
    """vLLM builds its ``OutputProcessor`` at start-up, before its engine core loads the model:
    the plugin builds the tokenizer's table then, in the background, once per tokenizer, so
    that the first request does not (0.2-1.3 s on the zoo's tokenizers here); the request's
    text is the decode's as always. Stock vLLM's output processor builds nothing."""
    fresh = get_cached_tokenizer(tokenizer_zoo.load("smollm2"))  # a new object: no table yet
    with caplog.at_level(logging.INFO, logger=LOGGER):
        OutputProcessor(fresh, log_stats=False)
        tables.join(timeout=120)
        assert _table_lines(caplog) == []  # the plugin off: vLLM's own __init__
        with plugin(True):
            OutputProcessor(fresh, log_stats=False)
            OutputProcessor(fresh, log_stats=False)  # the same tokenizer: no second build
            OutputProcessor(None, log_stats=False)  # skip_tokenizer_init: nothing to build
            tables.join(timeout=120)
        (line,) = _table_lines(caplog)
    assert "tokenizer table ready (byte_level; " in line
    assert "__init__" not in vars(OutputProcessor) or vars(OutputProcessor)["__init__"] is STOCK_INIT  # unregistered
    prompt, out = _ids(fresh, "Q: "), _ids(fresh, " 你好, world 🫨")
    run = Run(fresh, _request(prompt), on=True)
    run.step(out, FinishReason.LENGTH)
    assert run.text == expected(fresh, prompt, out)
