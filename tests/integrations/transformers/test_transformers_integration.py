"""The transformers shim: drop-in streamers driven by transformers' real ``generate()``.

Two real models drive the streamers:

* a tiny, randomly initialised Qwen3 model (seeded) paired with the real Qwen3 tokenizer,
  sampling across the whole vocabulary: the harshest stream (byte pieces that split
  characters, invalid UTF-8, special tokens);
* SmolLM2-135M-Instruct from its GGUF (``@pytest.mark.slow``), greedy, asked for Japanese
  and emoji: every one of its first tokens decodes alone to U+FFFD.

Oracles: the joined stream equals ``tokenizer.decode`` of the same ids, and each piece is
exactly what a :class:`DetokenizerState` driven with the same ids releases at that step
(so no piece leaves later than the core allows). Upstream's streamer tests' behaviours
(skip_prompt, decode kwargs, timeouts, end(), batch refusal) are ported below them.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import queue
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tokenizer_zoo  # noqa: E402
from detok_plugin.integrations import transformers as shim  # noqa: E402
from detok_plugin.integrations.transformers import (  # noqa: E402
    AsyncDetokIteratorStreamer,
    DetokDiffusionStreamer,
    DetokIteratorStreamer,
    DetokStopCriteria,
    DetokStreamer,  # noqa: E402
)
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers.generation import streamers as stock  # noqa: E402

from detok_plugin import Delta, DetokenizerState, ServingStream  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
JAPANESE = "Say hello in Japanese and add an emoji."
EMOJI = "Say hello in Japanese and add an emoji. 😊"  # greedy SmolLM2 answers with emoji


# --- oracles -----------------------------------------------------------------------------


def core_pieces(tok: Any, steps: Sequence[Sequence[int]], prompt: Sequence[int] = (), **opts: Any) -> list[str]:
    """What the core releases per step (one push per ``put``), then at ``finish()``."""
    state = DetokenizerState.from_tokenizer(tok, prompt_ids=prompt, eos_token_ids=(), **opts)
    out = [state.push(list(s)).text if not state.finished else "" for s in steps]
    out.append("" if state.finished else state.finish().text)
    return out


def assert_fffd_only_where_decode_has_it(pieces: Sequence[str], full: str) -> None:
    pos = 0
    for k, piece in enumerate(pieces):
        for j, ch in enumerate(piece):
            if ch == "\ufffd":
                assert full[pos + j] == "\ufffd", f"piece {k} has U+FFFD at {pos + j}, decode has {full[pos + j]!r}"
        pos += len(piece)


def generate_streaming(model: Any, streamer: Any, **kwargs: Any) -> tuple[list[Any], Any]:
    """Run ``generate`` in a thread, as upstream's docs do; return (items, output ids)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["out"] = model.generate(streamer=streamer, **kwargs)
        except BaseException as exc:  # surfaced below, not lost in the thread
            result["error"] = exc
            streamer.end()

    thread = threading.Thread(target=target)
    thread.start()
    items = list(streamer)
    thread.join()
    if "error" in result:
        raise result["error"]
    return items, result["out"]


# --- models ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_qwen3(qwen3):
    """A 2-layer, hidden-32 Qwen3 with random weights over the real Qwen3 vocabulary."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=len(qwen3),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        pad_token_id=qwen3.pad_token_id,
        eos_token_id=None,  # never stop early: a fixed number of random tokens
    )
    model = transformers.Qwen3ForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = qwen3.pad_token_id
    return model


def sample_kwargs(qwen3: Any, n: int = 48, text: str = "Hi") -> dict[str, Any]:
    ids = qwen3(text, return_tensors="pt")
    return dict(
        input_ids=ids["input_ids"], attention_mask=ids["attention_mask"], max_new_tokens=n,
        do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
    )


def seeded(seed: int, fn, *args, **kwargs):
    torch.manual_seed(seed)
    return fn(*args, **kwargs)


@pytest.fixture(scope="module")
def smol():
    path = tokenizer_zoo.smollm2_gguf_path()
    tok = tokenizer_zoo.load("smollm2")
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    return tok, model


def chat_inputs(tok: Any, prompt: str) -> dict[str, Any]:
    enc = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


@pytest.fixture(scope="module")
def smol_runs(smol):
    """One streamed greedy generate per prompt, shared by the slow tests: (items, ids, n_prompt)."""
    tok, model = smol
    runs = {}
    for prompt in (JAPANESE, EMOJI):
        inputs = chat_inputs(tok, prompt)
        streamer = DetokIteratorStreamer(tok, skip_prompt=True)
        items, out = generate_streaming(model, streamer, **inputs, max_new_tokens=40, do_sample=False)
        runs[prompt] = (items, out[0].tolist(), inputs["input_ids"].shape[1])
    return runs


# --- real generate(): random Qwen3 ---------------------------------------------------------


@pytest.mark.parametrize("skip_special", [False, True], ids=["keep_special", "skip_special"])
def test_random_qwen3_stream_is_exact_and_prompt(qwen3, tiny_qwen3, skip_special):
    streamer = DetokIteratorStreamer(qwen3, skip_prompt=True, skip_special_tokens=skip_special)
    kwargs = sample_kwargs(qwen3, n=64)
    items, out = seeded(1234, generate_streaming, tiny_qwen3, streamer, **kwargs)
    gen = out[0, kwargs["input_ids"].shape[1] :].tolist()
    full = qwen3.decode(gen, skip_special_tokens=skip_special)
    assert "".join(items) == full
    # One item per put (one id per step), then end()'s: exactly the core's release per step.
    assert items == core_pieces(qwen3, [[i] for i in gen], skip_special_tokens=skip_special)
    assert_fffd_only_where_decode_has_it(items, full)
    # The stream really was harsh: ids spread across the vocabulary, multi-token characters.
    assert len(set(gen)) > 50 and max(gen) > 100_000
    assert any(ord(c) > 0x7F for c in full)
    assert streamer.path == "byte_level"


def test_random_qwen3_text_streamer_prints_prompt_and_output(qwen3, tiny_qwen3, capsys):
    """Upstream: test_text_streamer_matches_non_streaming (stdout, with the final newline)."""
    kwargs = sample_kwargs(qwen3, n=24, text="こんにちは 🫨")
    out = seeded(7, tiny_qwen3.generate, **kwargs)
    capsys.readouterr()
    seeded(7, tiny_qwen3.generate, **kwargs, streamer=DetokStreamer(qwen3))
    assert capsys.readouterr().out == qwen3.decode(out[0]) + "\n"


def test_random_qwen3_skip_prompt(qwen3, tiny_qwen3, capsys):
    """Upstream: test_text_streamer_skip_prompt."""
    kwargs = sample_kwargs(qwen3, n=24)
    out = seeded(8, tiny_qwen3.generate, **kwargs)
    capsys.readouterr()
    seeded(8, tiny_qwen3.generate, **kwargs, streamer=DetokStreamer(qwen3, skip_prompt=True))
    assert capsys.readouterr().out == qwen3.decode(out[0, kwargs["input_ids"].shape[1] :]) + "\n"


def test_random_qwen3_decode_kwargs_reach_the_stream(qwen3, tiny_qwen3, capsys):
    """Upstream: test_text_streamer_decode_kwargs. A prompt of special tokens is not printed."""
    prompt = torch.tensor([[qwen3.convert_tokens_to_ids("<|im_start|>")] * 5])
    kwargs = dict(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False)
    out = tiny_qwen3.generate(**kwargs)
    capsys.readouterr()
    tiny_qwen3.generate(**kwargs, streamer=DetokStreamer(qwen3, skip_special_tokens=True))
    printed = capsys.readouterr().out[:-1]
    assert "<|im_start|>" not in printed
    assert printed == qwen3.decode(out[0], skip_special_tokens=True)


def test_random_qwen3_async_iterator_matches_decode(qwen3, tiny_qwen3):
    """Upstream: test_async_iterator_streamer_matches_non_streaming."""
    kwargs = sample_kwargs(qwen3, n=32)
    out = seeded(9, tiny_qwen3.generate, **kwargs)

    async def main() -> list[str]:
        streamer = AsyncDetokIteratorStreamer(qwen3)
        torch.manual_seed(9)
        thread = threading.Thread(target=tiny_qwen3.generate, kwargs={**kwargs, "streamer": streamer})
        thread.start()
        items = [item async for item in streamer]
        thread.join()
        return items

    items = asyncio.run(main())
    assert "".join(items) == qwen3.decode(out[0])
    steps = [out[0, : kwargs["input_ids"].shape[1]].tolist()] + [[i] for i in out[0, kwargs["input_ids"].shape[1] :].tolist()]
    assert items == core_pieces(qwen3, steps)


def test_random_qwen3_stop_string_ends_generate_at_its_token(qwen3, tiny_qwen3):
    """DetokStopCriteria ends generate() at the token that completes the stop string, and
    the stream stops before it: one state decides both."""
    kwargs = sample_kwargs(qwen3, n=48)
    n_prompt = kwargs["input_ids"].shape[1]
    ref = seeded(21, tiny_qwen3.generate, **kwargs)[0, n_prompt:].tolist()
    full = qwen3.decode(ref)
    # A stop string from the middle of the sampled text, clear of U+FFFD.
    start = next(i for i in range(len(full) // 2, len(full) - 3) if "\ufffd" not in full[i : i + 3])
    stop = full[start : start + 3]
    state = DetokenizerState.from_tokenizer(qwen3, stop=[stop], eos_token_ids=())
    expected = "".join(state.push(i).text for i in ref if not state.finished)
    k = len(state.token_ids)  # the id that completed the stop string is the k-th
    assert state.finish_reason == "stop" and k < len(ref)

    streamer = DetokIteratorStreamer(qwen3, skip_prompt=True, stop=[stop])
    items, out = seeded(
        21, generate_streaming, tiny_qwen3, streamer, **kwargs, stopping_criteria=[DetokStopCriteria(streamer)]
    )
    assert out[0, n_prompt:].tolist() == ref[:k]
    assert "".join(items) == expected == full[: full.index(stop)]
    assert (streamer.finish_reason, streamer.stop_reason) == ("stop", stop)


def test_random_qwen3_batch_refused_like_textstreamer(qwen3, tiny_qwen3):
    """Batch size above one: refused, with TextStreamer's own error type and words."""
    with pytest.raises(ValueError) as stock_err:
        stock.TextStreamer(qwen3).put(torch.zeros((2, 3), dtype=torch.long))
    ids = qwen3(["Hi", "Yo"], return_tensors="pt")
    for streamer in (DetokStreamer(qwen3), DetokIteratorStreamer(qwen3, skip_prompt=True)):
        with pytest.raises(ValueError) as ours:
            tiny_qwen3.generate(**ids, max_new_tokens=2, do_sample=False, streamer=streamer)
        assert str(ours.value) == str(stock_err.value)
    criteria = DetokStopCriteria(DetokStreamer(qwen3, stop=["x"]))
    with pytest.raises(ValueError, match="batch size 1"):
        criteria(torch.zeros((2, 3), dtype=torch.long), None)


# --- real generate(): SmolLM2 (slow) --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [JAPANESE, EMOJI], ids=["japanese", "emoji"])
def test_smollm2_stream_is_exact_and_prompt(smol, smol_runs, prompt):
    tok, _ = smol
    items, ids, n_prompt = smol_runs[prompt]
    gen = ids[n_prompt:]
    full = tok.decode(gen)
    assert "".join(items) == full
    assert items == core_pieces(tok, [[i] for i in gen])
    assert_fffd_only_where_decode_has_it(items, full)
    wide = [c for c in full if ord(c) > 0x2FFF]  # kana, CJK, emoji
    assert wide, f"the model wrote no Japanese or emoji: {full!r}"
    # The first such character leaves in the put of the token that completes it, long
    # before end() (TextStreamer holds kana and emoji until a space or newline).
    first_wide = next(k for k, piece in enumerate(items) if any(ord(c) > 0x2FFF for c in piece))
    completes = next(t for t in range(1, len(gen) + 1) if wide[0] in tok.decode(gen[:t]))
    assert first_wide == completes - 1 < len(gen)


@pytest.mark.slow
def test_smollm2_emoji_never_streams_replacement_characters(smol, smol_runs):
    """Why the streamer matters: decoding SmolLM2's tokens one by one shows U+FFFD; the
    stream shows none before end(). max_new_tokens may cut the last emoji: end() then
    renders the incomplete tail as decode renders it, and only end() does."""
    tok, _ = smol
    items, ids, n_prompt = smol_runs[EMOJI]
    gen = ids[n_prompt:]
    assert any("\ufffd" in tok.decode([i]) for i in gen)
    assert "\ufffd" not in "".join(items[:-1])
    assert items[-1] == tok.decode(gen)[len("".join(items[:-1])) :]


@pytest.mark.slow
def test_smollm2_text_streamer_prints_exactly_decode(smol, capsys):
    tok, model = smol
    inputs = chat_inputs(tok, JAPANESE)
    capsys.readouterr()
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False, streamer=DetokStreamer(tok))
    assert capsys.readouterr().out == tok.decode(out[0]) + "\n"


@pytest.mark.slow
def test_smollm2_stop_string_ends_generate(smol, smol_runs):
    tok, model = smol
    _, ids, n_prompt = smol_runs[JAPANESE]
    ref = ids[n_prompt:]
    full = tok.decode(ref)
    stop = full[2]  # a kana: completed by the second of its two byte tokens
    state = DetokenizerState.from_tokenizer(tok, stop=[stop], eos_token_ids=())
    for i in ref:
        state.push(i)
        if state.finished:
            break
    k = len(state.token_ids)
    streamer = DetokIteratorStreamer(tok, skip_prompt=True, stop=stop)
    items, out = generate_streaming(
        model, streamer, **chat_inputs(tok, JAPANESE), max_new_tokens=40, do_sample=False,
        stopping_criteria=[DetokStopCriteria(streamer)],
    )
    assert out[0, n_prompt:].tolist() == ref[:k]
    assert "".join(items) == full[: full.index(stop)]
    assert streamer.finish_reason == "stop"


# --- upstream behaviours without a model ---------------------------------------------------


def put_ids(streamer: Any, prompt: Sequence[int], steps: Sequence[Sequence[int]]) -> None:
    streamer.put(torch.tensor([list(prompt)]))
    for s in steps:
        streamer.put(torch.tensor([list(s)]) if len(s) > 1 else torch.tensor(list(s)))
    streamer.end()


def test_sync_timeout_raises_queue_empty(qwen3):
    """Upstream: test_iterator_streamer_timeout (no producer, so it cannot race)."""
    streamer = DetokIteratorStreamer(qwen3, timeout=0.05)
    with pytest.raises(queue.Empty):
        next(iter(streamer))


def test_async_timeout_raises_timeout_error(qwen3):
    """Upstream: test_async_iterator_streamer_timeout."""

    async def main() -> None:
        streamer = AsyncDetokIteratorStreamer(qwen3, timeout=0.05)
        with pytest.raises(TimeoutError):
            await streamer.__anext__()

    asyncio.run(main())


def test_async_streamer_needs_a_running_loop_like_stock(qwen3):
    with pytest.raises(RuntimeError):
        stock.AsyncTextIteratorStreamer(qwen3)
    with pytest.raises(RuntimeError):
        AsyncDetokIteratorStreamer(qwen3)


def test_end_without_put_emits_one_empty_final_text(qwen3):
    calls: list[tuple[str, bool]] = []

    class Recorder(DetokStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            calls.append((text, stream_end))

    Recorder(qwen3).end()
    assert calls == [("", True)]
    streamer = DetokIteratorStreamer(qwen3)
    streamer.end()
    assert list(streamer) == [""]


def test_on_finalized_text_override_sees_every_put_and_the_end(qwen3):
    """A subclass that overrides on_finalized_text (the documented hook) keeps working."""
    calls: list[tuple[str, bool]] = []

    class Recorder(DetokStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            calls.append((text, stream_end))

    ids = qwen3.encode("a 🫨", add_special_tokens=False)
    put_ids(Recorder(qwen3, skip_prompt=True), [1, 2], [[i] for i in ids])
    assert [stream_end for _, stream_end in calls] == [False] * len(ids) + [True]
    assert "".join(t for t, _ in calls) == "a 🫨"


def test_streamer_is_reusable_after_end(qwen3):
    streamer = DetokIteratorStreamer(qwen3, skip_prompt=True)
    first = qwen3.encode("東京 🗼", add_special_tokens=False)
    second = qwen3.encode("大阪 🏯", add_special_tokens=False)
    put_ids(streamer, [9], [[i] for i in first])
    assert "".join(streamer) == "東京 🗼"
    assert streamer.next_tokens_are_prompt and streamer.token_cache == [] and streamer.print_len == 0
    put_ids(streamer, [9], [[i] for i in second])
    assert "".join(streamer) == "大阪 🏯"


@pytest.mark.parametrize("skip_prompt", [True, False])
def test_a_request_opens_one_stream(qwen3, monkeypatch, skip_prompt):
    """Each generate() opens one stream. The first streamer built with options no stream
    has opened with opens it in its constructor (bad options fail there, not in generate()'s
    thread), and its first request takes it; a streamer built with options that opened
    before opens its stream at the first put that needs one: the shown prompt, or the first
    generated id after a skipped one."""
    opened: list[Sequence[int]] = []
    for cls in (ServingStream, DetokenizerState):
        real = cls.from_tokenizer.__func__  # type: ignore[attr-defined]

        def counting(c: type, tokenizer: Any, _real: Any = real, **options: Any) -> Any:
            opened.append(options.get("prompt_ids", ()))
            return _real(c, tokenizer, **options)

        monkeypatch.setattr(cls, "from_tokenizer", classmethod(counting))
    stop = [f"never opened with {uuid.uuid4()}"]
    prompt = qwen3.encode("Q: ", add_special_tokens=False)
    shown = "" if skip_prompt else "Q: "
    first = DetokIteratorStreamer(qwen3, skip_prompt=skip_prompt, stop=stop)
    assert len(opened) == 1
    second = DetokIteratorStreamer(qwen3, skip_prompt=skip_prompt, stop=stop)
    assert len(opened) == 1
    second.put(torch.tensor([prompt]))
    assert len(opened) == (1 if skip_prompt else 2)
    token = qwen3.encode("Tokyo", add_special_tokens=False)[:1]
    second.put(torch.tensor(token))
    assert len(opened) == 2
    second.end()
    assert "".join(second) == shown + qwen3.decode(token)
    for streamer in (first, second):
        for text in ("東京 🗼", "大阪 🏯"):
            put_ids(streamer, prompt, [[i] for i in qwen3.encode(text, add_special_tokens=False)])
            assert "".join(streamer) == shown + text
    assert len(opened) == 5 and not any(opened)  # no tags: the prompt is never context


def test_multi_token_puts_as_in_assisted_decoding(qwen3):
    """generate() puts (1, n) in assisted decoding: each put releases what its ids settle."""
    ids = qwen3.encode("カタカナ🫨ひらがな", add_special_tokens=False)
    steps = [ids[:2], ids[2:5], ids[5:6], ids[6:]]
    streamer = DetokIteratorStreamer(qwen3, skip_prompt=True)
    put_ids(streamer, [1], steps)
    assert list(streamer) == core_pieces(qwen3, steps)
    assert streamer.path == "byte_level"


@given(data=st.data())
def test_any_chunking_of_any_ids_streams_to_the_decode(qwen3, data):
    """Property: any ids, any chunking into puts, with or without the prompt shown."""
    size = len(qwen3)
    ids = data.draw(st.lists(st.integers(0, size - 1) | st.integers(0, 255) | st.integers(120000, 151000), max_size=40))
    prompt = data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=4))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=8)))
    steps = [s for s in (ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)])) if s]
    skip_prompt = data.draw(st.booleans())
    streamer = DetokIteratorStreamer(qwen3, skip_prompt=skip_prompt)
    put_ids(streamer, prompt, steps)
    items = list(streamer)
    shown = ids if skip_prompt else prompt + ids
    assert "".join(items) == qwen3.decode(shown)
    expected = core_pieces(qwen3, steps if skip_prompt else [prompt, *steps])
    assert items == expected


def test_extra_decode_kwargs_decode_with_the_tokenizer(qwen3):
    """A decode option the core's tables do not model goes through tokenizer.decode."""
    ids = qwen3.encode("Hello , world ! I do n't know .", add_special_tokens=False)
    streamer = DetokIteratorStreamer(qwen3, skip_prompt=True, clean_up_tokenization_spaces=True)
    assert streamer.path == "generic"
    put_ids(streamer, [1], [[i] for i in ids])
    assert "".join(streamer) == qwen3.decode(ids, clean_up_tokenization_spaces=True)


def test_stop_string_without_criteria_cuts_the_stream(qwen3):
    ids = qwen3.encode("答えは東京です。\n\n次の質問", add_special_tokens=False)
    streamer = DetokIteratorStreamer(qwen3, skip_prompt=True, stop=["\n\n"])
    put_ids(streamer, [1], [[i] for i in ids])
    assert "".join(streamer) == "答えは東京です。"
    assert (streamer.finish_reason, streamer.stop_reason) == ("stop", "\n\n")


def test_criteria_needs_the_streamer_in_generate(qwen3):
    criteria = DetokStopCriteria(DetokStreamer(qwen3, stop=["x"]))
    assert isinstance(criteria, transformers.StoppingCriteria)
    with pytest.raises(RuntimeError, match="streamer"):
        criteria(torch.ones((1, 3), dtype=torch.long), None)
    with pytest.raises(ValueError, match="stop="):
        DetokStopCriteria(DetokStreamer(qwen3))


TAGGED = (
    '<think>plan it</think>Answer: 東京 🗼<tool_call>{"name": "get_time", "arguments": {"tz": "Asia/Tokyo"}}'
    "</tool_call>"
)


def test_typed_deltas_carry_reasoning_and_tool_calls(qwen3):
    ids = qwen3.encode(TAGGED, add_special_tokens=False)
    streamer = DetokIteratorStreamer(qwen3, skip_prompt=True, tags="qwen3", deltas=True)
    put_ids(streamer, [1], [[i] for i in ids])
    items = list(streamer)
    assert all(isinstance(d, Delta) for d in items)
    assert "".join(d.text for d in items) == "Answer: 東京 🗼"
    assert "".join(d.reasoning for d in items) == "plan it"
    done = [t for d in items for t in d.tool_calls if t.complete]
    assert [(t.name, t.arguments) for t in done] == [("get_time", '{"tz": "Asia/Tokyo"}')]


def test_async_typed_deltas(qwen3):
    ids = qwen3.encode(TAGGED, add_special_tokens=False)

    async def main() -> list[Any]:
        streamer = AsyncDetokIteratorStreamer(qwen3, skip_prompt=True, tags="qwen3", deltas=True)
        thread = threading.Thread(target=put_ids, args=(streamer, [1], [[i] for i in ids]))
        thread.start()
        items = [d async for d in streamer]
        thread.join()
        return items

    items = asyncio.run(main())
    assert "".join(d.reasoning for d in items) == "plan it"
    assert "".join(d.text for d in items) == "Answer: 東京 🗼"


def test_string_mode_with_tags_strips_reasoning(qwen3):
    ids = qwen3.encode(TAGGED, add_special_tokens=False)
    streamer = DetokIteratorStreamer(qwen3, skip_prompt=True, tags="qwen3", reasoning="strip")
    put_ids(streamer, [1], [[i] for i in ids])
    assert "".join(streamer) == "Answer: 東京 🗼"


def test_prompt_ending_in_think_starts_in_reasoning(qwen3):
    prompt = qwen3.encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    ids = qwen3.encode("hmm</think>OK", add_special_tokens=False)
    streamer = DetokIteratorStreamer(qwen3, skip_prompt=True, tags="qwen3", deltas=True)
    put_ids(streamer, prompt, [[i] for i in ids])
    items = list(streamer)
    assert "".join(d.reasoning for d in items) == "hmm"
    assert "".join(d.text for d in items) == "OK"


# --- the drop-in contract: names, signatures, attributes -----------------------------------

PAIRS = [
    pytest.param(stock.TextStreamer, DetokStreamer, id="TextStreamer"),
    pytest.param(stock.TextIteratorStreamer, DetokIteratorStreamer, id="TextIteratorStreamer"),
    pytest.param(stock.AsyncTextIteratorStreamer, AsyncDetokIteratorStreamer, id="AsyncTextIteratorStreamer"),
    pytest.param(stock.TextDiffusionStreamer, DetokDiffusionStreamer, id="TextDiffusionStreamer"),
]


@pytest.mark.parametrize("theirs, ours", PAIRS)
def test_instances_are_base_streamers_like_stock(qwen3, theirs, ours):
    async def build() -> Any:
        return ours(qwen3, skip_prompt=True)

    ours_instance = asyncio.run(build())
    assert isinstance(ours_instance, stock.BaseStreamer) and isinstance(ours_instance, ours)
    assert type(ours_instance).__name__ == ours.__name__
    # The class still shows its own constructor's signature.
    assert list(inspect.signature(ours).parameters)[:2] == ["tokenizer", "skip_prompt"]

    class Mine(ours):  # an application's subclass is one too
        pass

    async def build_mine() -> Any:
        return Mine(qwen3)

    assert isinstance(asyncio.run(build_mine()), stock.BaseStreamer)


def _diffusion_run(cls: Any, tok: Any, drafts_then_confirmed: list[list[list[int]]], capsys: Any) -> list[str]:
    """Drive a diffusion streamer as a block-diffusion generate() does: per block, drafts
    (whole blocks) then the confirmed block; return what reached the terminal per call."""
    streamer = cls(tok, skip_prompt=True)
    screens = []
    streamer.put(torch.tensor([[1, 2]]))  # the prompt, skipped
    for block in drafts_then_confirmed:
        *drafts, confirmed = block
        for draft in drafts:
            streamer.put_draft(torch.tensor([draft]))
            screens.append(capsys.readouterr().out)
        streamer.put(torch.tensor(confirmed))
        screens.append(capsys.readouterr().out)
    streamer.end()
    screens.append(capsys.readouterr().out)
    return screens


def test_diffusion_drafts_as_stock_and_confirmed_text_exact_and_prompt(qwen3, capsys):
    """Same drafts and draft wiping as stock's TextDiffusionStreamer; the confirmed text
    is the decode, each character printed with the block that completes it. Stock waits
    for a space or a newline, so emoji and kana come late there."""
    ids = qwen3.encode("こんにちは🫨世界 ok 👋🏽 done", add_special_tokens=False)
    blocks = [ids[k : k + 3] for k in range(0, len(ids), 3)]
    plan = [[[0] * len(b), b[:1] + [0] * (len(b) - 1), b] for b in blocks]  # two drafts, then confirmed
    theirs = _diffusion_run(stock.TextDiffusionStreamer, qwen3, plan, capsys)
    ours = _diffusion_run(DetokDiffusionStreamer, qwen3, plan, capsys)
    draft_screens = [k for k, screen in enumerate(theirs) if "\0337" in screen]
    assert draft_screens and [ours[k] for k in draft_screens] == [theirs[k] for k in draft_screens]

    def confirmed(screen: str) -> str:  # what stays: the text after the draft is wiped
        return screen.replace("\0338\033[J", "")

    text = "".join(confirmed(x) for k, x in enumerate(ours) if k not in draft_screens)
    assert text == qwen3.decode(ids) + "\n"
    done = ""
    for k, block in enumerate(blocks):  # after block k, every character it completed is out
        done = "".join(confirmed(ours[j]) for j in range(3 * k + 3) if j not in draft_screens)
        assert done == qwen3.decode(ids[: 3 * k + len(block)]).rstrip("\ufffd")
    stock_text = "".join(confirmed(x) for k, x in enumerate(theirs) if k not in draft_screens)
    assert stock_text == text  # stock ends with the same text, later


@pytest.mark.parametrize("theirs, ours", PAIRS)
def test_signature_extends_stock(theirs, ours):
    stock_params = list(inspect.signature(theirs.__init__).parameters.values())
    our_params = list(inspect.signature(ours.__init__).parameters.values())
    positional = [p for p in stock_params if p.kind != p.VAR_KEYWORD]
    assert [(p.name, p.default, p.kind) for p in our_params[: len(positional)]] == [
        (p.name, p.default, p.kind) for p in positional
    ]
    extra = our_params[len(positional) :]
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in extra)
    assert extra[-1].kind == extra[-1].VAR_KEYWORD  # **decode_kwargs still reaches decode
    for method in ("put", "end", "on_finalized_text"):
        assert list(inspect.signature(getattr(ours, method)).parameters) == list(
            inspect.signature(getattr(theirs, method)).parameters
        )


@pytest.mark.parametrize("theirs, ours", PAIRS)
def test_instances_keep_stock_attributes(qwen3, theirs, ours):
    async def build() -> tuple[Any, Any]:
        return theirs(qwen3, skip_prompt=True), ours(qwen3, skip_prompt=True)

    a, b = asyncio.run(build())
    missing = set(vars(a)) - set(vars(b))
    assert not missing
    for name in ("skip_prompt", "decode_kwargs", "token_cache", "print_len", "next_tokens_are_prompt"):
        assert getattr(a, name) == getattr(b, name)
    for name in ("__iter__", "__next__", "__aiter__", "__anext__"):
        assert hasattr(a, name) == hasattr(b, name)


# --- switching it on: install(), DETOK_PLUGIN=1 ---------------------------------------------


@pytest.fixture
def restore():
    yield
    shim.uninstall()


def test_install_rebinds_every_public_name_and_uninstall_restores(qwen3, restore):
    originals = (stock.TextStreamer, stock.TextIteratorStreamer, stock.AsyncTextIteratorStreamer)
    diffusion = stock.TextDiffusionStreamer
    shim.install()
    shim.install()  # idempotent
    # Look the modules up afresh: building a model can replace sys.modules["transformers"]
    # with a new lazy module (transformers does this itself), and a module object held
    # from before caches whatever it resolves while installed.
    import transformers as tf
    import transformers.generation as generation
    from transformers import TextIteratorStreamer, TextStreamer

    assert shim.installed()
    assert TextStreamer is DetokStreamer and TextIteratorStreamer is DetokIteratorStreamer
    assert tf.TextDiffusionStreamer is DetokDiffusionStreamer and stock.TextDiffusionStreamer is DetokDiffusionStreamer
    assert tf.AsyncTextIteratorStreamer is AsyncDetokIteratorStreamer
    assert generation.TextIteratorStreamer is DetokIteratorStreamer
    assert stock.TextStreamer is DetokStreamer
    assert shim.uninstall() is True
    assert shim.uninstall() is False
    assert (tf.TextStreamer, tf.TextIteratorStreamer, tf.AsyncTextIteratorStreamer) == originals
    assert (stock.TextStreamer, generation.TextIteratorStreamer) == (originals[0], originals[1])
    assert tf.TextDiffusionStreamer is diffusion and stock.TextDiffusionStreamer is diffusion
    from transformers import AsyncTextIteratorStreamer

    assert AsyncTextIteratorStreamer is originals[2]


_APP = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    assert "transformers" not in sys.modules  # the hook imports nothing at start
    from transformers import TextIteratorStreamer  # the application, unedited
    import tokenizer_zoo
    import torch
    tok = tokenizer_zoo.load("qwen3")
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    streamer.put(torch.tensor([[1]]))
    for i in (9284, 104, 101):  # 🫨 in three byte tokens
        streamer.put(torch.tensor([i]))
    streamer.end()
    print(type(streamer).__module__, type(streamer).__name__, list(streamer))
    """
)


@pytest.fixture(scope="module")
def flag_python(tmp_path_factory):
    """A fresh interpreter with its own site-packages: a .pth that adds ours, then the hook.

    It is a real interpreter start (``site`` processes the ``.pth`` files), and the
    project's virtualenv is left untouched.
    """
    root = tmp_path_factory.mktemp("flagvenv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    site_dir = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )
    ours = Path(transformers.__file__).resolve().parent.parent  # this venv's site-packages
    (site_dir / "a_detok_test_base.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")
    # The documented helper writes the hook's .pth into that site-packages.
    assert shim._main(["install-pth", "--site-dir", str(site_dir)]) == 0
    assert (site_dir / shim.PTH_NAME).read_text().strip() == shim.PTH_LINE
    return python


_NAMES = "TextStreamer, TextIteratorStreamer, AsyncTextIteratorStreamer, TextDiffusionStreamer"


@pytest.mark.parametrize(
    "flag, module, name, line",
    [
        ("1", "detok_plugin.integrations.transformers", "DetokIteratorStreamer",
         f"detok-plugin: on (DETOK_PLUGIN=1): transformers' {_NAMES} build detok-plugin's drop-ins"),
        ("0", "transformers.generation.streamers", "TextIteratorStreamer",
         "detok-plugin: off (DETOK_PLUGIN=0); transformers' streamers stay stock"),
        ("maybe", "transformers.generation.streamers", "TextIteratorStreamer",
         "detok-plugin: off (DETOK_PLUGIN='maybe' is not one of 1/0/true/false/yes/no/on/off; ignored); "
         "transformers' streamers stay stock"),
        (None, "transformers.generation.streamers", "TextIteratorStreamer", None),
    ],
    ids=["on", "off", "mistaken", "unset"],
)
def test_flag_switches_an_unedited_app_and_says_so_in_one_line(flag_python, flag, module, name, line):
    """The switch's one line, on stderr (the app configured no logging), when the app
    imports transformers' streamers; a clean line, not a ``<string>:1: UserWarning``."""
    env = {k: v for k, v in os.environ.items() if k not in (shim.ENV_FLAG, "PYTHONWARNINGS")}
    if flag is not None:
        env[shim.ENV_FLAG] = flag
    app = _APP.format(tests=str(ROOT / "tests" / "support"))
    out = subprocess.run([str(flag_python), "-c", app], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got_module, got_name, items = out.stdout.strip().split(" ", 2)
    assert (got_module, got_name) == (module, name)
    if flag == "1":
        # The emoji leaves at its third token (repr: Python 3.11 escapes the Unicode 15 🫨).
        assert ast.literal_eval(items) == ["", "", "🫨", ""]
    said = [x for x in out.stderr.splitlines() if "detok-plugin" in x]
    assert said == ([line] if line else []), out.stderr
    assert "UserWarning" not in out.stderr


@pytest.mark.parametrize("flag", ["1", "0", "maybe"])
def test_a_process_that_never_imports_the_streamers_hears_nothing(flag_python, flag):
    """The hook says its line only where transformers' streamers are imported: not in a
    process of another stack (vLLM's import transformers, never its streamers), nor here."""
    env = {k: v for k, v in os.environ.items() if k not in (shim.ENV_FLAG, "PYTHONWARNINGS")}
    env[shim.ENV_FLAG] = flag
    code = "import transformers, transformers.generation.utils, sys; print('transformers.generation.streamers' in sys.modules)"
    out = subprocess.run([str(flag_python), "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert "detok-plugin" not in out.stderr and "UserWarning" not in out.stderr, out.stderr


def test_with_the_apps_logging_the_line_goes_there(flag_python):
    """An application that set up logging gets the line through it (as
    ``detok_plugin.integrations.transformers``), not on stderr beside it."""
    env = {k: v for k, v in os.environ.items() if k not in (shim.ENV_FLAG, "PYTHONWARNINGS")}
    env[shim.ENV_FLAG] = "1"
    code = (
        "import logging, sys; logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='APP %(name)s %(message)s'); "
        "import transformers.generation.streamers"
    )
    out = subprocess.run([str(flag_python), "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "detok-plugin" not in out.stderr
    assert out.stdout.startswith("APP detok_plugin.integrations.transformers detok-plugin: on (DETOK_PLUGIN=1)")


def test_shim_without_transformers_imports_and_names_the_extra():
    code = textwrap.dedent(
        """
        import os, sys, warnings
        sys.modules["transformers"] = None
        import detok_plugin.integrations.transformers as shim
        from detok_plugin import TokenTable
        t = TokenTable("byte_level", (b"\\xf0\\x9f", b"\\xab", b"\\xa8"), frozenset())
        s = shim.DetokIteratorStreamer(t)   # streamers need no transformers import
        os.environ["DETOK_PLUGIN"] = "1"
        shim._startup()                     # arms the hook, never raises
        try:
            shim.install()
        except ImportError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install transformers (detok-plugin never installs a framework)" in out.stdout


def test_module_doctests():
    import doctest

    result = doctest.testmod(shim, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_wheel_ships_the_start_up_hook(tmp_path):
    """A regular install puts the DETOK_PLUGIN hook in site-packages (setup.py's build_py);
    the file is exactly PTH_LINE, so the install-pth command and the wheel agree."""
    import subprocess
    import sys
    import zipfile

    from detok_plugin.integrations import transformers as shim

    root = ROOT
    hook = root / "integrations" / shim.PTH_NAME
    assert hook.read_text(encoding="utf-8").strip() == shim.PTH_LINE
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(root)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    [wheel] = tmp_path.glob("detok_plugin-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert shim.PTH_NAME in names  # at the wheel's root, i.e. in site-packages
    assert zipfile.ZipFile(wheel).read(shim.PTH_NAME).decode().strip() == shim.PTH_LINE
