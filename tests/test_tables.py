"""Token tables: built once per tokenizer, verified, shared; fallbacks say why."""

from __future__ import annotations

import threading

import pytest

from detok_plugin import DetokenizerState, build_table, decode_with_table


def test_table_is_cached_and_shared(qwen3):
    t1, why = build_table(qwen3)
    t2, _ = build_table(qwen3)
    assert t1 is t2 and why == "decoder is ByteLevel"
    s1 = DetokenizerState.from_tokenizer(qwen3)
    s2 = DetokenizerState.from_tokenizer(qwen3)
    assert s1._dec._pieces is s2._dec._pieces is t1.pieces


def test_table_is_built_once_under_threads(deepseek_tokenizer=None):
    import tokenizer_zoo

    tok = tokenizer_zoo.load("smollm2")
    results = []
    threads = [threading.Thread(target=lambda: results.append(build_table(tok)[0])) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is results[0] for r in results)


def test_backend_tokenizer_accepted_directly(qwen3):
    """A raw ``tokenizers.Tokenizer`` takes the same fast path as its transformers wrapper."""
    backend = qwen3.backend_tokenizer
    table, why = build_table(backend)
    assert table is not None and table.family == "byte_level", why
    ids = qwen3.encode("你好🫨", add_special_tokens=False)
    assert decode_with_table(table, ids) == backend.decode(ids)


def test_special_ids_follow_the_backend(qwen3):
    table, _ = build_table(qwen3)
    im_end = qwen3.convert_tokens_to_ids("<|im_end|>")
    think = qwen3.convert_tokens_to_ids("<think>")
    assert im_end in table.special_ids and think not in table.special_ids
    assert table.eos_token_ids == (im_end,)


def test_a_table_that_disagrees_with_decode_falls_back(qwen3):
    """Verification: a tokenizer whose decode differs from its table goes generic, saying why."""

    class Shouting:
        def __init__(self, tok):
            self.backend_tokenizer = tok.backend_tokenizer
            self._tok = tok

        def __len__(self):
            return len(self._tok)

        def decode(self, ids, skip_special_tokens=False):
            return self._tok.decode(ids, skip_special_tokens=skip_special_tokens).upper()

    s = DetokenizerState.from_tokenizer(Shouting(qwen3))
    assert s.path == "generic" and "differs" in s.why
    ids = qwen3.encode("hello wörld", add_special_tokens=False)
    assert "".join(s.push(i).text for i in ids) + s.finish().text == "HELLO WÖRLD"


def test_a_hole_in_the_vocabulary_is_a_typed_error_in_prompt_and_output():
    import pytest

    from detok_plugin import IncrementalDetokenizer, TokenIdError, TokenTable

    t = TokenTable("byte_level", (b"a", None, b"c"), frozenset())
    assert t.has_holes
    with pytest.raises(TokenIdError) as e:
        DetokenizerState.from_tokenizer(t, prompt_ids=[0, 1, 2])
    assert (e.value.token_id, e.value.position) == (1, -2)
    s = DetokenizerState.from_tokenizer(t, prompt_ids=[0, 2])
    assert s.push(0).text == "a"
    with pytest.raises(TokenIdError) as e:
        s.push(1)
    assert (e.value.token_id, e.value.position) == (1, 1)
    d = IncrementalDetokenizer(t, [])
    with pytest.raises(TokenIdError):
        d.push(1)
    assert d.push(2) == "c"


def test_quick_texts_per_family_and_skip_flag():
    """quick_texts: what an id gives arriving with nothing held; None where that depends
    on what is held; skipped specials are empty. Built once per table and flag."""
    from detok_plugin._tables import TokenTable

    bl = TokenTable("byte_level", (b"Hi", b"\xe4\xbd", b"<s>", None), frozenset({2}))
    assert bl.quick_texts(False) == ("Hi", None, "<s>", None)
    assert bl.quick_texts(True) == ("Hi", None, "", None)
    assert bl.quick_texts(True) is bl.quick_texts(True)
    sp = TokenTable("sentencepiece", ("a", "<0x0A>", "</s>"), frozenset({2}), byte_values=(-1, 10, -1))
    assert sp.quick_texts(False) == ("a", None, "</s>")
    assert sp.quick_texts(True) == ("a", None, "")


def test_ready_plans_are_shared_per_automaton_learnt_and_bounded(qwen3):
    """One ready plan per (stop automaton, skip flag), shared by every stream with those
    options; its root starts as the quick texts without stops and empty with them, and
    learns an id only once a stream has seen what it does there; a table keeps at most
    _MAX_PLANS plans, a plan at most _MAX_PLAN_STATES held states."""
    from detok_plugin._matcher import Matcher
    from detok_plugin._tables import _MAX_PLAN_STATES, _MAX_PLANS, ReadyPlan

    table, _ = build_table(qwen3)
    a = DetokenizerState.from_tokenizer(qwen3, stop=["\n\nUser:", "Observation:"], eos_token_ids=())
    b = DetokenizerState.from_tokenizer(qwen3, stop=["\n\nUser:", "Observation:"], eos_token_ids=())
    c = DetokenizerState.from_tokenizer(qwen3, stop=["Observe", "\nx"], eos_token_ids=())  # same first characters
    assert a._plan is b._plan and c._plan is not a._plan
    root = a._plan.root
    hello, newline = qwen3.encode(" hello", add_special_tokens=False)[0], qwen3.encode("\n", add_special_tokens=False)[0]
    assert (root[hello], root[newline]) == (None, None)
    assert a.push_text(hello) == " hello" and a.push_text(newline) == ""  # "\n" may start a stop
    assert root[hello] == " hello" and root[newline] is None  # a move: learnt by streams that offer moves
    m = DetokenizerState.from_tokenizer(qwen3, stop=["\n\nUser:", "Observation:"], eos_token_ids=(), keep_log=False, ready_moves=True)
    assert m.push_text(newline) == "" and root[newline] == ("", m.ready)
    assert b._ready is root and b.push_text(hello) == " hello"  # b takes a's lesson
    assert c._plan.root[hello] is None
    plain = table.ready_plan(None, True, b"")
    assert plain.root == list(table.quick_texts(True)) and plain.root is not table.quick_texts(True)
    assert table.ready_plan(None, True, b"") is plain
    for k in range(_MAX_PLANS + 1):
        table.ready_plan(Matcher.build((chr(0x4E00 + k),)), False, b"")
    assert len(table._plans) <= _MAX_PLANS
    fresh = ReadyPlan([None] * 4, b"")  # not a shared plan: this one is filled to its bound
    made = {id(fresh.table(bytes([0xE4, 0x80 + k % 64, k // 64]), 0, "")) for k in range(_MAX_PLAN_STATES)}
    assert len(made) == _MAX_PLAN_STATES and fresh.table(b"\xf0", 0, "") is None
    assert fresh.table(b"\xe4\x80\x00", 0, "") is fresh.table(b"\xe4\x80\x00", 0, "")  # made once
    assert fresh.where(fresh.root) == (b"", 0, "", None)
    with pytest.raises(ValueError):
        fresh.where([])


def test_forget_drops_learnt_plans_and_memos_and_streams_learn_again(qwen3):
    table, _ = build_table(qwen3)
    stop = ["\n\nUser:"]
    a = DetokenizerState.from_tokenizer(qwen3, stop=stop, eos_token_ids=())
    hello = qwen3.encode(" hello", add_special_tokens=False)[0]
    assert a.push_text(hello) == " hello" and a._plan.root[hello] == " hello"
    learnt, matcher = a._plan, next(m for m, _ in table._plans if m is not None and m.patterns == tuple(stop))
    matcher.steps[0]["x"] = ("x", 0, "")  # a scan memo, as push_text leaves them
    table.forget()
    assert table._plans == {} and not any(matcher.steps)
    b = DetokenizerState.from_tokenizer(qwen3, stop=stop, eos_token_ids=())
    assert b._plan is not learnt and b._plan.root[hello] is None  # starts cold
    assert a.push_text(hello) == " hello" and b.push_text(hello) == " hello"  # both go on exactly
