"""ServingStream.follow: a scheduler's view of the same stream (the whole output so far in,
whether the stream is quiet out), against push_text of the same ids, id by id."""

from __future__ import annotations

from array import array

from hypothesis import given
from hypothesis import strategies as st

from detok_plugin import ServingStream


@given(data=st.data())
def test_follow_takes_what_push_text_takes_and_says_when_it_is_quiet(real_tokenizer, data):
    """The output grows by one id or several (a speculative step) between calls, in SGLang's
    ``array("q")`` or a list: ``follow`` takes the ids past those taken, up to a finish,
    exactly as ``push_text`` of each does (the ids taken, the finish, the held text), and
    returns True exactly when nothing is held and no stop completed."""
    tok = real_tokenizer
    text_ids = tok.encode("🫨 hi 你好，世界 é\n\nUser: ありがとう ###", add_special_tokens=False)
    out = data.draw(st.lists(st.sampled_from(text_ids), min_size=1, max_size=24))
    kw = dict(
        prompt_ids=data.draw(st.lists(st.sampled_from(text_ids), max_size=4)),
        stop=data.draw(st.lists(st.sampled_from(["\n\nUser:", "🫨", "你好", "###", "é"]), max_size=2)),
        stop_token_ids=data.draw(st.lists(st.sampled_from(out), max_size=1)), eos_token_ids=(),
        max_tokens=data.draw(st.sampled_from([None, 3, 9])),
    )
    ref = ServingStream.from_tokenizer(tok, **kw)
    s = ServingStream.from_tokenizer(tok, **kw)
    ids = array("q") if data.draw(st.booleans()) else []
    k = 0
    while k < len(out) and ref.finish_reason is None:
        n = data.draw(st.sampled_from([1, 1, 1, 2, 3]))
        ids.extend(out[k : k + n])
        k += n
        for i in out[k - n : k]:
            if ref.finish_reason is None:
                ref.push_text(i)
        quiet = s.follow(ids)
        assert (s.token_ids, s.finish_reason, s.stop_reason, s.held) == (ref.token_ids, ref.finish_reason, ref.stop_reason, ref.held)
        assert quiet == (ref.finish_reason is None and ref.held == "")


def test_follow_of_a_cut_output_changes_nothing(qwen3):
    """Ids shorter than those taken (the server dropped output ids): nothing taken, False."""
    s = ServingStream.from_tokenizer(qwen3, stop=["###"], eos_token_ids=())
    ids = qwen3.encode("one two three", add_special_tokens=False)
    assert s.follow(ids) is True
    assert s.follow(ids[:1]) is False and s.token_ids == ids
    assert s.follow(ids + ids) is True and s.token_ids == ids + ids
