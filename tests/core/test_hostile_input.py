"""Hostile input to ``ServingStream``, the core's serving layer ("Exact at scale", hostile
input): what a server's loop may hand it, and what each gets.

Ids the tokenizer does not know (past the vocabulary, negative) are counted and render as
``""`` with ``on_unknown_id`` (the callback gets the :class:`TokenIdError`, to log it) and
raise it without; anything that is not an integer raises :class:`TokenTypeError`, callback
or not, and changes nothing. Options no request can mean (an empty stop string,
``max_tokens`` below 1, ``min_tokens`` below 0 or above ``max_tokens``) are refused when the
stream is opened, with a ``ValueError`` naming the option, as vLLM's ``SamplingParams``
refuses them. Everything else streams exactly: a thousand stops, a stop of 10,000
characters, stops of U+FFFD or lone surrogates, a prompt of 100,000 ids, a request that
ends (or is dropped) inside a character or a stop.
"""

from __future__ import annotations

import gc
import time
import tracemalloc

import pytest
from helpers import expected

from detok_plugin import ServingStream, StreamFinishedError, TokenIdError, TokenTypeError


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _stream(tok, seen=None, **kw):
    kw.setdefault("eos_token_ids", ())
    return ServingStream.from_tokenizer(tok, on_unknown_id=None if seen is None else seen.append, **kw)


def _run(s, ids):
    text = "".join(s.push_text(i) for i in ids if not s.finished)
    return text + ("" if s.finished else s.finish().text)


# --- ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, -(2**63), 10**30], ids=["minus-one", "int64-min", "huge"])
def test_ids_out_of_the_vocabulary_are_counted_and_skipped_with_a_callback(real_tokenizer, bad):
    """Between the bytes of a split character, past the vocabulary or negative: counted
    (``token_ids`` keeps it, as vLLM keeps it), rendered as ``""`` as the decode skips it,
    and reported once with its position; the text around it is exact."""
    tok = real_tokenizer
    ids = _ids(tok, "a🫨b 你好")
    hostile = [ids[0], ids[1], bad, *ids[2:]]
    seen: list[TokenIdError] = []
    s = _stream(tok, seen)
    assert _run(s, hostile) == expected(tok, [], ids)
    assert s.token_ids == hostile
    assert [(e.token_id, e.position) for e in seen] == [(bad, 2)]
    assert f"token id {bad} at position 2" in str(seen[0])


def test_an_unknown_id_raises_without_a_callback_and_the_stream_goes_on(qwen3):
    ids = _ids(qwen3, "🫨 ok")
    s = _stream(qwen3)
    s.push_text(ids[0])
    with pytest.raises(TokenIdError, match="position 1"):
        s.push_text(len(qwen3) + 1)
    assert s.token_ids == ids[:1]  # not counted
    assert _run(s, ids[1:]) == "🫨 ok"


@pytest.mark.parametrize("bad", [1.5, 2.0, "7", None, True, b"\x01"], ids=repr)
def test_anything_but_an_integer_raises_a_type_error_and_changes_nothing(qwen3, bad):
    """Callback or not: a float, a string, None, a bool (an int to Python, never an id)."""
    import numpy as np

    ids = _ids(qwen3, "é🫨 ok")
    for seen in (None, []):
        s = _stream(qwen3, seen)
        s.push_text(ids[0])
        with pytest.raises(TokenTypeError, match="position 1"):
            s.push_text(bad)
        with pytest.raises(TokenTypeError):
            s.push([ids[1], bad])  # a bad id anywhere in a push: none of it is taken
        assert s.token_ids == ids[:1] and not seen
        assert _run(s, [np.int64(i) for i in ids[1:]]) == "🫨 ok"  # integer scalars are ids


# --- stop strings ------------------------------------------------------------------------


def test_a_thousand_stops(real_tokenizer):
    """Overlapping, prefixes of each other, sharing first characters: the earliest-ending
    stop wins, the text before it is exact, and a stop set that size costs one automaton."""
    tok = real_tokenizer
    text = "The quick brown fox 🫨 jumps over the lazy dog. 你好，世界！" * 3
    ids = _ids(tok, text)
    full = expected(tok, [], ids)
    stops = [f"stop{k}" for k in range(990)] + ["lazy dogs", "lazy do", "azy", "世界！", "🫨 jumps over the lazy", "x" * 50]
    stops += ["dog. 你", "o", "The quick brown fox 🫨 jumps over"][:: -1] + ["zy", "z"]  # "o" ends first
    assert len(stops) == 1001
    t0 = time.process_time()
    s = _stream(tok, stop=stops)
    got = _run(s, ids)
    assert time.process_time() - t0 < 5  # one build, then a scan per character
    assert (got, s.stop_reason) == ("The quick br", "o")
    assert _run(_stream(tok, stop=stops[:990]), ids) == full  # none occurs: nothing held at the end


def test_a_stop_of_ten_thousand_characters(qwen3):
    """Held only while the text is a prefix of it (all of it, here, until it completes);
    text that cannot start it leaves at once."""
    stop = "ab" * 5000
    ids = _ids(qwen3, "x " + stop + " tail")
    s = _stream(qwen3, stop=[stop])
    first = s.push_text(ids[0])
    assert first == "x"  # no partial match: nothing held
    got = first + _run(s, ids[1:])
    assert (got, s.finish_reason, s.stop_reason) == ("x ", "stop", stop)
    # One character short of it, the stream ends with the whole partial match released.
    short = _ids(qwen3, "x " + stop[:-1])
    assert _run(_stream(qwen3, stop=[stop]), short) == "x " + stop[:-1]


@pytest.mark.parametrize("stops", [[""], ["ok", ""], ("",)], ids=["only", "among-others", "tuple"])
def test_an_empty_stop_is_refused_when_the_stream_opens(qwen3, stops):
    """An empty stop would match before any text: vLLM's SamplingParams refuses it, and so
    does the core, naming it."""
    with pytest.raises(ValueError, match="empty stop string"):
        _stream(qwen3, stop=stops)


def test_a_stop_of_u_fffd_only_ends_where_the_decode_shows_one(qwen3):
    """The decode of the ids so far shows U+FFFD while a character is split: a stop of
    U+FFFD counts there (the formula's text), not only at invalid bytes."""
    ids = _ids(qwen3, "ok 🫨 then")
    want = next(k for k in range(1, len(ids) + 1) if "\ufffd" in expected(qwen3, [], ids[:k]))
    s = _stream(qwen3, stop=["\ufffd"])
    got = _run(s, ids)
    assert (got, s.stop_reason, len(s.token_ids)) == ("ok ", "\ufffd", want)
    s = _stream(qwen3, stop=["\ufffd"], min_tokens=len(ids))  # never counts: all of it, exact
    assert _run(s, ids) == "ok 🫨 then"


@pytest.mark.parametrize("stop", ["\ud83e", "\udeab", "a\ud83e\udee8", "\ud800\udfff"], ids=["high", "low", "pair-in-text", "pair"])
def test_a_stop_with_lone_surrogates_never_matches_and_holds_nothing(real_tokenizer, stop):
    """A decode never makes a lone surrogate, so such a stop never completes; text that
    could start it (its first character, when that is real) is held only while it may."""
    tok = real_tokenizer
    ids = _ids(tok, "a🫨b 🫨 a")
    s = _stream(tok, stop=[stop, "\ud83e"])
    assert _run(s, ids) == expected(tok, [], ids)
    assert s.finish_reason is None


# --- limits ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "limits, match",
    [
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
        ({"max_tokens": -5}, "max_tokens must be at least 1, got -5"),
        ({"min_tokens": -1}, "min_tokens must be at least 0, got -1"),
    ],
    ids=["max-zero", "max-negative", "min-negative"],
)
def test_limits_no_request_can_mean_are_refused_when_the_stream_opens(qwen3, limits, match):
    """As vLLM's SamplingParams refuses them: a stream with ``max_tokens=0`` took one id and
    its text before ending "length"."""
    with pytest.raises(ValueError, match=match):
        _stream(qwen3, **limits)


@pytest.mark.parametrize("min_tokens", [3, 4, 50])
def test_min_tokens_at_or_above_max_tokens_ends_at_max_tokens_before_any_stop(qwen3, min_tokens):
    """vLLM refuses ``min_tokens`` above ``max_tokens`` (its SamplingParams); the core gives
    it the one meaning it can have: ``max_tokens`` ends the stream, no stop counts first."""
    ids = _ids(qwen3, "STOP and STOP again")
    s = _stream(qwen3, stop=["STOP"], stop_token_ids=ids[:3], min_tokens=min_tokens, max_tokens=3)
    assert (_run(s, ids), s.finish_reason, s.token_ids) == (expected(qwen3, [], ids[:3]), "length", ids[:3])


# --- prompts -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3", "mistral_v1"])
def test_a_prompt_of_a_hundred_thousand_ids(load_tokenizer, name):
    """Opening reads the prompt once (the decoder primes on its tail), and every id after
    costs what it costs after a short prompt; the text is the formula's, the prompt's held
    tail (it ends inside a character) included."""
    tok = load_tokenizer(name)
    ids = _ids(tok, "你好🫨 hello ありがとう " * 14000)
    prompt, out = ids[:100_000 - 2], ids[100_000 - 2 : 100_040]
    assert len(prompt) == 99_998
    t0 = time.process_time()
    s = _stream(tok, prompt_ids=prompt, stop=["\n\nUser:"])
    got = _run(s, out)
    assert time.process_time() - t0 < 5
    assert got == expected(tok, prompt, out)


def test_an_unknown_id_in_the_prompt_is_refused_naming_its_position(qwen3):
    """A prompt is the request's, checked before the loop: its unknown id raises when the
    stream opens (callback or not), at its (negative) position."""
    prompt = _ids(qwen3, "hello " * 50_000)
    prompt[-3] = len(qwen3) + 9
    with pytest.raises(TokenIdError, match=r"position -3\b"):
        _stream(qwen3, [], prompt_ids=prompt)


# --- a request that ends early ------------------------------------------------------------


def test_a_request_ended_inside_a_character_releases_what_the_decode_shows(real_tokenizer):
    tok = real_tokenizer
    ids = _ids(tok, "ok 🫨")
    cut = next(k for k in range(1, len(ids)) if expected(tok, [], ids[:k]).endswith("\ufffd"))
    s = _stream(tok, stop=["\n\nUser:"])
    assert _run(s, ids[:cut]) == expected(tok, [], ids[:cut])
    assert s.finished and s.finish_reason is None
    with pytest.raises(StreamFinishedError):
        s.push_text(ids[cut])
    with pytest.raises(StreamFinishedError):
        s.finish()


def test_a_request_ended_inside_a_stop_releases_the_partial_stop(qwen3):
    ids = _ids(qwen3, "Hello.\n\nUs")
    s = _stream(qwen3, stop=["\n\nUser:"])
    held = "".join(s.push_text(i) for i in ids)
    assert (held, s.held) == ("Hello.", "\n\nUs")
    assert (s.finish().text, s.finish_reason, s.stop_reason) == ("\n\nUs", None, None)


def test_requests_dropped_mid_character_and_mid_stop_leave_nothing_behind(qwen3):
    """Aborted requests' streams are dropped without finish() (vLLM's abort drops the
    detokenizer): nothing else holds them, so memory is flat over rounds of them."""
    ids = _ids(qwen3, "Hello 🫨.\n\nUs")
    mid_char = next(k for k in range(len(ids)) if expected(qwen3, [], ids[:k]).endswith("\ufffd"))

    def round_of_aborts() -> None:
        for n in range(300):
            s = _stream(qwen3, [], stop=["\n\nUser:", f"stop {n}"])
            for i in ids[: mid_char if n % 2 else len(ids)]:
                s.push_text(i)
            assert s.held or not s.finished

    round_of_aborts()  # the shared memos (automata, rest texts) fill once
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        round_of_aborts()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 300 * 1024  # a new stop set per request: its config and automaton are cached, bounded
