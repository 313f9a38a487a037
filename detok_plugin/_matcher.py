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
from dataclasses import dataclass

__all__ = ["Matcher"]


@dataclass(frozen=True, slots=True, eq=False)
class Matcher:
    """Immutable automaton; shared across streams (cached by pattern tuple)."""

    patterns: tuple[str, ...]
    goto: tuple[dict[str, int], ...]
    fail: tuple[int, ...]
    depth: tuple[int, ...]
    # The match reported when the automaton enters a node: of the patterns ending there,
    # the first in list order (as vLLM's check_stop_strings ranks stops), or -1.
    match: tuple[int, ...]
    # Characters to hold at a node: the longest suffix of the scanned text that is a prefix
    # of a *holding* pattern. A stop kept in the output (include_stop_str_in_output) does
    # not hold: its characters leave whether or not it completes.
    hold: tuple[int, ...]
    # The first characters of the patterns: from the root, the automaton can only move on
    # one of them, so the scan jumps (in C, with a regex) to the next one.
    first: re.Pattern[str]
    # ``first.search``, bound once: every stream on this automaton shares the one object
    # (a bound method per stream would be one more object to touch per token).
    find_first: Callable[..., re.Match[str] | None]
    # One memo per node for streams that scan token texts (DetokenizerState.push_text):
    # text -> what a scan of it from this node with no match leaves (released text, next
    # node, held text). Exact because what a stream holds is a function of its node (the
    # last ``hold[node]`` characters of the node's path). Shared, each bounded by
    # ``STEP_MEMO_LIMIT`` (cleared when full: the texts of one workload recur).
    steps: tuple[dict[str, tuple[str, int, str]], ...]

    STEP_MEMO_LIMIT = 4096

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def build(patterns: Sequence[str], holding: Sequence[bool] | None = None) -> "Matcher":
        patterns = tuple(patterns)
        holds = tuple(holding) if holding is not None else (True,) * len(patterns)
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        own = [-1]
        on_hold_path = [True]
        for index, p in enumerate(patterns):
            if not p:
                raise ValueError("empty stop string or tag")
            node = 0
            for ch in p:
                nxt = goto[node].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][ch] = nxt
                    goto.append({})
                    depth.append(depth[node] + 1)
                    own.append(-1)
                    on_hold_path.append(False)
                node = nxt
                on_hold_path[node] = on_hold_path[node] or holds[index]
            if own[node] == -1:  # the first of duplicate patterns wins
                own[node] = index
        fail = [0] * len(goto)
        match = own[:]
        hold = [0] * len(goto)
        order = list(goto[0].values())
        for child in order:
            hold[child] = 1 if on_hold_path[child] else 0
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
                hold[child] = depth[child] if on_hold_path[child] else hold[fail[child]]
                order.append(child)
        chars = "".join(sorted({p[0] for p in patterns}))
        first = re.compile("[" + re.escape(chars) + "]")
        return Matcher(
            patterns, tuple(goto), tuple(fail), tuple(depth), tuple(match), tuple(hold), first, first.search,
            tuple({} for _ in goto),
        )

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
