"""One table, many threads: streams on eight threads at once, through one shared
``TokenTable``, give exactly what the decode oracle gives, push by push what the same
stream gives alone, while the table's memos fill, race and are cleared (``TokenTable``,
"Sharing across threads").

The memos: the split-character ``joins`` (byte-level), the quick texts, the rest texts
(``ServingStream`` with stops), and the stop automata's scan memos (``Matcher.steps``).
How the test gives a race every chance to show:

1. The bounds are made small, so the memos are cleared while other threads read them.
2. Inside each function that fills a memo, every worker thread releases the GIL between
   any two bytecodes (a trace function), so another thread may run at any point of a fill,
   as on a free-threaded build; elsewhere threads switch every microsecond.
3. Each thread pushes its streams in turn, one id each, so a fill or a clear also lands
   between two ids of a stream on the same thread.
4. Each round starts from a fresh copy of the table, so the first fills race too. Half of
   each thread's streams are the same replies on every thread, most streams share one stop
   set, and held pieces come from a small set, so threads meet the same entries at once,
   as a server's streams meeting the same characters do.

A fill that a reader could see half done (an entry published before it is complete, a
rest text published before its stop check) fails it; one thread alone never sees that.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any

import pytest
from helpers import MULTILINGUAL, expected

from detok_plugin import IncrementalDetokenizer, ServingStream, TokenTable, _decoders, _tables, build_table
from detok_plugin._matcher import Matcher

THREADS = 8
STREAMS = 6  # per thread, pushed in turn
ROUNDS = 8
JOINS_BOUND = 8
REST_BOUND = 3
#: The functions that fill a shared memo, by name (so a planted copy is caught too).
FILLS = frozenset({"join", "quick_texts", "rest_texts", "learn_rest_text", "remember"})
#: Most streams share one stop set, as a server's requests share a chat template's, so
#: their rest texts are one dict (per skip flag) that threads fill at once; the others have
#: first characters of their own: with both skip flags, more keys than REST_BOUND.
COMMON_STOPS = ("。", "\n\n")
STOP_SETS = (("🫨",), ("\n",), ("好", "!"), (" the",), ("ك",), ("世界",), ("é", "—"), ("<",), ("ん", "”"), ("д",))


@dataclasses.dataclass(frozen=True)
class Case:
    prompt: list[int]
    out: list[int]
    skip: bool
    stops: tuple[str, ...] | None  # None: an IncrementalDetokenizer; else a ServingStream
    want: str  # the decode oracle


def _stop_oracle(tok: Any, prompt: list[int], out: list[int], stops: tuple[str, ...], skip: bool) -> str:
    """vLLM's rule without min_tokens (test_state_boundary's ``_reference_stop``): the first
    ``k`` whose ``decode(prompt + out[:k])`` holds a stop; the stop that ends first (ties:
    list order); the text before it."""
    base = len(tok.decode(prompt, skip_special_tokens=skip))
    for k in range(1, len(out) + 1):
        text = tok.decode(prompt + out[:k], skip_special_tokens=skip)[base:]
        ends = [(s + len(stop), rank, s) for rank, stop in enumerate(stops) if (s := text.find(stop)) != -1]
        if ends:
            return text[: min(ends)[2]]
    return expected(tok, prompt, out, skip)


def _cases(tok: Any, table: TokenTable, rng: random.Random) -> list[Case]:
    """THREADS * STREAMS cases, a third for IncrementalDetokenizer, the rest for ServingStream."""
    quick = table.quick_texts(False)
    held = [i for i, t in enumerate(quick) if t is None and table.pieces[i] is not None]
    pools = (
        rng.sample(held, 24),
        [i for i, p in enumerate(table.pieces) if p is not None],
        sorted(table.special_ids),
    )
    return [_case(tok, pools, rng, serving=k % 3 != 0) for k in range(THREADS * STREAMS)]


def _case(tok: Any, pools: tuple[list[int], ...], rng: random.Random, serving: bool) -> Case:
    """Real text (CJK, kana, emoji split over ids); ids whose text depends on what is held
    (byte-level pieces of a character, SentencePiece byte pieces), any ids, special ids
    (skipped or not); a prompt that may end inside a character; stops that may hit."""
    held, valid, special = pools
    ids = rng.choices(special) if rng.random() < 0.3 else []  # a reply may start with one
    while len(ids) < 40:
        pick = rng.random()
        if pick < 0.5:
            ids += tok.encode(rng.choice(MULTILINGUAL), add_special_tokens=False)
        elif pick < 0.8:
            ids += rng.choices(held, k=rng.randint(1, 4))
        else:
            ids += rng.choices(valid if pick < 0.9 else special, k=rng.randint(1, 3))
    cut = rng.choice([0, 0, 1, 2, 5, 8])
    prompt, out, skip = ids[:cut], ids[cut:48], rng.random() < 0.5
    if not serving:
        return Case(prompt, out, skip, None, expected(tok, prompt, out, skip))
    stops = COMMON_STOPS
    if rng.random() < 0.4:
        full = expected(tok, prompt, out, skip)
        at = rng.randrange(len(full) // 2 + 1)
        seen = full[at : at + rng.randint(1, 4)]  # a stop the stream meets
        stops = (*rng.choice(STOP_SETS), *([seen] if seen and "\ufffd" not in seen else []))
    return Case(prompt, out, skip, stops, _stop_oracle(tok, prompt, out, stops, skip))


def _pushes(table: TokenTable, case: Case) -> Iterator[str]:
    """Stream ``case`` through ``table``: each push's text, then the end's."""
    if case.stops is None:
        d = IncrementalDetokenizer(table, case.prompt, skip_special_tokens=case.skip)
        yield from (d.push(i) for i in case.out)
        yield d.flush()
        return
    s = ServingStream.from_tokenizer(
        table, prompt_ids=case.prompt, skip_special_tokens=case.skip, stop=list(case.stops), eos_token_ids=()
    )
    for i in case.out:
        yield s.push_text(i)
        if s.finished:
            return
    yield s.finish().text


def _in_turn(table: TokenTable, cases: list[Case]) -> list[list[str]]:
    """Each case's pushes, the cases pushed in turn, one id each."""
    runs = [_pushes(table, c) for c in cases]
    texts: list[list[str]] = [[] for _ in cases]
    live = set(range(len(runs)))
    while live:
        for k in sorted(live):
            text = next(runs[k], None)
            if text is None:
                live.discard(k)
            else:
                texts[k].append(text)
    return texts


def _between_bytecodes(frame: FrameType, event: str, arg: object) -> Any:
    """A worker thread's trace function: inside a function that fills a shared memo
    (``FILLS``), release the GIL between any two bytecodes; trace no other frame."""
    if event == "call":
        if frame.f_code.co_name not in FILLS:
            return None
        frame.f_trace_lines = False
        frame.f_trace_opcodes = True
    elif event == "opcode":
        os.sched_yield()
    return _between_bytecodes


def _threaded(table: TokenTable, work: list[list[Case]]) -> list[list[list[str]]]:
    """``_in_turn`` on each thread's cases, all threads at once on the one table."""
    start = threading.Barrier(len(work))

    def one(cases: list[Case]) -> list[list[str]]:
        start.wait()
        return _in_turn(table, cases)

    switch, trace = sys.getswitchinterval(), threading.gettrace()
    sys.setswitchinterval(1e-6)
    threading.settrace(_between_bytecodes)
    try:
        with ThreadPoolExecutor(len(work)) as pool:
            return list(pool.map(one, work))
    finally:
        threading.settrace(trace)  # type: ignore[arg-type]
        sys.setswitchinterval(switch)


@pytest.fixture(params=["qwen3", "mistral_v1"])
def tok(request):
    """A byte-level tokenizer (joins) and a SentencePiece one, the session's (conftest.py)."""
    return request.getfixturevalue(request.param)


def test_one_table_streams_exactly_from_eight_threads_at_once(tok, monkeypatch):
    built, why = build_table(tok)
    assert built is not None, why
    monkeypatch.setattr(_decoders, "JOINS_MAX", JOINS_BOUND)
    monkeypatch.setattr(_tables, "_MAX_REST", REST_BOUND)
    monkeypatch.setattr(Matcher, "STEP_MEMO_LIMIT", 4)
    # Watched from outside, unchanged: the joins each round fills, the rest-texts dicts
    # handed out (set.add and list.append are single operations, safe from any thread).
    filled: set[bytes] = set()
    handed: list[tuple[tuple[bool, str | None], dict[int, str | None]]] = []
    join, rest_texts = _decoders.join, TokenTable.rest_texts

    def watched_join(joins: dict[bytes, tuple[str, bytes]], data: bytes) -> tuple[str, bytes]:
        filled.add(data)
        return join(joins, data)

    def watched_rest_texts(table: TokenTable, skip: bool, first: str | None) -> dict[int, str | None]:
        got = rest_texts(table, skip, first)
        handed.append(((skip, first), got))
        return got

    monkeypatch.setattr(_decoders, "join", watched_join)
    monkeypatch.setattr(TokenTable, "rest_texts", watched_rest_texts)
    rng = random.Random(f"threads-{built.family}")
    cases = _cases(tok, built, rng)
    # Each stream alone (one thread): the decode oracle, and the pushes that every threaded
    # run must repeat (a memo changes how fast a text is found, never which).
    solo = dataclasses.replace(built)
    alone = {id(c): list(_pushes(solo, c)) for c in cases}
    assert [c for c in cases if "".join(alone[id(c)]) != c.want] == []
    wrong: list[tuple[Case, list[str]]] = []
    cleared = {"joins": 0, "rest texts": 0}
    for _ in range(ROUNDS):
        filled.clear()
        handed.clear()
        # Half of each thread's streams are the same replies on every thread, half its own.
        dealt = rng.sample(cases, len(cases))
        same, own = dealt[: STREAMS // 2], dealt[STREAMS // 2 :]
        work = [same + own[t::THREADS][: STREAMS - len(same)] for t in range(THREADS)]
        table = dataclasses.replace(built)  # the same verified table, its memos empty
        for cases_of, texts_of in zip(work, _threaded(table, work)):
            wrong += [(c, got) for c, got in zip(cases_of, texts_of) if got != alone[id(c)] or "".join(got) != c.want]
        # The bounds held (give or take one entry per thread filling as the dict filled up),
        # and were hit: more joins filled than a dict overfilled by every thread holds; a
        # key handed two dicts (only a clear drops the first).
        assert len(table.joins) <= JOINS_BOUND + THREADS and len(table._rest) <= REST_BOUND + THREADS
        cleared["joins"] += len(filled) > JOINS_BOUND + THREADS
        cleared["rest texts"] += len({k for k, _ in handed}) < len({(k, id(d)) for k, d in handed})
    assert not wrong, f"{len(wrong)} of {ROUNDS * THREADS * STREAMS} streams differ; first: {wrong[0]}"
    assert cleared["rest texts"] and (cleared["joins"] or built.family != "byte_level"), cleared
