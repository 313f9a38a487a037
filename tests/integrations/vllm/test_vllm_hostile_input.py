"""Hostile input to the vLLM plugin's detokenizer, inside vLLM's real ``OutputProcessor``
("Exact at scale", hostile input).

What vLLM's own ``SamplingParams`` refuses (an empty stop string, ``max_tokens=0``,
``min_tokens`` above ``max_tokens``) is refused there, before any detokenizer exists: the
host's own behaviour, pinned here so a vLLM that stops refusing is noticed. Everything else
reaches the plugin, and none of it raises into ``process_outputs`` (vLLM's output loop,
where an exception fails every request in flight): an id the tokenizer does not know is
skipped as the decode skips it, with a WARNING naming it; a value that is no id hands the
request to vLLM's stock detokenizer with an ERROR line (``handover``); stop strings of any
number, length or content stream exactly; a prompt of 100,000 ids opens in bounded time; a
request aborted inside a character or a stop is dropped with nothing sent that the decode
does not have.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

pytest.importorskip("vllm.v1.engine.output_processor", reason="vLLM is not installed: pip install detok-plugin[vllm]")

import tokenizer_zoo  # noqa: E402
from detok_plugin.integrations import vllm as shim  # noqa: E402
from helpers import expected  # noqa: E402
from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402
from vllm.tokenizers.hf import get_cached_tokenizer  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor  # noqa: E402

LOGGER = "vllm.detok_plugin"


@pytest.fixture(scope="module")
def tok() -> Any:
    return get_cached_tokenizer(tokenizer_zoo.load("qwen3"))


@pytest.fixture(autouse=True)
def plugin_on(monkeypatch):
    monkeypatch.setenv("DETOK_PLUGIN", "1")
    assert shim.register()
    yield
    shim.unregister()


def _request(prompt: list[int], **params: Any) -> EngineCoreRequest:
    params.setdefault("max_tokens", 64)
    sp = SamplingParams(output_kind=RequestOutputKind.DELTA, **params)
    return EngineCoreRequest(
        request_id="r", external_req_id="r", prompt_token_ids=prompt, mm_features=None, sampling_params=sp,
        pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
    )


class Run:
    """One request through an ``OutputProcessor``: its texts, ids and finish."""

    def __init__(self, tok: Any, request: EngineCoreRequest) -> None:
        self.op = OutputProcessor(tok, log_stats=False)
        self.op.add_request(request, None)
        self.text, self.token_ids, self.finish = "", [], (None, None)  # type: str, list[Any], tuple[Any, Any]

    def step(self, ids: list[Any], *, last: bool = False) -> bool:
        """One engine step; True while the request goes on."""
        out = EngineCoreOutput(request_id="r", new_token_ids=ids, finish_reason=FinishReason.LENGTH if last else None)
        processed = self.op.process_outputs([out])
        for ro in processed.request_outputs:
            (co,) = ro.outputs
            self.text += co.text
            self.token_ids += co.token_ids
            self.finish = (co.finish_reason, co.stop_reason)
        return self.op.has_unfinished_requests()

    def all(self, ids: list[Any], per_step: int = 1) -> Run:
        steps = [ids[k : k + per_step] for k in range(0, len(ids), per_step)]
        for n, step in enumerate(steps):
            if not self.step(step, last=n == len(steps) - 1):
                break
        return self


def _ids(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


# --- what vLLM refuses itself ---------------------------------------------------------------


@pytest.mark.parametrize(
    "params, match",
    [
        ({"stop": [""]}, "empty string"),
        ({"stop": ["ok", ""]}, "empty string"),
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens must be less than or equal to"),
        ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0"),
    ],
    ids=["empty-stop", "empty-among-others", "max-zero", "min-above-max", "min-negative"],
)
def test_vllm_refuses_what_no_request_can_mean_before_a_detokenizer_exists(params, match):
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=match):
        SamplingParams(**params)


def test_an_empty_stop_that_slips_past_vllms_check_keeps_the_request_stock_and_says_so(tok, caplog):
    """Params changed after their check: the plugin refuses the stop when the request opens
    (the core's ValueError), the request stays on vLLM's stock detokenizer, one ERROR line."""
    request = _request(_ids(tok, "Q:"), stop=["ok"])
    request.sampling_params.stop = [""]
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        run = Run(tok, request)
    assert not isinstance(run.op.request_states["r"].detokenizer, shim.VllmDetokenizer)
    assert "stays stock" in caplog.text and "empty stop string" in caplog.text
    run.all(_ids(tok, " hello there"))  # stock's own behaviour from here: it must not raise


# --- ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [151_700, 2**40, -1], ids=["past-the-vocabulary", "huge", "negative"])
@pytest.mark.parametrize("per_step", [1, 3])
def test_an_id_the_tokenizer_does_not_know_is_skipped_with_a_warning(tok, caplog, bad, per_step):
    """A model's padded vocabulary can sample an id past the tokenizer (vllm#21951): the text
    skips it as the decode does, the id stays in the output's ids, and a WARNING names it."""
    ids = _ids(tok, "a🫨b 你好 ok")
    hostile = [ids[0], ids[1], bad, *ids[2:]]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run = Run(tok, _request([])).all(hostile, per_step)
    assert run.text == expected(tok, [], ids, skip=True)
    assert run.token_ids == hostile and run.finish == ("length", None)
    assert f"token id {bad} at position 2" in caplog.text and "skips it" in caplog.text


@pytest.mark.parametrize("bad", [1.5, "7", None], ids=repr)
def test_a_value_that_is_no_id_hands_the_request_to_stock_with_an_error_line(tok, caplog, bad):
    """Not an engine's output, but nothing reaches vLLM's loop: the stream's TypeError hands
    the request to vLLM's stock detokenizer (which goes on with no more text if it fails
    too); what was sent stays sent; one ERROR line names the request."""
    ids = _ids(tok, "hello 🫨 world")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        run = Run(tok, _request([]))
        for i in ids[:2]:
            run.step([i])
        sent = run.text
        run.step([bad])
        run.all(ids[2:])
    assert not run.op.has_unfinished_requests()
    assert sent == "hello " and run.text.startswith(sent)  # the half emoji was held, not sent
    assert "request r" in caplog.text and "stock detokenizer" in caplog.text


# --- stop strings ----------------------------------------------------------------------------


def test_a_thousand_stop_strings(tok):
    ids = _ids(tok, "The quick brown fox 🫨 jumps over the lazy dog. " * 4)
    stops = [f"stop {k}" for k in range(997)] + ["lazy dogs", "🫨 jumps", "own"]
    run = Run(tok, _request([], stop=stops)).all(ids, per_step=2)
    assert (run.text, run.finish) == ("The quick br", ("stop", "own"))
    assert run.token_ids == ids[: len(_ids(tok, "The quick brown"))]


def test_a_stop_of_ten_thousand_characters(tok):
    stop = "ab" * 5000
    ids = _ids(tok, "x " + stop + " tail")
    run = Run(tok, _request([], stop=[stop], max_tokens=len(ids)))
    run.step(ids[:1])
    assert run.text == "x"  # nothing held: "x" cannot start the stop
    run.all(ids[1:], per_step=7)
    assert (run.text, run.finish) == ("x ", ("stop", stop))


def test_a_stop_of_u_fffd_ends_where_the_decode_shows_one(tok):
    ids = _ids(tok, "ok 🫨 then")
    run = Run(tok, _request([], stop=["\ufffd"])).all(ids)
    assert (run.text, run.finish) == ("ok ", ("stop", "\ufffd"))


@pytest.mark.parametrize("stop", ["\ud83e", "a\ud83e\udee8"], ids=["lone-high", "pair-in-text"])
def test_a_stop_with_lone_surrogates_never_matches(tok, stop):
    ids = _ids(tok, "a🫨b 🫨 a")
    run = Run(tok, _request([], stop=[stop])).all(ids)
    assert (run.text, run.finish) == (expected(tok, [], ids, skip=True), ("length", None))


# --- prompts and aborts ----------------------------------------------------------------------


def test_a_prompt_of_a_hundred_thousand_ids(tok):
    prompt = _ids(tok, "你好🫨 hello ありがとう " * 14_000)[: 100_000 - 1]  # ends inside 🫨
    out = _ids(tok, "🫨 and after")
    t0 = time.process_time()
    run = Run(tok, _request(prompt, stop=["\n\nUser:"])).all(out)
    assert time.process_time() - t0 < 5
    assert run.text == expected(tok, prompt, out, skip=True)


@pytest.mark.parametrize("where", ["mid-character", "mid-stop"])
def test_a_request_aborted_inside_a_character_or_a_stop_is_dropped(tok, where):
    """vLLM's abort drops the request's detokenizer without asking it for the end: what was
    sent is what the decode shows, without the half character or the partial stop."""
    text = "Hello 🫨" if where == "mid-character" else "Hello.\n\nUs"
    ids = _ids(tok, text)
    cut = len(ids) - 1 if where == "mid-character" else len(ids)
    run = Run(tok, _request([], stop=["\n\nUser:"]))
    for i in ids[:cut]:
        run.step([i])
    assert run.op.abort_requests(["r"], internal=True) == ["r"]
    assert not run.op.has_unfinished_requests()
    assert run.text == "Hello " if where == "mid-character" else run.text == "Hello."
