"""ServingStream, the serving layer: the reference's content, with its own paths at rest and
through a split character.

The property that it streams exactly what DetokenizerState.push_text streams, on every real
tokenizer and random stops, min/max tokens and include flags, is in test_state_boundary
(test_push_text_equals_push_and_the_reference); here, what is its own.
"""

from __future__ import annotations

import pytest
from helpers import expected, probe_ids
from hypothesis import given
from hypothesis import strategies as st

from detok_plugin import DetokenizerState, ServingStream, TokenIdError


def test_stop_ids_eos_and_max_tokens_end_the_stream_at_rest(qwen3):
    """Ids the rest table knows still end the stream where the reference would: a stop id,
    EOS, the id that reaches max_tokens."""
    hello = qwen3.encode(" hello", add_special_tokens=False)[0]
    eos = qwen3.convert_tokens_to_ids("<|im_end|>")
    warm = ServingStream.from_tokenizer(qwen3, eos_token_ids=())
    assert [warm.push_text(i) for i in (hello, eos)] == [" hello", "<|im_end|>"]  # both known now
    s = ServingStream.from_tokenizer(qwen3, eos_token_ids=(eos,))
    assert s.push_text(hello) == " hello" and s.push_text(eos) == ""
    assert (s.finish_reason, s.stop_reason, s.finished, s.token_ids) == ("stop", None, True, [hello, eos])
    s = ServingStream.from_tokenizer(qwen3, stop_token_ids=[hello], eos_token_ids=())
    assert s.push_text(hello) == "" and (s.finish_reason, s.stop_reason) == ("stop", hello)
    s = ServingStream.from_tokenizer(qwen3, max_tokens=2, eos_token_ids=())
    assert s.push_text(hello) == " hello" and s.finish_reason is None
    assert s.push_text(hello) == " hello" and s.finish_reason == "length"


def test_unknown_ids_count_and_render_empty_with_a_callback_and_raise_without(qwen3):
    """on_unknown_id: an id past the vocabulary is counted, renders as "" (the tokenizer's
    decode skips it) and reaches the callback as a TokenIdError naming it and its position;
    the text around it stays exact, a split character included."""
    emoji = qwen3.encode("🫨 ok", add_special_tokens=False)
    unknown = len(qwen3) + 5
    ids = [emoji[0], unknown, *emoji[1:]]
    seen: list[TokenIdError] = []
    s = ServingStream.from_tokenizer(qwen3, eos_token_ids=(), on_unknown_id=seen.append)
    text = "".join(s.push_text(i) for i in ids) + s.finish().text
    assert text == expected(qwen3, [], emoji)
    assert s.token_ids == ids
    assert [(e.token_id, e.position) for e in seen] == [(unknown, 1)]
    strict = ServingStream.from_tokenizer(qwen3, eos_token_ids=())
    with pytest.raises(TokenIdError):
        strict.push_text(unknown)
    assert strict.token_ids == []
    # Several ids in one push: taken one by one with the callback, refused whole without.
    s = ServingStream.from_tokenizer(qwen3, eos_token_ids=(), on_unknown_id=seen.append)
    assert s.push(ids).consumed == len(ids) and s.token_ids == ids
    with pytest.raises(TokenIdError):
        ServingStream.from_tokenizer(qwen3, eos_token_ids=()).push(ids)


def test_bad_ids_get_typed_errors_at_rest_too(qwen3):
    """The path at rest takes ints only: anything else reaches the reference's checks."""
    from detok_plugin import TokenTypeError

    s = ServingStream.from_tokenizer(qwen3, eos_token_ids=())
    for bad in ("a", True, 1.0, None):
        with pytest.raises(TokenTypeError):
            s.push_text(bad)  # type: ignore[arg-type]
    with pytest.raises(TokenIdError):
        s.push_text(-1)
    assert s.token_ids == [] and s.push_text(qwen3.encode(" ok", add_special_tokens=False)[0]) == " ok"


def test_a_stop_inside_a_multi_id_push_consumes_up_to_it(qwen3):
    ids = qwen3.encode("Hello there. STOP and more words", add_special_tokens=False)
    for callback in (None, lambda exc: None):
        s = ServingStream.from_tokenizer(qwen3, stop=["STOP"], eos_token_ids=(), on_unknown_id=callback)
        d = s.push(ids)
        ref = DetokenizerState.from_tokenizer(qwen3, stop=["STOP"], eos_token_ids=())
        want = ref.push(ids)
        assert (d.text, d.finish_reason, d.stop_reason, d.consumed) == (
            want.text, want.finish_reason, want.stop_reason, want.consumed
        )
        assert d.text == "Hello there. " and d.consumed < len(ids) and s.token_ids == ids[: d.consumed]


def test_several_ids_at_rest_in_one_push_are_what_push_text_gives_one_by_one(qwen3):
    """A push of several ids that each leave the stream at rest takes them in one go; any
    one that does not (a stop id, the one reaching max_tokens, a bool, a numpy integer, an
    id not seen at rest yet, one holding a stop's first character) sends the push one by
    one: text, count, ids taken and finish are push_text's, with and without the callback."""
    import numpy as np

    words = qwen3.encode(" one two three four five six", add_special_tokens=False)
    unseen = qwen3.encode(" zebrafish", add_special_tokens=False)
    newline = qwen3.encode("\n", add_special_tokens=False)
    cases = [
        ({}, words),
        ({"stop_token_ids": [words[2]]}, words),
        ({"max_tokens": 4}, words[:4]),
        ({"max_tokens": 4}, words[:3]),
        ({"max_tokens": 4}, words[:5]),
        ({}, [words[0], True, words[1]]),
        ({}, [words[0], np.int64(words[1]), words[2]]),
        ({}, words[:2] + unseen + words[2:]),
        ({"stop": ["\nX"]}, words[:2] + newline + words[2:]),
    ]
    for callback in (None, lambda exc: None):
        for kw, ids in cases:
            opts = {"eos_token_ids": (), "on_unknown_id": callback, **kw}
            # The rest texts of these stops learnt (ids that end the stream aside).
            warm = ServingStream.from_tokenizer(qwen3, eos_token_ids=(), stop=kw.get("stop", ()))
            for i in words:
                warm.push_text(i)
            one = ServingStream.from_tokenizer(qwen3, **opts)
            texts = []
            try:
                for i in ids:
                    if one.finished:
                        break
                    texts.append(one.push_text(i))
            except Exception as exc:  # noqa: BLE001  (a bool: the same error from push)
                with pytest.raises(type(exc)):
                    ServingStream.from_tokenizer(qwen3, **opts).push(ids)
                continue
            s = ServingStream.from_tokenizer(qwen3, **opts)
            d = s.push(ids)
            assert (d.text, d.consumed, d.finish_reason, d.stop_reason) == (
                "".join(texts), len(one.token_ids), one.finish_reason, one.stop_reason
            ), (kw, ids)
            assert s.token_ids == one.token_ids and all(type(i) is int for i in s.token_ids)


def test_rest_texts_are_shared_by_the_stops_first_characters(qwen3):
    """What a stream learns at rest depends on the stops' first characters only: streams
    whose stop sets differ but start alike share it (a set never seen before costs nothing);
    an id whose text holds such a character is recorded as never taken at rest (None), so
    the rule runs once per id and dict."""
    hello, newline = (qwen3.encode(t, add_special_tokens=False)[0] for t in (" hello", "\n"))
    a = ServingStream.from_tokenizer(qwen3, stop=["\n\nUser:", "Observation:"], eos_token_ids=())
    b = ServingStream.from_tokenizer(qwen3, stop=["\nUser 7:", "Observe"], eos_token_ids=())
    c = ServingStream.from_tokenizer(qwen3, stop=["###"], eos_token_ids=())
    assert a._known is b._known and c._known is not a._known
    assert a.push_text(hello) == " hello" and a._known[hello] == " hello"
    assert a.push_text(newline) == "" and a._known[newline] is None  # "\n" may start a stop
    assert c.push_text(newline) == "\n" and c._known[newline] == "\n"


def test_a_partial_stop_moves_by_remembered_scans_and_the_reference_catches_up(qwen3):
    """A stop partly matched and given up, or still held at the end, takes the moves of
    scans remembered by an earlier stream (Matcher.steps) without the reference; the
    reference, built at the first text no scan remembers, starts where those moves left the
    boundary: id by id, every stream gives what the reference gives."""
    stops = ["\n\nUser:", "###"]
    seen = qwen3.encode("Hi.\nThe end.\n\nUs", add_special_tokens=False)
    novel = qwen3.encode(" zebra-quokka §", add_special_tokens=False)  # no scan of these from "\n"

    def check(ids: list[int], built: bool) -> None:
        ref = DetokenizerState.from_tokenizer(qwen3, stop=stops, eos_token_ids=())
        s = ServingStream.from_tokenizer(qwen3, stop=stops, eos_token_ids=())
        for i in ids:
            assert s.push_text(i) == ref.push_text(i)
            assert (s.held, s.finish_reason) == (ref.held, ref.finish_reason)
        assert (s._state is not None) == built  # noqa: SLF001
        assert s.finish().text == ref.finish().text and s.token_ids == ref.token_ids

    check(seen, built=True)  # the first stream scans: the reference decides
    check(seen, built=False)  # held "\n" and "\n\nUs", given up at "The": remembered moves
    newline = qwen3.encode("Hi.\n", add_special_tokens=False)
    check(newline + novel, built=True)  # "\n" held by a move, then a scan no stream made


@given(data=st.data())
def test_split_characters_end_the_stream_where_the_reference_does(real_tokenizer, data):
    """While a character is split across ids the serving stream feeds the reference's decoder
    itself: an id that ends the stream there (a stop id, max_tokens), a stop that starts or
    completes in the finished character, min_tokens and the include flag give, id by id,
    what the reference gives, and so does the end of the stream."""
    tok = real_tokenizer
    pieces = st.sampled_from(["🫨", "你好", "é", " ok", "\n", "🇯🇵", "a🫨b", "ありがとう"])
    ids = tok.encode("".join(data.draw(st.lists(pieces, min_size=1, max_size=6))), add_special_tokens=False)
    kw = dict(
        stop=data.draw(st.lists(st.sampled_from(["🫨", "好", "\n\n", "ok", "a🫨", "\ufffd"]), max_size=2)),
        stop_token_ids=data.draw(st.lists(st.sampled_from(ids), max_size=1)),
        eos_token_ids=(),
        max_tokens=data.draw(st.sampled_from([None, 1, 2, 3, 5, 8])),
        min_tokens=data.draw(st.integers(0, 2)),
        include_stop_str_in_output=data.draw(st.booleans()),
    )
    ref = DetokenizerState.from_tokenizer(tok, **kw)
    s = ServingStream.from_tokenizer(tok, **kw)
    for i in ids:
        if ref.finished:
            break
        want = ref.push(i)
        assert s.push_text(i) == want.text
        assert (s.finish_reason, s.stop_reason) == (want.finish_reason, want.stop_reason)
    assert s.finished == ref.finished
    if not ref.finished:
        assert s.finish().text == ref.finish().text
    assert s.token_ids == ref.token_ids


@given(data=st.data())
def test_prompts_special_tokens_and_several_ids_a_push_follow_the_reference(real_tokenizer, data):
    """What test_state_boundary's property leaves fixed, drawn here: a prompt (ending inside
    a character or not), ``skip_special_tokens``, special ids among the output, stop ids,
    ``max_tokens``, and several ids in one ``push`` (a speculative step) beside ``push_text``
    of one. Push by push, the serving stream gives the reference's text, finish and count
    of ids taken, and the same error for an id the tokenizer does not know."""
    tok = real_tokenizer
    special = sorted(getattr(tok, "all_special_ids", None) or [])[:8]
    text_ids = tok.encode("🫨 hi 你好，世界 é\n\nUser: ありがとう 🇯🇵", add_special_tokens=False)
    pool = st.one_of(
        st.sampled_from(text_ids), st.sampled_from(probe_ids(tok)[2]), st.integers(0, len(tok) + 2),
        *([st.sampled_from(special)] if special else []),
    )
    prompt = data.draw(st.lists(pool, max_size=6))
    out = data.draw(st.lists(pool, min_size=1, max_size=20))
    full = tok.decode([i for i in out if i < len(tok)], skip_special_tokens=False)
    stops = [s for s in data.draw(st.lists(
        st.one_of(st.tuples(st.integers(0, max(0, len(full) - 1)), st.integers(1, 4)).map(lambda ab: full[ab[0]: ab[0] + ab[1]]),
                  st.sampled_from(["\n\nUser:", "🫨", "\ufffd"])), max_size=2)) if s]
    kw = dict(
        prompt_ids=prompt, skip_special_tokens=data.draw(st.booleans()), stop=stops,
        stop_token_ids=data.draw(st.lists(st.sampled_from(out), max_size=1)), eos_token_ids=(),
        max_tokens=data.draw(st.sampled_from([None, 2, 7])), min_tokens=data.draw(st.integers(0, 3)),
        include_stop_str_in_output=data.draw(st.booleans()),
    )
    try:
        ref = DetokenizerState.from_tokenizer(tok, **kw)
    except TokenIdError:
        with pytest.raises(TokenIdError):
            ServingStream.from_tokenizer(tok, **kw)
        return
    s = ServingStream.from_tokenizer(tok, **kw)
    k = 0
    while k < len(out) and not ref.finished:
        n = data.draw(st.sampled_from([1, 1, 2, 3]))
        chunk = out[k : k + n]
        k += n
        try:
            want = ref.push(chunk if n > 1 else chunk[0])
        except TokenIdError as exc:
            with pytest.raises(TokenIdError) as got_exc:
                s.push(chunk) if n > 1 else s.push_text(chunk[0])
            assert (got_exc.value.token_id, got_exc.value.position) == (exc.token_id, exc.position)
            break
        if n > 1:
            got = s.push(chunk)
            assert (got.text, got.consumed) == (want.text, want.consumed)
        else:
            assert s.push_text(chunk[0]) == want.text
        assert (s.finish_reason, s.stop_reason, s.token_ids) == (ref.finish_reason, ref.stop_reason, ref.token_ids)
    assert s.finished == ref.finished
    if not ref.finished:
        assert s.finish().text == ref.finish().text
