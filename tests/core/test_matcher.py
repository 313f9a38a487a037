"""The Aho-Corasick matcher behind stops and tags."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from detok_plugin._matcher import Matcher


def _naive(patterns, text):
    """Earliest end, then list order (vLLM's ranking of stops)."""
    for end in range(1, len(text) + 1):
        hits = [i for i, p in enumerate(patterns) if text[:end].endswith(p)]
        if hits:
            return min(hits), end
    return None


def _hold(patterns, text):
    return max((k for k in range(len(text) + 1) for p in patterns if p.startswith(text[len(text) - k :])), default=0)


alphabet = st.sampled_from("ab<>/\n你")


@given(st.lists(st.text(alphabet, min_size=1, max_size=5), min_size=1, max_size=5), st.lists(st.text(alphabet, max_size=6), max_size=6))
def test_matches_naive_search_in_any_chunking(patterns, chunks):
    m = Matcher.build(tuple(patterns))
    text = "".join(chunks)
    want = _naive(patterns, text)
    state, seen, got = 0, 0, None
    for c in chunks:
        state, hit = m.scan(state, c)
        if hit is not None:
            i, end = hit
            got = (i, seen + end)
            break
        seen += len(c)
    if want is None:
        assert got is None
        assert m.depth[state] == _hold(patterns, text)
    else:
        assert got is not None and got[1] == want[1]
        assert patterns[got[0]] == patterns[want[0]]


def test_automaton_is_cached_per_pattern_tuple():
    assert Matcher.build(("a", "b")) is Matcher.build(("a", "b"))


@given(st.lists(st.tuples(st.text(alphabet, min_size=1, max_size=5), st.booleans()), min_size=1, max_size=5), st.text(alphabet, max_size=12))
def test_hold_counts_only_holding_patterns(pairs, text):
    patterns = tuple(p for p, _ in pairs)
    holding = tuple(h for _, h in pairs)
    m = Matcher.build(patterns, holding)
    state, hit = m.scan(0, text)
    if hit is None:
        assert m.hold[state] == _hold([p for p, h in pairs if h], text)
