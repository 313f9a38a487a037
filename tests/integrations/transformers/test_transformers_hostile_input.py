"""Hostile input to the transformers streamers ("Exact at scale", hostile input), through the
streamer protocol ``generate()`` drives (``put`` of the prompt, ``put`` per step, ``end``) and
through ``generate()`` itself where a model can produce the input.

``generate()`` is the loop here. What stock ``TextStreamer`` does with the same input is the
host's own behaviour: it decodes, so an id past the tokenizer (a padded vocabulary) renders
as ``""``, and a negative or float id fails the decode (``OverflowError``, ``TypeError``).
The drop-ins raise the core's typed errors (``TokenIdError``, ``TokenTypeError``) for the
last two; the first renders as the decode renders it, as stock goes on, logged once a stream.
Stop strings of any number, length or content stream exactly; an empty stop is refused
when the streamer is built (not in ``generate()``'s thread); a stream ended inside a
character or a stop releases what the decode shows. The streamers have no ``max_tokens``
or ``min_tokens``: ``generate()``'s own limits decide how many ids come.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from detok_plugin.integrations.transformers import DetokStreamer  # noqa: E402
from helpers import expected  # noqa: E402
from transformers.generation import streamers as stock  # noqa: E402

from detok_plugin import TokenIdError, TokenTypeError  # noqa: E402


class Texts:
    """A streamer class that records its texts instead of printing them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.texts: list[str] = []

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.texts.append(text)


class Ours(Texts, DetokStreamer):
    pass


class Stock(Texts, stock.TextStreamer):
    pass


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _stream(streamer, prompt, steps):
    """The calls ``generate()`` makes: the prompt (2-D), each step's ids (1-D), ``end()``."""
    streamer.put(torch.tensor([prompt]))
    for ids in steps:
        streamer.put(torch.tensor(ids))
    streamer.end()
    return "".join(streamer.texts)


# --- ids -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def padded_qwen3(qwen3):
    """A tiny random Qwen3 whose vocabulary is padded past the tokenizer's (as Qwen3's own
    embedding is: 151,936 rows for 151,669 ids), and a processor that makes it sample one
    id past the tokenizer at the third step."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=len(qwen3) + 64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        pad_token_id=qwen3.pad_token_id, eos_token_id=None,
    )
    model = transformers.Qwen3ForCausalLM(config).eval()
    unknown = len(qwen3) + 5

    class Force(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            if input_ids.shape[1] == 3:  # the prompt is 1 id: the third generated id
                scores[:, :] = -float("inf")
                scores[:, unknown] = 0
            return scores

    def generate(streamer):
        return model.generate(
            torch.tensor([[qwen3.encode("hi")[0]]]), max_new_tokens=6, do_sample=False, streamer=streamer,
            logits_processor=transformers.LogitsProcessorList([Force()]),
        )

    return generate, unknown


def test_stock_skips_an_id_past_the_tokenizer_in_generate(qwen3, padded_qwen3):
    generate, unknown = padded_qwen3
    streamer = Stock(qwen3, skip_prompt=True)
    out = generate(streamer)[0, 1:].tolist()
    assert unknown in out
    assert "".join(streamer.texts) == qwen3.decode(out)  # the decode skips it


def test_an_id_past_the_tokenizer_is_skipped_as_stock_skips_it(qwen3, padded_qwen3, caplog):
    """DetokStreamer raised TokenIdError out of generate() here, where stock goes on."""
    generate, unknown = padded_qwen3
    streamer = Ours(qwen3, skip_prompt=True)
    with caplog.at_level(logging.WARNING, logger="detok_plugin.integrations.transformers"):
        out = generate(streamer)[0, 1:].tolist()
    assert unknown in out and "".join(streamer.texts) == qwen3.decode(out)
    assert f"token id {unknown} at position 2" in caplog.text


def test_ids_past_the_tokenizer_in_one_put_are_skipped_and_logged_once(qwen3, caplog):
    """Several per put (the criteria's catch-up, a speculative step), around a character's
    bytes and before a stop: the text is the decode's, one WARNING a stream."""
    ids = _ids(qwen3, "hi 🫨 there, stop here")
    past = len(qwen3) + 7
    hostile = [ids[0], past, *ids[1:4], past, past, *ids[4:]]
    with caplog.at_level(logging.WARNING, logger="detok_plugin.integrations.transformers"):
        s = Ours(qwen3, skip_prompt=True, stop=["stop"])
        assert _stream(s, ids[:1], [hostile[:4], hostile[4:]]) == qwen3.decode(hostile).split("stop")[0]
        assert s.stop_reason == "stop"
        s = Ours(qwen3, skip_prompt=True)
        assert _stream(s, ids[:1], [[i] for i in hostile]) == qwen3.decode(hostile)
    assert caplog.text.count(f"token id {past}") == 2  # once per stream, of three in each


@pytest.mark.parametrize(
    "bad, ours, theirs",
    [(-1, TokenIdError, OverflowError), (1.5, TokenTypeError, TypeError)],
    ids=["negative", "float"],
)
def test_a_negative_or_float_id_raises_a_typed_error_where_stock_fails_its_decode(qwen3, bad, ours, theirs):
    """``TokenTypeError`` is a ``TypeError`` (stock's type); ``TokenIdError`` names the id and
    its position where stock's ``OverflowError`` names neither."""
    ids = _ids(qwen3, "hello 🫨")
    with pytest.raises(theirs):
        _stream(Stock(qwen3, skip_prompt=True), ids[:1], [ids[1:2], [bad]])
    with pytest.raises(ours, match="position 1"):
        _stream(Ours(qwen3, skip_prompt=True), ids[:1], [ids[1:2], [bad]])
    assert issubclass(TokenTypeError, TypeError) and issubclass(TokenIdError, ValueError)


# --- stop strings ----------------------------------------------------------------------------


def test_a_thousand_stop_strings(qwen3):
    ids = _ids(qwen3, "The quick brown fox 🫨 jumps over the lazy dog. " * 4)
    stops = [f"stop {k}" for k in range(997)] + ["lazy dogs", "🫨 jumps", "own"]
    s = Ours(qwen3, skip_prompt=True, stop=stops)
    assert _stream(s, ids[:1], [[i] for i in ids[1:]]) == expected(qwen3, ids[:1], ids[1:])[: len(" quick br")]
    assert (s.finish_reason, s.stop_reason) == ("stop", "own")


def test_a_stop_of_ten_thousand_characters(qwen3):
    stop = "ab" * 5000
    ids = _ids(qwen3, "x " + stop + " tail")
    s = Ours(qwen3, stop=[stop])
    assert _stream(s, ids[:1], [[i] for i in ids[1:]]) == "x "
    assert s.texts[0] == "x" and s.stop_reason == stop  # the prompt's "x" left at once


@pytest.mark.parametrize("stops", [[""], ["ok", ""]], ids=["only", "among-others"])
def test_an_empty_stop_is_refused_when_the_streamer_is_built(qwen3, stops):
    """Not in generate()'s thread: the constructor opens a stream with the options."""
    with pytest.raises(ValueError, match="empty stop string"):
        Ours(qwen3, stop=stops)


def test_a_stop_of_u_fffd_ends_where_the_decode_shows_one(qwen3):
    ids = _ids(qwen3, "ok 🫨 then")
    s = Ours(qwen3, skip_prompt=True, stop=["\ufffd"])
    assert _stream(s, ids[:1], [[i] for i in ids[1:]]) == " "
    assert s.stop_reason == "\ufffd"


@pytest.mark.parametrize("stop", ["\ud83e", "a\ud83e\udee8"], ids=["lone-high", "pair-in-text"])
def test_a_stop_with_lone_surrogates_never_matches(qwen3, stop):
    ids = _ids(qwen3, "a🫨b 🫨 a")
    s = Ours(qwen3, stop=[stop])
    assert _stream(s, ids[:2], [[i] for i in ids[2:]]) == qwen3.decode(ids)
    assert s.finish_reason is None


# --- prompts, limits, ends -------------------------------------------------------------------


@pytest.mark.parametrize("skip_prompt", [True, False])
def test_a_prompt_of_a_hundred_thousand_ids(qwen3, skip_prompt):
    """Not skipped, the prompt is the start of the text: one push of 100,000 ids."""
    prompt = _ids(qwen3, "你好🫨 hello ありがとう " * 14_000)[: 100_000 - 1]  # ends inside 🫨
    out = _ids(qwen3, "🫨 and after")
    t0 = time.process_time()
    got = _stream(Ours(qwen3, skip_prompt=skip_prompt, stop=["\n\nUser:"]), prompt, [[i] for i in out])
    assert time.process_time() - t0 < 10
    assert got == (qwen3.decode(out) if skip_prompt else qwen3.decode(prompt + out))


def test_no_generated_ids_end_as_stock_ends(qwen3):
    """``max_new_tokens`` reached before any id (or a criteria that stops at once): the
    prompt, then ``end()``, as stock."""
    prompt = _ids(qwen3, "hello")
    for skip in (True, False):
        ours, theirs = Ours(qwen3, skip_prompt=skip), Stock(qwen3, skip_prompt=skip)
        assert _stream(ours, prompt, []) == _stream(theirs, prompt, []) == ("" if skip else "hello")
        assert len(ours.texts) == len(theirs.texts)  # one text per put (none when skipped) and the end


@pytest.mark.parametrize("where", ["mid-character", "mid-stop"])
def test_a_generation_ended_inside_a_character_or_a_stop_releases_what_the_decode_shows(qwen3, where):
    """A stopping criteria (or max_new_tokens) ends generate() there, which calls end(): the
    half character is rendered as the decode renders it, the partial stop is released."""
    text = "Hello 🫨" if where == "mid-character" else "Hello.\n\nUs"
    ids = _ids(qwen3, text)
    out = ids[1 : len(ids) - 1] if where == "mid-character" else ids[1:]
    s = Ours(qwen3, skip_prompt=True, stop=["\n\nUser:"])
    got = _stream(s, ids[:1], [[i] for i in out])
    assert got == qwen3.decode(out) and s.finish_reason is None
    assert got.endswith("\ufffd") if where == "mid-character" else s.texts[-1] == "\n\nUs"
