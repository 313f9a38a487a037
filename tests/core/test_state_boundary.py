"""The one boundary rule: stop strings, tags and channels in the same stream."""

from __future__ import annotations

import json
import os

import pytest
from helpers import MULTILINGUAL, expected, probe_ids, settled
from hypothesis import assume, given
from hypothesis import strategies as st

from detok_plugin import DetokenizerState, Segment, ServingStream, TagSet, TokenTable


def table_of(*pieces: str | bytes, special: tuple[int, ...] = ()) -> TokenTable:
    """A byte-level table whose token i is ``pieces[i]``: goldens choose exact splits."""
    raw = tuple(p.encode() if isinstance(p, str) else p for p in pieces)
    return TokenTable("byte_level", raw, frozenset(special), eos_token_ids=())


def run(tok, ids, chunks=None, **kw):
    kw.setdefault("eos_token_ids", ())
    s = DetokenizerState.from_tokenizer(tok, **kw)
    deltas = []
    pushes = [[i] for i in ids] if chunks is None else chunks
    for c in pushes:
        d = s.push(c)
        deltas.append(d)
        if d.finished:
            break
    if not s.finished:
        deltas.append(s.finish())
    return s, deltas


def joined(deltas, field="text"):
    return "".join(getattr(d, field) for d in deltas)


# --- stops: goldens -------------------------------------------------------------------


def test_stop_split_over_three_tokens():
    t = table_of("Hello", " ##", "#", "# tail", "x")
    s, ds = run(t, [0, 1, 2, 3, 4], stop=["####"])
    assert [d.text for d in ds] == ["Hello", " ", "", ""]
    assert ds[-1].finish_reason == "stop" and ds[-1].stop_reason == "####"
    assert s.token_ids == [0, 1, 2, 3]


def test_stop_inside_one_token_with_text_after_it():
    t = table_of("a", "b<END>c", "d")
    _, ds = run(t, [0, 1, 2], stop=["<END>"])
    assert joined(ds) == "ab" and ds[-1].stop_reason == "<END>"
    _, ds = run(t, [0, 1, 2], stop=["<END>"], include_stop_str_in_output=True)
    assert joined(ds) == "ab<END>"


def test_overlapping_stops_earliest_completion_wins():
    t = table_of("xabcd")
    _, ds = run(t, [0], stop=["abcd", "bc"])
    assert ds[-1].stop_reason == "bc" and joined(ds) == "xa"


def test_stops_ending_together_follow_list_order():
    """Same end: the stop listed first wins, as vLLM's check_stop_strings ranks them."""
    t = table_of("x", "abc")
    _, ds = run(t, [0, 1], stop=["bc", "abc"])
    assert ds[-1].stop_reason == "bc" and joined(ds) == "xa"
    _, ds = run(t, [0, 1], stop=["abc", "bc"])
    assert ds[-1].stop_reason == "abc" and joined(ds) == "x"


def test_kept_stop_holds_nothing():
    """include_stop_str_in_output: a partial stop leaves at once; it is shown either way."""
    t = table_of("x a", "b", "c", "tail")
    _, ds = run(t, [0, 1, 2, 3], stop=["abc"], include_stop_str_in_output=True)
    assert [d.text for d in ds] == ["x a", "b", "c"] and ds[-1].stop_reason == "abc"


def test_stop_inside_a_byte_fallback_run_stops_at_the_completing_byte(mistral_v1):
    """ᄀ is <0xE1><0x84><0x80>; the run is held (a later byte could void it), but if the
    stream ends at the third byte the run is final, so the stop counts there (vLLM's rule)."""
    ids = [264, 228, 135, 131, 287]  # ▁a <0xE1> <0x84> <0x80> ▁b
    assert mistral_v1.decode(ids[:4]) == "aᄀ"
    s = DetokenizerState.from_tokenizer(mistral_v1, stop=["ᄀ"], eos_token_ids=())
    d = s.push(ids)
    assert (d.text, d.stop_reason, d.consumed, s.token_ids) == ("a", "ᄀ", 4, ids[:4])


@pytest.mark.parametrize("verb", ["push", "push_text"])
def test_a_long_byte_fallback_run_is_scanned_once_not_once_per_byte(mistral_v1, monkeypatch, verb):
    """Invariant 3 on SentencePiece: a run of byte pieces is held until it ends, and after
    every byte the held text, rendered as final, is checked for a stop. Checking all of
    it each time is O(run) per byte (O(N^2) over a long run of emoji or rare script);
    the stream scans only what each byte added. A stop completing inside a run is still
    found (the test above), and one completing at the end of this run too."""
    from detok_plugin._matcher import Matcher

    scanned = []
    real = Matcher.scan

    def counting(self, state, text):
        scanned.append(len(text))
        return real(self, state, text)

    monkeypatch.setattr(Matcher, "scan", counting)
    text = "🫨" * 400 + "👍"
    ids = mistral_v1.encode(text, add_special_tokens=False)
    assert len(ids) > 1600 and mistral_v1.decode(ids) == text
    cases = [(["\n\nUser:"], text, []), (["🫨👍"], "🫨" * 399, [])]
    # A prompt that ends inside the run (the leading space and half of the first emoji):
    # the output continues the run, and its held text starts with what the prompt stands
    # for (two U+FFFD in decode(prompt)), which the check leaves out.
    cut = 3
    cases.append((["\n\nUser:"], mistral_v1.decode(ids)[len(mistral_v1.decode(ids[:cut])) :], ids[:cut]))
    for stops, want, prompt in cases:
        scanned.clear()
        s = DetokenizerState.from_tokenizer(mistral_v1, prompt_ids=prompt, stop=stops, eos_token_ids=())
        ids_out = ids[len(prompt) :]
        got = "".join(getattr(s, verb)(i) if verb == "push_text" else s.push(i).text for i in ids_out)
        if not s.finished:
            got += s.finish().text
        assert got == want
        assert sum(scanned) <= 4 * len(text)  # a few scans per character (per byte: over 10^6)


def test_stop_that_is_a_prefix_of_another():
    t = table_of("one", "ab", "c")
    _, ds = run(t, [0, 1, 2], stop=["abc", "ab"])
    assert ds[-1].stop_reason == "ab" and joined(ds) == "one"


def test_min_tokens_ignores_an_early_stop():
    t = table_of("STOP", " then ", "STOP", "!")
    _, ds = run(t, [0, 1, 2, 3], stop=["STOP"], min_tokens=2)
    assert joined(ds) == "STOP then " and ds[-1].stop_reason == "STOP"


def test_multi_token_push_consumes_up_to_the_stop():
    t = table_of("a", "b", "<", "/s>", "c", "d")
    s = DetokenizerState.from_tokenizer(t, stop=["</s>"], eos_token_ids=())
    d = s.push([0, 1, 2, 3, 4, 5])
    assert (d.text, d.consumed, d.finish_reason) == ("ab", 4, "stop")
    assert s.token_ids == [0, 1, 2, 3]


def test_stop_token_ids_and_eos():
    t = table_of("a", "b", "<eos>", "<stop>")
    _s, ds = run(t, [0, 2, 1], eos_token_ids=[2])
    assert joined(ds) == "a" and ds[-1].stop_reason is None and ds[-1].finish_reason == "stop"
    _s, ds = run(t, [0, 3, 1], stop_token_ids=[3], include_stop_str_in_output=True)
    assert joined(ds) == "a<stop>" and ds[-1].stop_reason == 3
    _s, ds = run(t, [3, 0, 3], stop_token_ids=[3], min_tokens=1)
    assert joined(ds) == "<stop>a" and ds[-1].stop_reason == 3


def test_max_tokens_is_length():
    t = table_of("a", "b", "c")
    _s, ds = run(t, [0, 1, 2], max_tokens=2)
    assert joined(ds) == "ab" and ds[-1].finish_reason == "length"


def test_zero_hold_without_a_partial_match(qwen3):
    """vLLM #11089: text that never ends in a prefix of the stop is delayed by nothing."""
    ids = qwen3.encode("".join(MULTILINGUAL[:5]), add_special_tokens=False)
    _, plain = run(qwen3, ids)
    _, stopped = run(qwen3, ids, stop=["\n\nUser:"])
    assert [d.text for d in plain] == [d.text for d in stopped]


def test_partial_stop_is_never_streamed_and_released_at_the_end():
    """TGI #1254: a partial stop must not reach the client while it may still complete."""
    t = table_of("Hi", "\n\nUs", "e")
    _, ds = run(t, [0, 1, 2], stop=["\n\nUser:"])
    assert [d.text for d in ds] == ["Hi", "", "", "\n\nUse"]
    assert ds[-1].finish_reason is None


def test_stop_across_a_split_character(qwen3):
    ids = qwen3.encode("答案是🫨。然后", add_special_tokens=False)
    _, ds = run(qwen3, ids, stop=["🫨。"])
    assert joined(ds) == "答案是" and ds[-1].stop_reason == "🫨。"


# --- tags and channels: goldens --------------------------------------------------------


def test_qwen3_reasoning_and_tool_call_channels(qwen3):
    text = (
        "<think>用户想知道时间。</think>好的🫨\n<tool_call>\n"
        '{"name": "get_time", "arguments": {"city": "東京"}}\n</tool_call>'
    )
    ids = qwen3.encode(text, add_special_tokens=False)
    assert 151667 in ids and 151657 in ids  # <think> and <tool_call> arrive as added tokens
    s, ds = run(qwen3, ids, tags="qwen3")
    assert joined(ds, "reasoning") == "用户想知道时间。"
    assert joined(ds) == "好的🫨\n"
    calls = [c for d in ds for c in d.tool_calls]
    assert "".join(c.text for c in calls) == '\n{"name": "get_time", "arguments": {"city": "東京"}}\n'
    done = [c for c in calls if c.complete]
    assert len(done) == 1 and done[0].name == "get_time"
    assert json.loads(done[0].arguments) == {"city": "東京"} and done[0].error is None
    assert "".join(seg.text for seg in s.log()) == qwen3.decode(ids)


def test_tag_spread_over_text_tokens():
    """A tag written as ordinary text over several tokens, split through a character."""
    tags = TagSet("custom", "<思考>", "</思考>")
    t = table_of("前", "<", b"\xe6\x80", b"\x9d\xe8\x80\x83>", "内", "</思", "考>", "后")
    _s, ds = run(t, list(range(8)), tags=tags)
    assert joined(ds) == "前后" and joined(ds, "reasoning") == "内"
    assert [d.text for d in ds][:2] == ["前", ""]


def test_tag_string_inside_a_tool_body_stays_in_the_body():
    t = table_of("<tool_call>", '{"name": "echo", "arguments": {"s": "<think>x</think>"}}', "</tool_call>", "ok")
    _s, ds = run(t, [0, 1, 2, 3], tags="qwen3")
    done = [c for d in ds for c in d.tool_calls if c.complete]
    assert json.loads(done[0].arguments) == {"s": "<think>x</think>"}
    assert joined(ds) == "ok" and joined(ds, "reasoning") == ""


def test_close_tag_without_open_tag_is_dropped_from_content_but_logged():
    t = table_of("thinking...", "</think>", "answer")
    s, ds = run(t, [0, 1, 2], tags="qwen3")
    assert joined(ds) == "thinking...answer"
    assert Segment("tag", "</think>") in s.log()


def test_prompt_ending_in_open_reasoning_starts_in_reasoning(qwen3):
    prompt = qwen3.encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    out = qwen3.encode("先想一想。</think>答案。", add_special_tokens=False)
    _, ds = run(qwen3, out, prompt_ids=prompt, tags="qwen3")
    assert joined(ds, "reasoning") == "先想一想。" and joined(ds) == "答案。"


def test_prompt_ending_in_an_open_tag_that_ends_in_a_newline_starts_in_reasoning(qwen3):
    """Gemma 4's reasoning opens with ``<|channel>thought\n``: a prompt that ends with it
    (the tag's own newline included) starts the reply inside reasoning."""
    tags = TagSet("newline_open", "<|channel>thought\n", "<channel|>", None, None)
    prompt = qwen3.encode("<|im_start|>assistant\n<|channel>thought\n", add_special_tokens=False)
    out = qwen3.encode("先想一想。<channel|>答案。", add_special_tokens=False)
    _, ds = run(qwen3, out, prompt_ids=prompt, tags=tags)
    assert joined(ds, "reasoning") == "先想一想。" and joined(ds) == "答案。"


def test_stop_inside_reasoning_is_ignored_unless_asked():
    t = table_of("<think>", "plan: STOP here", "</think>", "final STOP tail")
    _, ds = run(t, [0, 1, 2, 3], tags="qwen3", stop=["STOP"])
    assert joined(ds, "reasoning") == "plan: STOP here" and joined(ds) == "final "
    _, ds = run(t, [0, 1, 2, 3], tags="qwen3", stop=["STOP"], stop_in_reasoning=True)
    assert joined(ds, "reasoning") == "plan: " and ds[-1].stop_reason == "STOP"


def test_eos_while_a_partial_tag_is_held():
    t = table_of("text <tool_", "<eos>")
    _, ds = run(t, [0, 1], tags="qwen3", eos_token_ids=[1])
    assert [d.text for d in ds] == ["text ", "<tool_"] and ds[-1].finish_reason == "stop"


def test_unterminated_tool_call_is_reported_not_dropped():
    t = table_of("<tool_call>", '{"name": "f", ')
    _, ds = run(t, [0, 1], tags="qwen3")
    calls = [c for d in ds for c in d.tool_calls]
    assert "".join(c.text for c in calls) == '{"name": "f", '
    assert calls[-1].complete and "</tool_call>" in calls[-1].error


def test_malformed_tool_body_is_reported():
    t = table_of("<tool_call>", "{not json}", "</tool_call>")
    _, ds = run(t, [0, 1, 2], tags="qwen3")
    done = [c for d in ds for c in d.tool_calls if c.complete]
    assert done[0].error and done[0].error.startswith("malformed") and done[0].name is None


def test_mistral_tool_calls_detected_by_id_when_skipped():
    """[TOOL_CALLS] is a control token that skip_special_tokens=True drops from the text."""
    t = table_of("Sure.", "[TOOL_CALLS]", '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]', special=(1,))
    t = TokenTable(t.family, t.pieces, t.special_ids, added_tokens=((1, "[TOOL_CALLS]", True),))
    _, ds = run(t, [0, 1, 2], tags="mistral", skip_special_tokens=True)
    done = [c for d in ds for c in d.tool_calls if c.complete]
    assert [(c.index, c.name, json.loads(c.arguments)) for c in done] == [(0, "a", {}), (1, "b", {"x": 1})]
    assert joined(ds) == "Sure."


@pytest.mark.parametrize("mode", ["separate", "strip", "inline"])
def test_reasoning_modes(mode):
    t = table_of("<think>", "why", "</think>", "what")
    _, ds = run(t, [0, 1, 2, 3], tags="qwen3", reasoning=mode)
    want = {"separate": ("what", "why"), "strip": ("what", ""), "inline": ("<think>why</think>what", "")}
    assert (joined(ds), joined(ds, "reasoning")) == want[mode]


@pytest.mark.parametrize("chunk", [1, 3])
def test_tools_inline_keeps_tags_and_bodies_in_the_text_and_skips_stops_there(qwen3, chunk):
    """tools="inline": the joined text is the full decode up to the first stop outside the
    tool body (and, with reasoning inline and stop_in_reasoning off, outside reasoning);
    no ToolCall is built; "separate" on the same ids parses the call."""
    body = '{"name": "f", "arguments": {"q": "a STOP quoted 東京"}}'
    text = f"<think>plan STOP</think>Sure. <tool_call>\n{body}\n</tool_call> then STOP tail"
    ids = qwen3.encode(text, add_special_tokens=False)
    full = qwen3.decode(ids)
    chunks = [ids[k : k + chunk] for k in range(0, len(ids), chunk)]
    _, ds = run(qwen3, ids, chunks, tags="qwen3", reasoning="inline", tools="inline", stop=["STOP"])
    assert joined(ds) == full[: full.index("STOP tail")]
    assert not [c for d in ds for c in d.tool_calls] and ds[-1].stop_reason == "STOP"
    _, ds = run(qwen3, ids, chunks, tags="qwen3", reasoning="inline", stop=["STOP"])
    assert [json.loads(c.arguments) for d in ds for c in d.tool_calls if c.complete] == [{"q": "a STOP quoted 東京"}]
    assert joined(ds) == full[: full.index("<tool_call>")] + full[full.index("</tool_call>") + 12 : full.index("STOP tail")]


def test_tools_must_be_separate_or_inline(qwen3):
    with pytest.raises(ValueError, match="tools must be"):
        DetokenizerState.from_tokenizer(qwen3, tags="qwen3", tools="strip")


# --- properties -----------------------------------------------------------------------


def _reference_stop(tok, prompt, out, stops, min_tokens, include):
    """Non-streaming reference, vLLM's rule: the stream stops at the first token k >
    min_tokens where ``decode(prompt + out[:k])`` holds a stop that did not already show
    by token min_tokens (vLLM checks each step's new text only once the count passes
    min_tokens); of those, the one that ends first (ties: list order). What showed by
    then: the settled text, and the characters of a SentencePiece byte run that the decode
    renders as they come (held until the run ends, but vLLM's own stream shows them), as
    far as they agree with ``decode(prompt + out[:k])``; not a trailing U+FFFD (an unfinished
    character), which vLLM's stream holds."""
    shown = expected(tok, prompt, out[:min_tokens]).rstrip("\ufffd")
    settled_min = len(settled(tok, prompt, out[:min_tokens], probe_ids(tok), False)) if min_tokens else 0
    for k in range(min_tokens + 1, len(out) + 1):
        text = expected(tok, prompt, out[:k])
        # Agreement is with the decode of the ids up to k: ids after a stop are never
        # generated, so they cannot re-render (as U+FFFD) what had shown.
        settled_by_min = max(settled_min, len(os.path.commonprefix([shown, text]))) if min_tokens else 0
        best = None
        for rank, stop in enumerate(stops):
            start = text.find(stop)
            while start != -1:
                end = start + len(stop)
                if end > settled_by_min and (best is None or (end, rank) < best[0]):
                    best = ((end, rank), start, stop)
                start = text.find(stop, start + 1)
        if best is not None:
            (end, _), start, stop = best
            return text[: end if include else start], stop, k
    return expected(tok, prompt, out), None, len(out)


@given(data=st.data())
def test_stops_any_chunking_match_the_reference(real_tokenizer, data):
    tok = real_tokenizer
    text = "".join(data.draw(st.lists(st.sampled_from(MULTILINGUAL), min_size=1, max_size=2)))
    ids = tok.encode(text, add_special_tokens=False)[:24]
    full = tok.decode(ids)
    def substring(lo: int, hi: int):
        return st.tuples(st.integers(0, max(0, len(full) - 1)), st.integers(lo, hi)).map(
            lambda ab: full[ab[0] : ab[0] + ab[1]]
        )
    stops = [s for s in data.draw(st.lists(st.one_of(substring(1, 6), st.text(min_size=1, max_size=3)), max_size=4)) if s and "\ufffd" not in s]
    min_tokens = data.draw(st.integers(0, 4))
    include = data.draw(st.booleans())
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(ids)), max_size=6))) | {0, len(ids)})
    chunks = [ids[a:b] for a, b in zip(cuts, cuts[1:])]
    kw = dict(stop=stops, min_tokens=min_tokens, include_stop_str_in_output=include)
    s1, one = run(tok, ids, **kw)
    s2, many = run(tok, ids, chunks=chunks, **kw)
    want_text, want_stop, want_k = _reference_stop(tok, [], ids, stops, min_tokens, include)
    assert joined(one) == joined(many) == want_text
    assert one[-1].stop_reason == many[-1].stop_reason == want_stop
    assert len(s1.token_ids) == len(s2.token_ids) == want_k
    assert sum(d.consumed for d in many) == want_k


@given(data=st.data())
def test_tags_any_chunking_same_channels_and_lossless_log(qwen3, data):
    parts = [
        "<think>", "</think>", "<tool_call>", "</tool_call>", "<think", "</tool", "答", "🫨",
        '{"name": "f", "arguments": {"a": 1}}', "hello ", "\n", "<", "/", ">",
    ]
    text = "".join(data.draw(st.lists(st.sampled_from(parts), max_size=14)))
    ids = qwen3.encode(text, add_special_tokens=False)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(ids)), max_size=6))) | {0, len(ids)})
    chunks = [ids[a:b] for a, b in zip(cuts, cuts[1:])]
    stop = data.draw(st.sampled_from([[], ["答🫨"], ["hello"]]))
    s1, one = run(qwen3, ids, tags="qwen3", stop=stop)
    _s2, many = run(qwen3, ids, chunks=chunks, tags="qwen3", stop=stop)
    for f in ("text", "reasoning"):
        assert joined(one, f) == joined(many, f)
    calls1 = [(c.index, c.name, c.arguments, c.error) for d in one for c in d.tool_calls if c.complete]
    calls2 = [(c.index, c.name, c.arguments, c.error) for d in many for c in d.tool_calls if c.complete]
    assert calls1 == calls2
    assert (one[-1].finish_reason, one[-1].stop_reason) == (many[-1].finish_reason, many[-1].stop_reason)
    log = "".join(seg.text for seg in s1.log())
    full = qwen3.decode(ids)
    if one[-1].stop_reason is None:
        assert log == full
    else:
        assert full.startswith(log) and log.endswith(one[-1].stop_reason)


@given(data=st.data())
def test_a_tagged_stream_pushed_id_by_id_cuts_stops_as_the_reference(qwen3, data):
    """``push(id)`` on a stream with tags takes each id on its own path (``_push_one``),
    which leaves a split character's pieces without the boundary while what the decoder
    holds cannot complete a stop; with no tag in the text, its content, stop and ids are
    the reference's, stops with U+FFFD (held bytes rendered as final) included."""
    pieces = data.draw(st.lists(st.sampled_from(probe_ids(qwen3)[2:] + [[i] for i in range(3, 400)]), max_size=12))
    ids = [i for chunk in pieces for i in chunk]
    full = expected(qwen3, [], ids)
    assume("<think>" not in full and "<tool_call>" not in full)
    stops = data.draw(st.lists(st.sampled_from(["\ufffd", "a\ufffd", "\ufffd\ufffd", full[1:3] or "x", "\n\nUser:"]), max_size=3))
    min_tokens = data.draw(st.integers(0, 3))
    include = data.draw(st.booleans())
    kw = dict(tags="qwen3", stop=stops, min_tokens=min_tokens, include_stop_str_in_output=include, eos_token_ids=())
    state = DetokenizerState.from_tokenizer(qwen3, **kw)
    deltas = []
    for i in ids:
        deltas.append(state.push(i))
        if state.finished:
            break
    if not state.finished:
        deltas.append(state.finish())
    want_text, want_stop, want_k = _reference_stop(qwen3, [], ids, stops, min_tokens, include)
    assert (joined(deltas), state.stop_reason, len(state.token_ids)) == (want_text, want_stop, want_k)
    _, chunked = run(qwen3, ids, **kw)  # id by id through the checked path (_step)
    assert [d.text for d in deltas] == [d.text for d in chunked]


@given(data=st.data())
def test_push_text_equals_push_and_the_reference(real_tokenizer, data):
    """push_text is push(...).text with the same finish, for any stream without tags, and
    both follow the non-streaming reference. The stops exercise push_text's hot path and
    every way out of it: substrings of the decode (first characters ASCII or not, so the
    per-id flags and the search both run), stops holding U+FFFD (text a held tail renders),
    and ids that split characters or make invalid UTF-8."""
    tok = real_tokenizer
    if data.draw(st.booleans()):
        text = "".join(data.draw(st.lists(st.sampled_from(MULTILINGUAL), min_size=1, max_size=2)))
        ids = tok.encode(text, add_special_tokens=False)[:30]
    else:
        ids = data.draw(st.lists(st.sampled_from(probe_ids(tok)[2:] + [[i] for i in range(3, 400)]), max_size=12))
        ids = [i for chunk in ids for i in chunk]
    full = expected(tok, [], ids)
    def substring(lo: int, hi: int):
        return st.tuples(st.integers(0, max(0, len(full) - 1)), st.integers(lo, hi)).map(
            lambda ab: full[ab[0] : ab[0] + ab[1]]
        )
    stops = [x for x in data.draw(st.lists(st.one_of(substring(1, 5), st.sampled_from(["\n\nUser:", "\ufffd", "a\ufffd"])), max_size=3)) if x]
    min_tokens = data.draw(st.integers(0, 3))
    include = data.draw(st.booleans())
    kw = dict(
        stop=stops, eos_token_ids=(), max_tokens=data.draw(st.sampled_from([None, 10])),
        min_tokens=min_tokens, include_stop_str_in_output=include,
    )
    a = DetokenizerState.from_tokenizer(tok, **kw)
    b = DetokenizerState.from_tokenizer(tok, **kw)
    c = ServingStream.from_tokenizer(tok, **kw)  # the serving layer: its own path at rest
    got = []
    for i in ids:
        if a.finished:
            break
        got.append(b.push_text(i))
        assert a.push(i).text == got[-1]
        assert (a.finish_reason, a.stop_reason, a.token_ids) == (b.finish_reason, b.stop_reason, b.token_ids)
        assert c.push_text(i) == got[-1]
        assert (c.finish_reason, c.stop_reason, c.token_ids) == (b.finish_reason, b.stop_reason, b.token_ids)
    assert a.finished == b.finished == c.finished
    assert ("" if c.finished else c.finish().text) == ("" if a.finished else a.finish().text)
    # The same ids again through a fresh stream: now the scans hit the shared memo
    # (Matcher.steps).
    again = DetokenizerState.from_tokenizer(tok, **kw)
    assert [again.push_text(i) for i in ids[: len(got)]] == got
    assert (again.finish_reason, again.stop_reason) == (b.finish_reason, b.stop_reason)
    if kw["max_tokens"] is None:
        if not b.finished:
            got.append(b.finish().text)
        want_text, want_stop, want_k = _reference_stop(tok, [], ids, stops, min_tokens, include)
        assert ("".join(got), b.stop_reason, len(b.token_ids)) == (want_text, want_stop, want_k)


def test_push_text_refuses_tags(qwen3):
    s = DetokenizerState.from_tokenizer(qwen3, tags="qwen3")
    with pytest.raises(ValueError):
        s.push_text(1)


def test_min_tokens_and_a_stop_inside_a_sentencepiece_run(load_tokenizer):
    """A SentencePiece byte run is held until it ends, but its characters show in the
    decode (and in vLLM's stream) as they come: a stop among the characters that showed by
    token min_tokens completed too early, also when the run is released later; one that
    a later byte turned into U+FFFD did not show."""
    tok = load_tokenizer("mistral_v1")
    prompt = tok.encode("x", add_special_tokens=False)
    ids = tok.encode("x tabs\n\n\n new\n", add_special_tokens=False)[len(prompt) :]
    runs = [k for k, i in enumerate(ids) if tok.convert_ids_to_tokens(i) == "<0x0A>"]
    assert len(runs) >= 3 and runs[1] == runs[0] + 1  # "\n\n\n" is one byte run
    for min_tokens in range(len(ids)):
        for include in (False, True):
            kw = dict(stop=["\n"], min_tokens=min_tokens, include_stop_str_in_output=include)
            want = _reference_stop(tok, prompt, ids, ["\n"], min_tokens, include)
            state, deltas = run(tok, ids, prompt_ids=prompt, **kw)
            assert (joined(deltas), state.stop_reason, len(state.token_ids)) == want, (min_tokens, include)
            text = DetokenizerState.from_tokenizer(tok, prompt_ids=prompt, eos_token_ids=(), keep_log=False, **kw)
            got = "".join(text.push_text(i) for i in ids if not text.finished)
            got += "" if text.finished else text.finish().text
            assert (got, text.stop_reason, len(text.token_ids)) == want, (min_tokens, include)
    # <0x00> then a byte that makes the run invalid: the NUL that showed is U+FFFD now.
    nul, bad = tok.convert_tokens_to_ids(["<0x00>", "<0x80>"])
    state, deltas = run(tok, [nul, bad], stop=["\ufffd"], min_tokens=1)
    assert (joined(deltas), state.stop_reason) == _reference_stop(tok, [], [nul, bad], ["\ufffd"], 1, False)[:2] == ("", "\ufffd")


def test_scan_memo_is_exact_shared_and_bounded(monkeypatch):
    """Matcher.steps: push_text remembers each no-match scan per (node, text), for every
    stream on the automaton; a memo that reaches STEP_MEMO_LIMIT starts again."""
    from detok_plugin._matcher import Matcher

    monkeypatch.setattr(Matcher, "STEP_MEMO_LIMIT", 8)
    words = [f"w{k}" for k in range(20)]
    table = table_of("\n", *words)
    # A stop set of this test's own: its automaton (and memo) is shared with no other test.
    stops = ("\n\nUser:", "scan-memo-test")
    text = "".join("\n" + w for w in words)
    ids = [i for k in range(len(words)) for i in (0, k + 1)]
    first = DetokenizerState.from_tokenizer(table, stop=stops, eos_token_ids=())
    assert "".join(first.push_text(i) for i in ids) + first.finish().text == text
    memo = first._ac.steps  # the content automaton's memo (the stream has no copy of it)
    after_newline = first._ac.goto[0]["\n"]
    assert 0 < len(memo[after_newline]) <= 8
    assert memo[after_newline]["w19"] == ("\nw19", 0, "")  # released, next node, held
    second = DetokenizerState.from_tokenizer(table, stop=stops, eos_token_ids=())
    assert second._ac.steps is memo  # one automaton, and its memo, per set of stops
    got = [second.push_text(i) for i in ids]
    assert got[-2:] == ["", "\nw19"] and "".join(got) + second.finish().text == text
    assert all(len(m) <= 8 for m in memo)


def test_keep_log_false_keeps_nothing_and_says_so(qwen3):
    s = DetokenizerState.from_tokenizer(qwen3, stop=["x"], keep_log=False)
    assert s.push(qwen3.encode("hello", add_special_tokens=False)).text == "hello"
    with pytest.raises(ValueError, match="keep_log"):
        s.log()


@pytest.mark.parametrize("skip", [False, True], ids=["keep-special", "skip-special"])
def test_deepseek_r1_reasoning_and_tool_calls_on_the_real_tokenizer(load_tokenizer, skip):
    tok = load_tokenizer("deepseek_v3")
    text = (
        "<think>想一想</think>好的。<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
        "<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"北京\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )
    ids = tok.encode(text, add_special_tokens=False)
    s, ds = run(tok, ids, tags="deepseek_r1", skip_special_tokens=skip)
    assert (joined(ds), joined(ds, "reasoning")) == ("好的。", "想一想")
    done = [c for d in ds for c in d.tool_calls if c.complete]
    assert [(c.name, json.loads(c.arguments)) for c in done] == [("get_weather", {"city": "北京"})]
    assert "".join(seg.text for seg in s.log()) == tok.decode(ids, skip_special_tokens=skip)


def test_min_tokens_text_that_showed_is_judged_by_the_ids_taken(mistral_v1):
    """<0x00> <0x00> and then <0x80>, which would make the whole byte run invalid (each
    byte U+FFFD in the decode). With stop "\\x00" and min_tokens=1 the first NUL showed by
    token 1 (vLLM's stream shows it), so the stop is the second NUL, at token 2: the ids
    after it are never taken, so they cannot re-render the first (found by Hypothesis)."""
    nul, bad = (mistral_v1.convert_tokens_to_ids(t) for t in ("<0x00>", "<0x80>"))
    state = DetokenizerState.from_tokenizer(mistral_v1, stop=["\x00"], min_tokens=1, eos_token_ids=())
    texts = [state.push_text(i) for i in (nul, nul)]
    assert ("".join(texts), state.stop_reason, len(state.token_ids)) == ("\x00", "\x00", 2)
    assert state.finished and _reference_stop(mistral_v1, [], [nul, nul, bad], ["\x00"], 1, False) == ("\x00", "\x00", 2)
