"""WordPiece on the generic path, with special tokens skipped or kept ("Exact at scale",
first item).

WordPiece's decoder puts a space before every token but the text's first (and strips the
``##`` of a continuation only after the first). ``skip_special_tokens=True`` removes special
tokens before the decoder runs, so ``hi [SEP] there`` decodes to ``hi there``. The generic
path's window used to start at a skipped special token: the decoder then saw ``there`` as
the text's first token and the stream emitted ``hithere``, a stop string lost its space, and
what was emitted was no prefix of the final text. Skipped ids now never enter the window
(``GenericStream``, step 6).

The tokenizer is built here with ``tokenizers`` (a WordPiece model, BERT's normalizer and
pre-tokenizer, the WordPiece decoder) and wrapped in transformers' ``BertTokenizerFast``
with BERT's special tokens: a real tokenizer, small enough that the oracle below can try
every next token.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detok_plugin import ServingStream

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDS = ("hi", "there", "hello", "world", "do", "a", "n", "t", "##s", "##ing", ".", ",", "?", "!", "'")


@pytest.fixture(scope="module")
def bert():
    """A BERT-style WordPiece tokenizer: specials 0-4, then WORDS. transformers 5 leaves
    ``clean_up_tokenization_spaces`` off unless asked; it stays off here."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import BertTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    tok = BertTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)
    assert sorted(tok.all_special_ids) == list(range(len(SPECIALS)))
    assert tok.decode(tok.encode("hi there", add_special_tokens=False)) == "hi there"
    return tok


def _decode(tok, ids, skip, spaces):
    return tok.decode(list(ids), skip_special_tokens=skip, spaces_between_special_tokens=spaces)


def _expected(tok, prompt, out, skip, spaces):
    """The invariant's formula: ``decode(prompt + out)[len(decode(prompt)):]``, same flags."""
    return _decode(tok, prompt + out, skip, spaces)[len(_decode(tok, prompt, skip, spaces)) :]


def _settled(tok, prompt, out, skip, spaces):
    """The text no next token can change: the common prefix of the formula at the end and
    after every token of the vocabulary (WordPiece's decoder renders each token from itself
    and whether it is the first, so one token of look-ahead is every future)."""
    texts = [_expected(tok, prompt, out + nxt, skip, spaces) for nxt in [[], *([i] for i in range(len(tok)))]]
    return os.path.commonprefix(texts)


def _partial(text, stop):
    """Characters at the end of ``text`` that are a proper prefix of ``stop``: all the stream
    may hold back."""
    return next((k for k in range(min(len(stop) - 1, len(text)), 0, -1) if text.endswith(stop[:k])), 0)


SPECIAL = st.integers(0, len(SPECIALS) - 1)
WORD = st.integers(len(SPECIALS), len(SPECIALS) + len(WORDS) - 1)


@pytest.mark.parametrize("where", ["between", "start", "end"])
@pytest.mark.parametrize("spaces", [True, False], ids=["spaces_between", "no_spaces_between"])
@pytest.mark.parametrize("skip", [True, False], ids=["skip_special", "keep_special"])
@pytest.mark.parametrize("with_stop", [False, True], ids=["no_stop", "stop"])
@given(data=st.data())
def test_special_tokens_between_at_start_at_end_stream_exactly(bert, where, spaces, skip, with_stop, data):
    """Against the decode oracle, after every id: the joined stream is the formula's text cut
    before the first stop (and the stream stops at the id that completes it); nothing
    emitted is taken back; and each character leaves at the id that completes it unless a
    stop could still be forming there (held text is exactly the longest partial stop)."""
    words = data.draw(st.lists(WORD, min_size=2, max_size=6), label="words")
    specials = data.draw(st.lists(SPECIAL, min_size=1, max_size=3), label="specials")
    if where == "start":
        ids = specials + words
    elif where == "end":
        ids = words + specials
    else:
        at = data.draw(st.integers(1, len(words) - 1), label="at")
        ids = words[:at] + specials + words[at:]
    cut = data.draw(st.integers(0, len(ids) - 1), label="prompt length")
    prompt, out = ids[:cut], ids[cut:]
    final = _expected(bert, prompt, out, skip, spaces)
    stop = None
    if with_stop and final:
        a = data.draw(st.integers(0, len(final) - 1), label="stop start")
        stop = final[a : data.draw(st.integers(a + 1, min(len(final), a + 6)), label="stop end")]
    s = ServingStream.from_tokenizer(
        bert, prompt_ids=prompt, skip_special_tokens=skip, spaces_between_special_tokens=spaces,
        stop=[stop] if stop else (), eos_token_ids=(),
    )
    assert s.path == "generic"
    joined = ""
    for k, tid in enumerate(out, 1):
        joined += s.push_text(tid)
        now = _expected(bert, prompt, out[:k], skip, spaces)
        if stop and stop in now:  # the earliest-completing stop: cut before it, and end here
            assert (joined, s.finish_reason) == (now[: now.index(stop)], "stop"), (prompt, out[:k], stop)
            return
        assert s.finish_reason is None
        assert final.startswith(joined), ("taken back", prompt, out[:k], joined, final)
        settled = _settled(bert, prompt, out[:k], skip, spaces)
        held = _partial(settled, stop) if stop else 0
        assert joined == settled[: len(settled) - held], ("held or lost", prompt, out[:k], stop, joined, settled)
    joined += s.finish().text
    assert joined == final


@pytest.mark.parametrize("skip", [True, False])
def test_a_skipped_special_token_between_two_words_keeps_their_space(bert, skip):
    """The fuzz's first case: ``hello`` in the prompt, then ``hi [SEP] there``: ``' hi there'``
    with [SEP] skipped (the stream sent ``' hithere'``), ``' hi [SEP] there'`` with it kept; and
    a continuation after a skipped special token loses its ``##`` as in the full decode."""
    v = bert.convert_tokens_to_ids
    prompt, out = [v("hello")], [v("hi"), v("[SEP]"), v("there"), v("[SEP]"), v("##s")]
    s = ServingStream.from_tokenizer(bert, prompt_ids=prompt, skip_special_tokens=skip, eos_token_ids=())
    pieces = [s.push_text(i) for i in out] + [s.finish().text]
    if skip:
        assert pieces == [" hi", "", " there", "", "s", ""]
    else:
        assert pieces == [" hi", " [SEP]", " there", " [SEP]", "s", ""]
    assert "".join(pieces) == _expected(bert, prompt, out, skip, True)


@pytest.mark.parametrize(("stop", "pieces"), [(" there", [" hi", "", ""]), ("i there", [" h", "", ""])])
def test_a_stop_across_a_skipped_special_token_is_cut_at_its_space(bert, stop, pieces):
    """A stop that spans the space a skipped [SEP] stands in is found where it completes and
    cut there (the stream had no space there: it missed the stop and emitted ``hithere``)."""
    v = bert.convert_tokens_to_ids
    s = ServingStream.from_tokenizer(
        bert, prompt_ids=[v("[CLS]"), v("hello")], skip_special_tokens=True, stop=[stop], eos_token_ids=()
    )
    assert [s.push_text(i) for i in (v("hi"), v("[SEP]"), v("there"))] == pieces
    assert (s.finish_reason, s.stop_reason) == ("stop", stop)


@pytest.mark.parametrize("skip", [True, False], ids=["skip_special", "keep_special"])
@given(data=st.data())
def test_a_schedulers_watch_takes_what_push_text_takes(bert, skip, data):
    """``ServingStream.watch`` on the generic path (no at-rest texts, no remembered moves):
    every step is ``otherwise``'s, and after each the stream has taken exactly what
    ``push_text`` of each id takes (ids, finish, held), stop or none."""
    out = data.draw(st.lists(st.one_of(WORD, SPECIAL), min_size=1, max_size=8), label="out")
    stop = data.draw(st.sampled_from([(), ("hi there",), ("s.",), ("[SEP]",)]), label="stop")
    kw = dict(skip_special_tokens=skip, stop=stop, eos_token_ids=())
    s, ref = ServingStream.from_tokenizer(bert, **kw), ServingStream.from_tokenizer(bert, **kw)
    assert s.path == "generic"
    ids: list[int] = []
    calls = []

    def otherwise(appended):
        calls.append(appended)
        return s.follow(ids)

    check = s.watch(ids, otherwise, lambda held: calls.append(("holding", held)))
    for tid in out:
        if ref.finish_reason is not None:
            break
        ids.append(tid)
        ref.push_text(tid)
        assert check(1) == (ref.finish_reason is None and ref.held == "")
        assert (s.token_ids, s.finish_reason, s.stop_reason, s.held) == (
            ref.token_ids, ref.finish_reason, ref.stop_reason, ref.held)
    assert calls == [1] * len(ids)
