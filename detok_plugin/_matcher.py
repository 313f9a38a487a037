"""An Aho-Corasick automaton over stop strings and tags, scanned one character at a time.

Why an automaton: the safe emission boundary needs, after every token, (a) the earliest
complete match of any pattern and (b) the longest unemitted suffix that is a prefix of some
pattern. A trie with failure links gives both in O(1) amortized per character, whatever
the number of patterns, and never rescans emitted text (vLLM's ``check_stop_strings``
re-searches a window per stop string; TGI searches the whole text).

>>> m = Matcher.build(("\\n\\nUser:", "###"))
>>> state, hit = m.scan(0, "Hi.\\n\\nUs")
>>> hit is None, m.hold[state]           # "\\n\\nUs" may still become a stop: hold 4
(True, 4)
>>> state, hit = m.scan(state, "er: more")
>>> hit                                   # (pattern index, end offset in the chunk)
(0, 3)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

__all__ = ["Matcher", "Step"]


class Step(NamedTuple):
    """What a scan of one text from one node, with no match, leaves: the text released,
    the node reached, the text held (``Matcher.steps``)."""

    released: str
    node: int
    held: str


class Matcher:
    """An automaton over stop strings and tags; shared across streams (cached by pattern
    tuple), built lazily.

    Opening a stream with a stop set never seen before (multi-tenant API traffic: every
    request brings its own) must cost little, and most streams never meet a stop's first
    character at all, so ``build`` makes only ``first`` (a character class); the trie and
    its failure links are made by the first ``scan``.
    """

    __slots__ = ("patterns", "holding", "first", "find_first", "goto", "fail", "depth", "match", "hold", "steps")

    STEP_MEMO_LIMIT = 4096

    def __init__(self, patterns: tuple[str, ...], holding: tuple[bool, ...]) -> None:
        if not all(patterns):
            raise ValueError("empty stop string or tag")
        self.patterns = patterns
        self.holding = holding
        # The first characters of the patterns: from the root, the automaton can only move
        # on one of them, so the scan jumps (in C, with a regex) to the next one.
        self.first: re.Pattern[str] = re.compile("[" + re.escape("".join(sorted({p[0] for p in patterns}))) + "]")
        # ``first.search``, bound once: every stream on this automaton shares the one object.
        self.find_first: Callable[..., re.Match[str] | None] = self.first.search

    # The automaton, made on first use (``__getattr__``: the slots are unset until then).
    goto: tuple[dict[str, int], ...]
    fail: tuple[int, ...]
    depth: tuple[int, ...]
    # The match reported when the automaton enters a node: of the patterns ending there,
    # the first in list order (as vLLM's check_stop_strings ranks stops), or -1.
    match: tuple[int, ...]
    # Characters to hold at a node: the longest suffix of the scanned text that is a proper
    # prefix of a *holding* pattern. A stop kept in the output (include_stop_str_in_output) does
    # not hold: its characters leave whether or not it completes.
    hold: tuple[int, ...]
    # One memo per node for streams that scan token texts (DetokenizerState.push_text):
    # text -> what a scan of it from this node with no match leaves. Exact because what a
    # stream holds is a function of its node (the last ``hold[node]`` characters of the
    # node's path). Shared, each bounded by ``STEP_MEMO_LIMIT`` (cleared when full: the
    # texts of one workload recur).
    steps: tuple[dict[str, Step], ...]

    def __getattr__(self, name: str) -> object:
        # Called only for an unset slot: the automaton is not made yet.
        if name not in _AUTOMATON:
            raise AttributeError(name)
        trie = _Trie(self.patterns, self.holding)
        fail, match, hold = trie.links()
        self.goto, self.fail, self.depth = tuple(trie.goto), tuple(fail), tuple(trie.depth)
        self.match, self.hold, self.steps = tuple(match), tuple(hold), tuple({} for _ in trie.goto)
        return getattr(self, name)

    def __repr__(self) -> str:
        return f"Matcher({self.patterns!r})"

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def build(patterns: Sequence[str], holding: Sequence[bool] | None = None) -> Matcher:
        """The automaton over ``patterns`` (cached). ``holding[i]`` false: pattern ``i``
        holds no text back (a stop kept in the output)."""
        patterns = tuple(patterns)
        return Matcher(patterns, tuple(holding) if holding is not None else (True,) * len(patterns))

    def remember(self, node: int, text: str, step: Step) -> None:
        """Memo a no-match scan of ``text`` from ``node`` (``steps``; bounded per node)."""
        memo = self.steps[node]
        if len(memo) >= self.STEP_MEMO_LIMIT:
            memo.clear()
        memo[text] = step

    def scan(self, state: int, text: str) -> tuple[int, tuple[int, int] | None]:
        """Advance over ``text``; stop at the first complete match.

        Returns the new state and ``(pattern_index, end)`` where ``text[:end]`` ends with
        the pattern, or ``None`` with the state after the whole text.
        """
        goto, fail, match, first = self.goto, self.fail, self.match, self.first
        pos, n = 0, len(text)
        while pos < n:
            if state == 0:
                m = first.search(text, pos)
                if m is None:
                    return 0, None
                pos = m.start()
            ch = text[pos]
            pos += 1
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            if match[state] != -1:
                return state, (match[state], pos)
        return state, None


_AUTOMATON = frozenset(("goto", "fail", "depth", "match", "hold", "steps"))


class _Trie:
    """The trie of the patterns, then its failure links (breadth first), as Aho and
    Corasick build them."""

    def __init__(self, patterns: tuple[str, ...], holds: tuple[bool, ...]) -> None:
        self.goto: list[dict[str, int]] = [{}]
        self.depth = [0]
        self.own = [-1]  # the pattern that ends at a node, the first of duplicates
        self.on_hold_path = [True]  # some holding pattern passes through the node
        for index, p in enumerate(patterns):
            node = 0
            for ch in p:
                node = self._child(node, ch)
                self.on_hold_path[node] = self.on_hold_path[node] or holds[index]
            if self.own[node] == -1:
                self.own[node] = index

    def _child(self, node: int, ch: str) -> int:
        nxt = self.goto[node].get(ch)
        if nxt is None:
            nxt = len(self.goto)
            self.goto[node][ch] = nxt
            self.goto.append({})
            self.depth.append(self.depth[node] + 1)
            self.own.append(-1)
            self.on_hold_path.append(False)
        return nxt

    def links(self) -> tuple[list[int], list[int], list[int]]:
        """Per node: the failure link, the match reported on entering it (the first
        pattern in list order among those ending there), and the characters to hold."""
        goto = self.goto
        fail = [0] * len(goto)
        match = self.own[:]
        hold = [0] * len(goto)
        # A node's text is held whole only while it is a *proper* prefix of a holding
        # pattern: where a pattern ends and none goes on, the text is a complete match,
        # and once a match there is passed over (a stop before min_tokens) nothing longer
        # can grow from all of it, only from a suffix (the failure link's hold).
        on = self.on_hold_path
        grows = [any(on[c] for c in g.values()) for g in goto]
        order = list(goto[0].values())
        for child in order:
            hold[child] = 1 if grows[child] else 0
        head = 0
        while head < len(order):
            node = order[head]
            head += 1
            for ch, child in goto[node].items():
                f = fail[node]
                while f and ch not in goto[f]:
                    f = fail[f]
                fc = goto[f].get(ch, 0)
                fail[child] = fc if fc != child else 0
                inherited = match[fail[child]]
                if inherited != -1 and (match[child] == -1 or inherited < match[child]):
                    match[child] = inherited
                hold[child] = self.depth[child] if grows[child] else hold[fail[child]]
                order.append(child)
        return fail, match, hold
