"""DetokenizerState on real tokenizers: exactness, promptness, goldens, bad input."""

from __future__ import annotations

import random

import pytest
from helpers import MULTILINGUAL, expected, probe_ids, settled, stream
from hypothesis import given
from hypothesis import strategies as st

from detok_plugin import (
    DetokenizerState,
    IncrementalDetokenizer,
    StreamFinishedError,
    TokenIdError,
    TokenTypeError,
    build_table,
)


def _chunk(ids: list[int], cuts: list[int]) -> list[list[int]]:
    points = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    return [ids[a:b] for a, b in zip(points, points[1:])]


def _byte_ids(table) -> list[int]:
    """The ids of single-byte pieces (byte-level) or ``<0xNN>`` pieces (SentencePiece)."""
    if table.family == "byte_level":
        return [i for i, p in enumerate(table.pieces) if p is not None and len(p) == 1]
    return [i for i, b in enumerate(table.byte_values) if b >= 0]


def _any_id(table) -> st.SearchStrategy[int]:
    """Any id of the vocabulary, with specials and byte pieces drawn often."""
    return st.one_of(
        st.integers(0, table.vocab_size - 1),
        st.sampled_from(sorted(table.special_ids)),
        st.sampled_from(_byte_ids(table)),
    )


def test_family_detected(real_tokenizer):
    s = DetokenizerState.from_tokenizer(real_tokenizer)
    want = "sentencepiece" if "Llama" in type(real_tokenizer).__name__ else "byte_level"
    assert s.path == want, s.why


@given(data=st.data())
def test_real_text_any_cut_any_chunking(real_tokenizer, data):
    """Real text in many scripts, cut anywhere into prompt and output, pushed in chunks."""
    tok = real_tokenizer
    text = "".join(data.draw(st.lists(st.sampled_from(MULTILINGUAL), min_size=1, max_size=3)))
    ids = tok.encode(text, add_special_tokens=False)
    cut = data.draw(st.integers(0, len(ids)))
    prompt, out = ids[:cut], ids[cut:]
    chunks = _chunk(out, data.draw(st.lists(st.integers(0, 400), max_size=8)))
    skip = data.draw(st.booleans())
    got = stream(tok, prompt, chunks, skip_special_tokens=skip)
    assert "".join(got) == expected(tok, prompt, out, skip)


@given(data=st.data())
def test_random_ids_whole_vocabulary(real_tokenizer, data):
    """Random ids, specials and byte tokens included: the harshest stream there is."""
    tok = real_tokenizer
    table, _ = build_table(tok)
    any_id = _any_id(table)
    prompt = data.draw(st.lists(any_id, max_size=6))
    out = data.draw(st.lists(any_id, max_size=16))
    chunks = _chunk(out, data.draw(st.lists(st.integers(0, 40), max_size=6)))
    skip = data.draw(st.booleans())
    got = stream(tok, prompt, chunks, skip_special_tokens=skip)
    assert "".join(got) == expected(tok, prompt, out, skip)


@given(data=st.data())
def test_prompt_every_character_leaves_at_its_token(real_tokenizer, data):
    """Invariant 2: after each push the stream has emitted exactly the settled text."""
    tok = real_tokenizer
    probes = probe_ids(tok)
    table, _ = build_table(tok)
    byte_ids = _byte_ids(table)
    if data.draw(st.booleans()):
        ids = tok.encode(data.draw(st.sampled_from(MULTILINGUAL)), add_special_tokens=False)[:20]
        cut = data.draw(st.integers(0, len(ids)))
        prompt, out = ids[:cut], ids[cut:]
    else:
        any_id = st.one_of(st.integers(0, table.vocab_size - 1), st.sampled_from(byte_ids))
        prompt = data.draw(st.lists(any_id, max_size=4))
        out = data.draw(st.lists(any_id, max_size=10))
    skip = data.draw(st.booleans())
    s = DetokenizerState.from_tokenizer(tok, prompt_ids=prompt, skip_special_tokens=skip, eos_token_ids=())
    emitted = ""
    for k, tid in enumerate(out):
        piece = s.push(tid).text
        emitted += piece
        assert emitted == settled(tok, prompt, out[: k + 1], probes, skip), (prompt, out[: k + 1])
        if "\ufffd" in piece:
            # A U+FFFD leaves only where the final decode of every continuation has it.
            assert emitted == settled(tok, prompt, out[: k + 1], probes, skip)
    assert emitted + s.finish().text == expected(tok, prompt, out, skip)


# --- goldens --------------------------------------------------------------------------


def test_golden_qwen3_shaking_face_leaves_at_third_token(qwen3):
    assert qwen3.encode("🫨", add_special_tokens=False) == [9284, 104, 101]
    assert [qwen3.decode([i]) for i in (9284, 104, 101)] == ["\ufffd"] * 3
    d = IncrementalDetokenizer(qwen3, [])
    assert [d.push(9284), d.push(104), d.push(101), d.flush()] == ["", "", "🫨", ""]


def test_golden_ni_split_in_two(qwen3):
    table, _ = build_table(qwen3)
    first = table.pieces.index(b"\xe4\xbd")
    second = table.pieces.index(b"\xa0")
    assert qwen3.decode([first, second]) == "你"
    d = IncrementalDetokenizer(qwen3, [])
    assert [d.push(first), d.push(second)] == ["", "你"]


@pytest.mark.parametrize(
    "text", ["👨‍👩‍👧‍👦", "こんにちは、ひらがな", "مرحبا بالعالم"], ids=["zwj-family", "kana", "arabic"]
)
def test_golden_scripts_stream_clean(real_tokenizer, text):
    tok = real_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, [])
    pieces = [d.push(i) for i in ids] + [d.flush()]
    assert "".join(pieces) == tok.decode(ids)
    assert not any("\ufffd" in p for p in pieces)
    assert pieces[-1] == "" or tok.decode(ids).endswith(pieces[-1])


def test_golden_zwj_family_per_token_decode_fails_but_stream_does_not(qwen3):
    ids = qwen3.encode("👨‍👩‍👧‍👦", add_special_tokens=False)
    assert any("\ufffd" in qwen3.decode([i]) for i in ids)  # the bug we exist to fix
    d = IncrementalDetokenizer(qwen3, [])
    assert "".join(d.push(i) for i in ids) == "👨‍👩‍👧‍👦"


def test_golden_sentencepiece_byte_fallback_emoji_at_start(mistral_v1):
    """Mistral v1 spells 🫨 as four <0xNN> pieces after ▁; the leading space is stripped.

    The run is released when the next non-byte piece closes it: ByteFallback renders a
    whole run as U+FFFD per byte if a later byte is invalid, so it cannot leave earlier.
    """
    ids = mistral_v1.encode("🫨 hi", add_special_tokens=False)
    assert ids[:5] == [28705, 243, 162, 174, 171]
    d = IncrementalDetokenizer(mistral_v1, [])
    pieces = [d.push(i) for i in ids]
    assert pieces[:5] == ["", "", "", "", ""]
    assert pieces[5] == "🫨 hi" and mistral_v1.decode(ids) == "🫨 hi"
    # An invalid byte in the run makes every byte piece U+FFFD, as the tokenizer renders it.
    bad = [243, 162, 174, 171, 255 + 3]
    assert mistral_v1.decode(bad) == "\ufffd" * 5
    d = IncrementalDetokenizer(mistral_v1, [])
    assert "".join(d.push(i) for i in bad) == "\ufffd" * 5


def test_certainly_invalid_bytes_leave_at_once(qwen3):
    table, _ = build_table(qwen3)
    lone = table.pieces.index(b"\x80")
    lead = table.pieces.index(b"\xe4")
    letter = table.pieces.index(b"a")
    d = IncrementalDetokenizer(qwen3, [])
    assert d.push(lone) == "\ufffd"  # a lone continuation byte is certain at once
    assert d.push(lead) == ""  # a lead byte may still complete
    assert d.push(letter) == "\ufffda"  # ... until a non-continuation arrives
    assert qwen3.decode([lone, lead, letter]) == "\ufffd\ufffda"


def _outcome(push, token_id):
    """What one push did: its text, or the error's type and message."""
    try:
        return push(token_id)
    except Exception as exc:  # the comparison is of the errors themselves
        return (type(exc), str(exc))


@given(data=st.data())
def test_incremental_detokenizer_pushes_as_the_states_push_text(real_tokenizer, data):
    """``IncrementalDetokenizer.push`` takes ``push_text``'s shortcut with fewer checks
    (``_plain_push``): id by id, the same text, ids and errors as ``push_text`` on the same
    options, also for ids past the vocabulary, bools, prompts that end inside a character
    (the first text skipped), and pushes after ``flush``."""
    tok = real_tokenizer
    table, _ = build_table(tok)
    odd = st.sampled_from([-1, table.vocab_size, table.vocab_size + 5, True, 2**70])
    any_id = st.one_of(_any_id(table), odd) if data.draw(st.booleans()) else _any_id(table)
    prompt = data.draw(st.lists(_any_id(table), max_size=6))
    out = data.draw(st.lists(any_id, max_size=24))
    skip = data.draw(st.booleans())
    plain = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    state = DetokenizerState.from_tokenizer(tok, prompt_ids=prompt, skip_special_tokens=skip, eos_token_ids=(), keep_log=False)
    flush_at = data.draw(st.integers(0, len(out) + 1))
    for k, tid in enumerate(out):
        if k == flush_at:
            assert plain.flush() == state.finish().text
        assert _outcome(plain.push, tid) == _outcome(state.push_text, tid), (prompt, out[: k + 1])
        assert plain._state.token_ids == state.token_ids


def test_prompt_ending_mid_character(qwen3):
    """vLLM #48853: a prompt that ends inside a character must not leak prompt text."""
    ids = qwen3.encode("Hello world 🫨!", add_special_tokens=False)
    cut = ids.index(104)  # the prompt ends after the first byte token of 🫨
    prompt, out = ids[:cut], ids[cut:]
    got = stream(qwen3, prompt, [[i] for i in out])
    assert "".join(got) == expected(qwen3, prompt, out)
    assert "Hello" not in "".join(got)


def test_sentencepiece_leading_space_rule_follows_the_prompt(mistral_v1):
    """The decoder strips one leading space of the whole text, so only at the very start."""
    the = mistral_v1.encode("The", add_special_tokens=False)  # [▁The]
    assert stream(mistral_v1, [], [the])[0] == "The"
    assert "".join(stream(mistral_v1, the, [the])) == " The"
    # <s> is special: skipped, it leaves the text empty and the strip still applies.
    assert "".join(stream(mistral_v1, [1], [the], skip_special_tokens=True)) == "The"
    assert "".join(stream(mistral_v1, [1], [the], skip_special_tokens=False)) == " The"


# --- bad input ------------------------------------------------------------------------


def test_out_of_range_id_names_id_and_position(qwen3):
    s = DetokenizerState.from_tokenizer(qwen3, request_id="req-7")
    s.push([1, 2])
    with pytest.raises(TokenIdError) as e:
        s.push([3, 10**7])
    assert e.value.token_id == 10**7 and e.value.position == 3 and "req-7" in str(e.value)
    assert "10000000" in str(e.value) and "position 3" in str(e.value)
    with pytest.raises(TokenIdError):
        s.push(-1)
    assert s.push(5).text == qwen3.decode([5])  # nothing was half-applied


def test_bad_prompt_id_has_negative_position(qwen3):
    with pytest.raises(TokenIdError) as e:
        DetokenizerState.from_tokenizer(qwen3, prompt_ids=[1, 2**31, 3])
    assert e.value.position == -2


@pytest.mark.parametrize("value", ["a", 1.5, None, True, b"x"], ids=["str", "float", "none", "bool", "bytes"])
def test_wrong_type_is_typed(qwen3, value):
    s = DetokenizerState.from_tokenizer(qwen3)
    with pytest.raises(TokenTypeError) as e:
        s.push([1, value] if value is not None else value)
    assert isinstance(e.value, TypeError)


def test_numpy_like_integers_accepted(qwen3):
    class Index:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    s = DetokenizerState.from_tokenizer(qwen3)
    assert s.push([Index(i) for i in (9284, 104, 101)]).text == "🫨"


def test_push_after_finish(qwen3):
    s = DetokenizerState.from_tokenizer(qwen3)
    s.push(1)
    s.finish()
    with pytest.raises(StreamFinishedError) as e:
        s.push(2)
    assert e.value.position == 1 and isinstance(e.value, RuntimeError)
    with pytest.raises(StreamFinishedError):
        s.finish()


# --- the generic path -----------------------------------------------------------------


class DecodeOnly:
    """A tokenizer that offers only ``decode(ids)`` and ``len()``; records window sizes."""

    def __init__(self, tok):
        self.tok = tok
        self.windows: list[int] = []

    def __len__(self):
        return len(self.tok)

    def decode(self, ids, skip_special_tokens=False):
        self.windows.append(len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


@given(data=st.data())
def test_generic_path_exact(real_tokenizer, data):
    # The generic path is exact for decoders that are local (what one token adds depends on
    # a few neighbours): byte-level BPE here. ByteFallback is not: it renders a whole byte
    # run as U+FFFD when any byte of it is invalid, so a window that starts or ends inside
    # a run sees other text. That is why SentencePiece has its own table path
    # (docs/design.md, "The generic path").
    if build_table(real_tokenizer)[0].family != "byte_level":
        pytest.skip("ByteFallback decoding is not local; covered by the sentencepiece path")
    tok = DecodeOnly(real_tokenizer)
    if data.draw(st.booleans()):
        ids = real_tokenizer.encode("".join(data.draw(st.lists(st.sampled_from(MULTILINGUAL), min_size=1, max_size=2))), add_special_tokens=False)
    else:
        ids = data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=20))
    cut = data.draw(st.integers(0, len(ids)))
    prompt, out = ids[:cut], ids[cut:]
    s = DetokenizerState.from_tokenizer(tok, prompt_ids=prompt, eos_token_ids=())
    assert s.path == "generic"
    got = "".join(s.push(i).text for i in out) + s.finish().text
    assert got == expected(real_tokenizer, prompt, out)


@pytest.mark.parametrize("kind", ["cjk", "random"])
def test_generic_path_window_is_bounded(qwen3, kind):
    """O(1): the decode window never grows with the stream, even on invalid bytes."""
    rng = random.Random(7)
    if kind == "cjk":
        ids = qwen3.encode("你好世界こんにちは🫨👨‍👩‍👧‍👦" * 150, add_special_tokens=False)
    else:
        table, _ = build_table(qwen3)
        byte_ids = [i for i, p in enumerate(table.pieces) if p is not None and len(p) == 1]
        ids = [rng.choice(byte_ids) for _ in range(2000)]
    tok = DecodeOnly(qwen3)
    s = DetokenizerState.from_tokenizer(tok, eos_token_ids=())
    got = "".join(s.push(i).text for i in ids) + s.finish().text
    assert got == qwen3.decode(ids)
    assert max(tok.windows) <= 16, max(tok.windows)


def test_surrogate_prefix_is_certain_at_once(qwen3, mistral_v1):
    """ED A0 starts an encoded surrogate: invalid at once, though CPython's incremental
    decoder would keep it for a third byte."""
    table, _ = build_table(qwen3)
    ed, a1 = table.pieces.index(b"\xed"), table.pieces.index(b"\xa1")
    d = IncrementalDetokenizer(qwen3, [])
    assert [d.push(ed), d.push(a1)] == ["", "\ufffd\ufffd"]
    assert qwen3.decode([ed, a1]) == "\ufffd\ufffd"
    sp = [0xED + 3, 0xA1 + 3]  # <0xED> <0xA1>
    d = IncrementalDetokenizer(mistral_v1, [])
    assert [d.push(sp[0]), d.push(sp[1])] == ["", "\ufffd\ufffd"]
    assert mistral_v1.decode(sp) == "\ufffd\ufffd"


@pytest.fixture(scope="module")
def cleaning_mistral():
    """Mistral v1 with transformers' clean_up_tokenization_spaces forced on (5.x skips it
    for BPE unless forced): a real decode that rewrites " ." to "." across the text."""
    import copy

    import tokenizer_zoo

    tok = copy.deepcopy(tokenizer_zoo.load("mistral_v1"))
    tok.clean_up_tokenization_spaces = True
    tok.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    assert tok.decode(tok.encode("a . b n't", add_special_tokens=False)) == "a. bn't"
    return tok


@given(data=st.data())
def test_cleanup_tokenizer_streams_exactly(cleaning_mistral, data):
    tok = cleaning_mistral
    words = ["Hello", " .", " ,", " ?", " n't", " 's", " 've", " ' ", " world", "  ", "你好", " !"]
    text = "".join(data.draw(st.lists(st.sampled_from(words), min_size=1, max_size=10)))
    ids = tok.encode(text, add_special_tokens=False)
    cut = data.draw(st.integers(0, len(ids)))
    s = DetokenizerState.from_tokenizer(tok, prompt_ids=ids[:cut], eos_token_ids=())
    assert s.path == "generic" and "clean_up" in s.why
    got = "".join(s.push(i).text for i in ids[cut:]) + s.finish().text
    assert got == expected(tok, ids[:cut], ids[cut:])


def test_cleanup_reaching_back_into_the_prompt_follows_the_formula(cleaning_mistral):
    """decode(prompt) = "Hello " but decode(prompt + out) = "Hello.": the rule removed a
    space the prompt already showed. The stream follows the formula by position, so the
    "." takes the space's slot and nothing is emitted for it (docs/design.md)."""
    tok = cleaning_mistral
    prompt = tok.encode("Hello", add_special_tokens=False) + [28705]  # "Hello" + "▁"
    out = [tok.convert_tokens_to_ids(".")]
    assert tok.decode(prompt) == "Hello " and tok.decode(prompt + out) == "Hello."
    got = "".join(stream(tok, prompt, [out]))
    assert got == expected(tok, prompt, out) == ""


@given(data=st.data())
def test_idle_decoder_quick_text_is_what_feed_one_returns(real_tokenizer, data):
    """The hot loops' shortcut (``StreamDecoder.idle`` / ``quick``): while a decoder is
    idle, ``quick[i]`` (when not None) is exactly ``feed_one(i)``, and feeding it changes
    nothing: the decoder stays idle, holds nothing, and later output is unchanged."""
    from detok_plugin._decoders import ByteLevelStream, SentencePieceStream

    table, _ = build_table(real_tokenizer)
    any_id = _any_id(table)
    skip = data.draw(st.booleans())
    cls = ByteLevelStream if table.family == "byte_level" else SentencePieceStream
    shortcut, plain = cls(table, skip_special_tokens=skip), cls(table, skip_special_tokens=skip)
    prompt = data.draw(st.lists(any_id, max_size=4))
    shortcut.prime(prompt)
    plain.prime(prompt)
    for i in data.draw(st.lists(any_id, max_size=24)):
        if table.pieces[i] is None:
            continue
        want = plain.feed_one(i)
        if shortcut.idle and shortcut.quick[i] is not None:
            assert shortcut.quick[i] == want
            assert plain.idle and not plain.holds()
        else:
            assert shortcut.feed_one(i) == want
        assert shortcut.idle == plain.idle
    assert shortcut.flush() == plain.flush()
