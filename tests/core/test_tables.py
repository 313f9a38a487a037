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


def test_forget_drops_the_scan_memos_and_streams_go_on(qwen3):
    """detok_plugin.forget(): the cached automata, and with them the one learnt table
    (each automaton's scan memo, Matcher.steps), are dropped; running streams go on."""
    import detok_plugin

    stop = ["\n\nUser:"]
    a = DetokenizerState.from_tokenizer(qwen3, stop=stop, eos_token_ids=())
    newline, hello = (qwen3.encode(t, add_special_tokens=False)[0] for t in ("\n", " hello"))
    assert a.push_text(newline) == "" and a.push_text(hello) == "\n hello"
    matcher = a._ac
    assert any(matcher.steps)  # push_text memoised its scans
    detok_plugin.forget()
    b = DetokenizerState.from_tokenizer(qwen3, stop=stop, eos_token_ids=())
    assert b._ac is not matcher and not any(b._ac.steps)  # built again, cold
    assert a.push_text(newline) == "" and b.push_text(newline) == ""
    assert a.push_text(hello) == "\n hello" and b.push_text(hello) == "\n hello"
