"""A stream that raises inside vLLM's real ``OutputProcessor``: the request is handed to
vLLM's stock detokenizer, logged, and nothing reaches vLLM's loop (``integrations/vllm/handover.py``).

The faults are injected into :class:`detok_plugin.ServingStream` by request id, before the
stream did anything or after it took the id (the id counted, its text lost), at a different
step for each request, so hand-overs land inside split characters, byte runs and partial
stops. The requests not faulted share every engine step with those that are.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("vllm.v1.engine.output_processor", reason="vLLM is not installed")

from test_vllm_integration import (  # noqa: E402
    CUMULATIVE,
    DELTA,
    STEPS,
    TOKENIZERS,
    Req,
    Seq,
    _stop_reqs,
    check,
    corpus,
    detokenizer,
    replay,
    vllm_tokenizer,
    want,
)
from vllm.v1.engine import detokenizer as vllm_detokenizer  # noqa: E402

from detok_plugin import ServingStream  # noqa: E402


class Injected(RuntimeError):
    """The fault a test put in the stream."""


@contextlib.contextmanager
def faults(mp: pytest.MonkeyPatch, methods: str, at: dict[str, int], *, after: bool) -> Iterator[dict[str, int]]:
    """``ServingStream``'s methods named in ``methods`` (space-separated) raise on the
    ``at[rid]``-th call, counted across them, for request ``rid``, before the real call
    (``after=False``) or once it has run. Yields the calls counted."""
    calls: dict[str, int] = {}

    def faulty(method: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(stream: ServingStream, *args: Any, **kwargs: Any) -> Any:
            rid = stream.request_id
            calls[rid] = calls.get(rid, 0) + 1
            if at.get(rid) != calls[rid]:
                return real(stream, *args, **kwargs)
            if after:
                real(stream, *args, **kwargs)
            raise Injected(f"fault in {method} of {rid}")

        return call

    for method in methods.split():
        mp.setattr(ServingStream, method, faulty(method, getattr(ServingStream, method)))
    yield calls


def requests(name: str) -> list[Req]:
    """Plain text and text with stops (stops from inside the outputs), one of each kind per
    corpus text."""
    plain = [Req(p, [o]) for p, o in corpus(name)]
    return [r for pair in zip(plain, _stop_reqs(name)) for r in pair]


def stock_run(name: str, reqs: list[Req], **kw: Any) -> list[list[Seq]]:
    with detokenizer(plugin=False):
        return replay(vllm_tokenizer(name), reqs, **kw)


def assert_handed_over(name: str, req: Req, seq: Seq, stock: Seq) -> None:
    """The client's stream of a handed-over request: stock's final text, ids and ending,
    nothing taken back, every text seen a prefix of the final one."""
    assert (seq.text, seq.token_ids) == (stock.text, stock.token_ids)
    assert (seq.finish_reason, seq.stop_reason) == (stock.finish_reason, stock.stop_reason)
    assert seq.text == want(vllm_tokenizer(name), req, req.outs[0]).text  # stock agrees here
    held = seq.cumulative()
    for before, now in zip(held, held[1:]):
        assert now.startswith(before)
    assert all(seq.text.startswith(t) for t in held)


@pytest.mark.parametrize("after", [False, True], ids=["before-the-stream-ran", "after-it-took-the-id"])
@pytest.mark.parametrize("kind", [DELTA, CUMULATIVE], ids=["delta", "cumulative"])
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_stream_that_raises_hands_its_request_to_stock_and_the_loop_goes_on(name, step, kind, after, caplog):
    reqs = requests(name)
    # Every other request fails, each at another of its steps: a call of push_text (one id)
    # or push (several ids, one by one through push_text or, at rest, in one go).
    at = {f"r{i}": 1 + (i * 3) % 11 for i in range(0, len(reqs), 2)}
    with (
        pytest.MonkeyPatch.context() as mp,
        caplog.at_level(logging.ERROR, logger="vllm.detok_plugin"),
        detokenizer(plugin=True),
        faults(mp, "push_text push", at, after=after) as calls,
        faults(mp, "finish", {}, after=False) as finished,
    ):
        seqs = replay(vllm_tokenizer(name), reqs, kind=kind, step=step)
    stock = stock_run(name, reqs, kind=kind, step=step)
    failed = [i for i in range(len(reqs)) if f"r{i}" in at and calls.get(f"r{i}", 0) >= at[f"r{i}"]]
    assert len(failed) >= len(at) - 1  # a request that stops early may end before its fault
    for i in failed:
        assert f"r{i}" not in finished  # a stream that raised is not called again
        assert_handed_over(name, reqs[i], seqs[i][0], stock[i][0])
        assert f"request r{i}: the stream raised Injected" in caplog.text
    assert caplog.text.count("Traceback") == len(failed)  # the bug report
    kept = [i for i in range(len(reqs)) if i not in failed]
    check(name, [reqs[i] for i in kept], [seqs[i] for i in kept])


@pytest.mark.parametrize("kind", [DELTA, CUMULATIVE], ids=["delta", "cumulative"])
@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_stream_that_raises_in_finish_is_handed_over_too(name, kind, caplog):
    """``finish`` runs when vLLM asks for a finished request's text. Each output here ends
    inside a character, whose bytes stock loses: the text is all the stream released,
    which stock's is a part of, and the held bytes' U+FFFD is lost as stock loses it."""
    tok = vllm_tokenizer(name)
    reqs = []
    for prompt, out in corpus(name):
        inside = [k for k in range(2, len(out)) if tok.decode(prompt + out[:k]).endswith("\ufffd")]
        reqs.append(Req(prompt, [out[: inside[0]] if inside else out]))
    at = {f"r{i}": 1 for i in range(len(reqs))}
    with (
        pytest.MonkeyPatch.context() as mp,
        caplog.at_level(logging.ERROR, logger="vllm.detok_plugin"),
        detokenizer(plugin=True),
        faults(mp, "finish", at, after=False) as calls,
    ):
        seqs = replay(tok, reqs, kind=kind, step=1)
    assert calls == at
    stock = stock_run(name, reqs, kind=kind, step=1)
    cut = 0
    for req, (seq,), (st,) in zip(reqs, seqs, stock):
        full = want(tok, req, req.outs[0]).text
        assert seq.text == full.rstrip("\ufffd") and seq.text.startswith(st.text)
        cut += len(seq.text) > len(st.text)
        assert (seq.token_ids, seq.finish_reason) == (st.token_ids, st.finish_reason)
        held = seq.cumulative()
        assert all(b.startswith(a) for a, b in zip(held, held[1:]))
    # Byte-level BPE merges a space into the token that starts a character: stock loses the
    # space with the character, the stream had released it, and it is kept.
    assert cut or name != "qwen3"


@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_request_whose_stream_cannot_be_built_stays_stock(name, caplog):
    reqs = requests(name)[:6]
    real = ServingStream.from_tokenizer.__func__  # type: ignore[attr-defined]

    def failing(cls: type, tokenizer: Any, **kw: Any) -> ServingStream:
        if kw.get("request_id") == "r3":
            raise Injected("fault in from_tokenizer")
        return real(cls, tokenizer, **kw)

    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.ERROR, logger="vllm.detok_plugin"):
        mp.setattr(ServingStream, "from_tokenizer", classmethod(failing))
        with detokenizer(plugin=True):
            seqs = replay(vllm_tokenizer(name), reqs, step=1)
    stock = stock_run(name, reqs, step=1)
    assert seqs[3] == stock[3]
    assert "request r3 stays stock: Injected" in caplog.text
    check(name, reqs[:3] + reqs[4:], seqs[:3] + seqs[4:])


def test_when_stock_fails_too_the_request_goes_on_without_text(caplog):
    """The last resort: no exception reaches the loop, the request ends as the engine ends
    it (its ids all kept) with the text given before the faults, and both are logged."""
    name = "qwen3"
    reqs = requests(name)[:4]
    at = {"r1": 3}
    real_update: Callable[..., Any] = vllm_detokenizer.BaseIncrementalDetokenizer.update

    def stock_update(self: Any, new_token_ids: list[int], stop_terminated: bool) -> Any:
        if self.request_id == "r1":
            raise Injected("fault in stock")
        return real_update(self, new_token_ids, stop_terminated)

    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.ERROR, logger="vllm.detok_plugin"):
        mp.setattr(vllm_detokenizer.BaseIncrementalDetokenizer, "update", stock_update)
        with detokenizer(plugin=True), faults(mp, "push_text", at, after=False):
            seqs = replay(vllm_tokenizer(name), reqs, step=1)
    seq, req = seqs[1][0], reqs[1]
    full = want(vllm_tokenizer(name), req, req.outs[0]).text
    assert seq.token_ids == req.outs[0] and seq.finish_reason == "length"
    assert seq.text and full.startswith(seq.text) and len(seq.text) < len(full)
    assert "request r1: vLLM's stock detokenizer failed too (Injected" in caplog.text
    check(name, [reqs[0], *reqs[2:]], [seqs[0], *seqs[2:]])
