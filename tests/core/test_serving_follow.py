"""ServingStream.follow and watch: a scheduler's view of the same stream (the whole output
so far in, whether the stream is quiet out), against push_text of the same ids, id by id."""

from __future__ import annotations

from array import array
from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from detok_plugin import ServingStream


def _drawn(tok, data):
    """A drawn case: the stream under test, the reference (fed by ``push_text``), the output
    ids (a list or SGLang's ``array("q")``) and an iterator that grows them by one id or
    several (a speculative step) per step, feeding the reference each, up to its finish,
    and yields how many it appended."""
    text_ids = tok.encode("🫨 hi 你好，世界 é\n\nUser: ありがとう ###", add_special_tokens=False)
    text_ids += [tok.eos_token_id] if tok.eos_token_id is not None else []  # a special token
    out = data.draw(st.lists(st.sampled_from(text_ids), min_size=1, max_size=24))
    kw = dict(
        skip_special_tokens=data.draw(st.booleans()),
        prompt_ids=data.draw(st.lists(st.sampled_from(text_ids), max_size=4)),
        stop=data.draw(st.lists(st.sampled_from(["\n\nUser:", "🫨", "你好", "###", "é"]), max_size=2)),
        stop_token_ids=data.draw(st.lists(st.sampled_from(out), max_size=1)),
        eos_token_ids=(),
        max_tokens=data.draw(st.sampled_from([None, None, 3, 9])),
    )
    ref = ServingStream.from_tokenizer(tok, **kw)
    ids = array("q") if data.draw(st.booleans()) else []

    def grow():
        k = 0
        while k < len(out) and ref.finish_reason is None:
            n = data.draw(st.sampled_from([1, 1, 1, 2, 3]))
            appended = out[k : k + n]
            ids.extend(appended)
            k += n
            for i in appended:
                if ref.finish_reason is None:
                    ref.push_text(i)
            yield len(appended)

    return ServingStream.from_tokenizer(tok, **kw), ref, ids, grow()


def _state(s):
    return s.token_ids, s.finish_reason, s.stop_reason, s.held


@given(data=st.data())
def test_follow_takes_what_push_text_takes_and_says_when_it_is_quiet(real_tokenizer, data):
    """The output grows by one id or several between calls: ``follow`` takes the ids past
    those taken, up to a finish, exactly as ``push_text`` of each does (the ids taken, the
    finish, the held text), and returns True exactly when nothing is held and no stop
    completed."""
    s, ref, ids, steps = _drawn(real_tokenizer, data)
    for _ in steps:
        quiet = s.follow(ids)
        assert _state(s) == _state(ref)
        assert quiet == (ref.finish_reason is None and ref.held == "")


def test_follow_of_a_cut_output_changes_nothing(qwen3):
    """Ids shorter than those taken (the server dropped output ids): nothing taken, False."""
    s = ServingStream.from_tokenizer(qwen3, stop=["###"], eos_token_ids=())
    ids = qwen3.encode("one two three", add_special_tokens=False)
    assert s.follow(ids) is True
    assert s.follow(ids[:1]) is False and s.token_ids == ids
    assert s.follow(ids + ids) is True and s.token_ids == ids + ids


@given(data=st.data())
def test_watch_answers_what_following_answers(real_tokenizer, data):
    """``watch(ids, otherwise, holding)``, called with how many ids each step appended: each
    step's answer is False when the stream, having followed the ids, is quiet, ``otherwise``'s
    (which follows them here) when it finished, either while it holds a partial stop; the
    stream takes exactly what ``push_text`` of each id takes, whether the check took the
    step itself or handed it on; and a caller that marks the request held when
    ``otherwise`` finds the stream not quiet and as ``holding`` says (called only on a
    change) holds it exactly while the stream holds text or has finished."""
    s, ref, ids, steps = _drawn(real_tokenizer, data)
    holds = [False]

    def otherwise(appended):
        holds[0] = not s.follow(ids)
        return ("not quiet", appended) if holds[0] else False

    def holding(held):
        assert (held != "") is not holds[0]
        holds[0] = held != ""

    check = s.watch(ids, otherwise, holding)
    for appended in steps:
        got = check(appended)
        assert _state(s) == _state(ref)
        if ref.finish_reason is not None:  # a finish: otherwise's answer
            assert got == ("not quiet", appended)
        elif ref.held == "":
            assert got is False
        else:  # a partial stop: taken by the check (False, holding told) or otherwise's answer
            assert got in (False, ("not quiet", appended))
        assert holds[0] == (ref.finish_reason is not None or ref.held != "")


@given(data=st.data())
def test_watch_never_takes_an_id_twice_or_out_of_turn(real_tokenizer, data):
    """Told a wrong count (1 for none or for several, 2 for one): the check never takes an
    id twice or out of turn (the ids taken are always the output's first ids), and the
    first step it hands on brings the stream level with ``push_text`` of each id."""
    s, ref, ids, steps = _drawn(real_tokenizer, data)
    check = s.watch(ids, lambda appended: s.follow(ids) and False, lambda held: None)
    for appended in steps:
        for told in data.draw(st.lists(st.sampled_from([appended, 1, 2, 0]), min_size=1, max_size=3)):
            check(told)
            assert s.token_ids == list(ids[: len(s.token_ids)])
    check(0)
    assert _state(s) == _state(ref)


def test_watch_takes_the_common_steps_without_otherwise(qwen3):
    """Ids seen before, one per step: those that leave the stream at rest, and those whose
    boundary move is remembered (``".\n"`` begins ``"\n\nUser:"``, the next word gives it
    up): after the first step (handed on: the check learns its place in the ids there), the
    check takes each itself, ``otherwise`` is not called again, and ``holding`` hears each
    start and end of the hold."""
    words = qwen3.encode("the quick fox.\nthe lazy dog.\nthe end", add_special_tokens=False)
    ServingStream.from_tokenizer(qwen3, stop=["\n\nUser:"], eos_token_ids=()).follow(words)  # seen
    s = ServingStream.from_tokenizer(qwen3, stop=["\n\nUser:"], eos_token_ids=())
    calls, holds = [], []
    ids: list[int] = []
    check = s.watch(ids, lambda appended: calls.append(appended) or not s.follow(ids), holds.append)
    for i in words:
        ids.append(i)
        assert check(1) is False
    assert calls == [1] and s.token_ids == words
    assert holds == ["\n", "", "\n", ""]


def test_watch_hands_on_every_other_step_and_takes_nothing_out_of_turn(qwen3):
    """Two ids at once, or none (as when the caller replaced its output: the held one stops
    growing): ``otherwise`` each time, nothing taken by the check; a stream with stop ids or max_tokens, or output
    ids whose iterator cannot be placed (a deque), gets ``otherwise`` itself."""
    words = qwen3.encode("the quick brown fox", add_special_tokens=False)
    ServingStream.from_tokenizer(qwen3, eos_token_ids=()).follow(words)
    s = ServingStream.from_tokenizer(qwen3, eos_token_ids=())
    calls = []
    ids: list[int] = []

    def otherwise(appended):
        calls.append((appended, len(s.token_ids)))
        return "handed on" if s.follow(ids) else "not quiet"

    check = s.watch(ids, otherwise, print)
    ids.append(words[0])
    assert check(1) == "handed on"  # the first step: the check's place is set there
    ids += words[1:3]
    assert check(2) == "handed on" and s.token_ids == words[:3]
    assert check(1) == "handed on" and s.token_ids == words[:3]  # none appended (or the output replaced)
    ids.append(words[3])
    assert check(1) is False and s.token_ids == words  # taken by the check: no call
    assert calls == [(1, 0), (2, 1), (1, 3)]
    for kw in ({"stop_token_ids": [words[0]]}, {"max_tokens": 9}, {"eos_token_ids": None}):
        bounded = ServingStream.from_tokenizer(qwen3, **kw)
        assert bounded.watch([], print, print) is print
    assert s.watch(deque(words), print, print) is print
