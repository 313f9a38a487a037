"""The differential fuzz's oracle (``fuzz.py``): what a stream must give, from the tokenizer's
own ``decode`` alone.

The rules are the core's documented ones (docs/design.md, "Stops, tags and channels"), as the
core's own tests state them (``tests/core/test_state_boundary.py``: ``_reference_stop``;
``tests/core/test_state_decoding.py``: ``settled``), extended to prompts, stop token ids,
EOS, ``max_tokens`` and channels:

* the text is ``decode(prompt + out[:k])[len(decode(prompt)):]`` (same flags), for the
  first ``k`` that ends the stream: a stop string completing in that text past what showed by
  token ``min_tokens`` (earliest end first, then list order), a stop id or EOS past
  ``min_tokens``, or ``max_tokens``; the text is cut before the stop string (after it with
  ``include_stop_str_in_output``), and a stop id's text is left out unless included;
* with tags, the text splits into modes (content, reasoning, tool body) at the first-ending
  tag of the current mode, and at the id of a tag token the decode skips; a stop string
  counts only where it is live (content; reasoning with ``stop_in_reasoning``), and never
  across a mode change;
* a tool close tag where the body so far ends inside a value (the family's
  ``marker_is_text``) is body text; a bare opener (``TagSet.tool_bare``) opens a body and is
  its first text, but is content where the tags allow it only at the reply's start
  (``bare_at_start``) and content that is not blank, or a body, came before it;
* after each push, what a stream has released is the *settled* text (the common prefix of
  the decodes of every continuation the probes stand for) less the longest suffix of its
  current mode's text that is a proper prefix of a pattern the stream holds for.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from detok_plugin import families

CONTENT, REASONING, TOOL = 0, 1, 2


class Opts(NamedTuple):
    """A stream's stop options, as the core takes them (``eos`` among ``stop_ids``)."""

    stops: tuple[str, ...] = ()
    stop_ids: frozenset[int] = frozenset()
    eos_ids: frozenset[int] = frozenset()
    include: bool = False
    min_tokens: int = 0
    max_tokens: int | None = None
    last_is_stop: bool = False  # the engine ends the stream on the last id (vLLM's stop token)


class Rules(NamedTuple):
    """A stream's tags: which patterns are live in each mode, and the skipped tag ids."""

    tags: Any  # TagSet
    stop_in_reasoning: bool
    start: int  # the mode the stream starts in
    id_tags: dict[int, str]  # id -> pattern kind, for tag tokens the decode skips
    keeps_id_close: bool = False  # a skipped close tag id inside a value is body text (chat)


class Want(NamedTuple):
    text: str  # the whole stream's text (tags and every mode's text inline)
    finish_reason: str | None
    stop_reason: str | int | None
    taken: int  # output ids the stream takes
    cut: int  # where the text ends in the decode of the ids taken


class Oracle:
    """``decode``-based texts of one case: prefixes of the output after the prompt."""

    def __init__(self, tok: Any, prompt: Sequence[int], out: Sequence[int], skip: bool, spaces: bool, probes: list[list[int]]) -> None:
        kw: dict[str, Any] = {"skip_special_tokens": skip}
        if not spaces:
            kw["spaces_between_special_tokens"] = False
        self._decode = lambda ids: tok.decode(ids, **kw)
        self.prompt, self.out, self.probes = list(prompt), list(out), probes
        self._start = len(self._decode(self.prompt))
        self._texts: dict[int, str] = {}
        self._settled: dict[int, str] = {}

    def expected(self, ids: Sequence[int]) -> str:
        return str(self._decode(self.prompt + list(ids)))[self._start :]

    def text(self, k: int) -> str:
        """The formula's text for the first ``k`` output ids."""
        got = self._texts.get(k)
        if got is None:
            got = self._texts[k] = self.expected(self.out[:k])
        return got

    def settled(self, k: int) -> str:
        """The text of the first ``k`` ids that no continuation can change."""
        got = self._settled.get(k)
        if got is None:
            head = self.out[:k]
            got = os.path.commonprefix([self.text(k), *(self.expected(head + p) for p in self.probes if p)])
            self._settled[k] = got
        return got


def whole(o: Oracle, k: int, tok: Any, skip: bool) -> str:
    """What a server shows for the first ``k`` ids when it ends there (``max_tokens``, a stop
    token, EOS): ``text(k)`` less a last character no id completed, which the decode renders
    as U+FFFD and a stock detokenizer never releases (the core's ``drop_incomplete``).

    Byte-level: that character is the one trailing U+FFFD no continuation keeps (the text
    settles without it). SentencePiece: a byte run ending inside a character renders whole
    as U+FFFD; without the bytes of that last character (``<0xNN>`` ids, one byte each) the
    run renders as its complete characters."""
    text = o.text(k)
    if not text.endswith("\ufffd"):
        return text
    run = []
    special = set(tok.all_special_ids) if skip else set()
    # A run the prompt began is one run with the output's bytes; a skipped id is not there.
    ids = [i for i in o.prompt + o.out[:k] if i not in special]
    j = len(ids)
    while j > 0 and (piece := tok.convert_ids_to_tokens(ids[j - 1])).startswith("<0x") and len(piece) == 6:
        run.append(int(piece[3:5], 16))
        j -= 1
    if not run:  # byte-level (or no byte run): drop what does not settle
        settled = o.settled(k)
        return settled if text.startswith(settled) and not text[len(settled) :].strip("\ufffd") else text
    data = bytes(reversed(run))
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        decoder.decode(data, final=False)
    except UnicodeDecodeError:
        return text  # an invalid byte: the run is U+FFFD whatever follows
    dangling = len(decoder.getstate()[0])
    if not dangling:
        return text
    out = list(o.out[:k])
    for n in range(len(out) - 1, -1, -1):  # leave out the last ``dangling`` byte ids
        if dangling and out[n] not in special:
            del out[n]
            dangling -= 1
    return o.expected(out)


# --- modes: where each part of a text goes ------------------------------------------------


def live(rules: Rules | None, mode: int, stops: Sequence[str]) -> tuple[list[tuple[str, str]], bool]:
    """The patterns ``(kind, text)`` live in ``mode`` (stops first), and whether stops are."""
    if rules is None:
        return [("stop", s) for s in stops], True
    t = rules.tags
    both = bool(t.reasoning_open and t.reasoning_close)
    if mode == CONTENT:
        pats = [("stop", s) for s in stops]
        if both:
            pats += [("r_open", t.reasoning_open), ("r_close", t.reasoning_close)]
        if t.tool_open:
            pats.append(("t_open", t.tool_open))
            if t.tool_bare:
                pats.append(("t_bare", t.tool_bare))
        return pats, True
    if mode == REASONING:
        on = rules.stop_in_reasoning
        call = [("t_open", t.tool_open)] if t.tool_ends_reasoning and t.tool_open else []  # a call ends it
        return [("stop", s) for s in stops] * on + [("r_close", t.reasoning_close)] + call, on
    return ([("t_close", t.tool_close)] if t.tool_close else []), False


_NEXT = {"r_open": REASONING, "r_close": CONTENT, "t_open": TOOL, "t_close": CONTENT, "t_bare": TOOL}


class Seg(NamedTuple):
    mode: int
    start: int
    end: int  # the text of this mode: text[start:end]
    tag: str | None  # what ended it: a tag kind ("" for the end of the text)
    tag_end: int  # where that tag ends (a stop may end up to there)
    rest: int = 0  # where its automaton last started again (past a close tag that stayed text)
    inserts: tuple[tuple[int, str], ...] = ()  # a body's text the decode drops, by position


class _Body(NamedTuple):
    """A tool body's rule for markers: the format's ``marker_is_text`` over the body so far."""

    fmt: Any  # ToolFormat
    keeps_id_close: bool

    def is_text(self, text: str, start: int, at: int, inserts: Sequence[tuple[int, str]]) -> bool:
        return bool(self.fmt.marker_is_text(body_text(text, start, at, inserts)))


def body_text(text: str, start: int, end: int, inserts: Sequence[tuple[int, str]]) -> str:
    """``text[start:end]`` with ``inserts`` (``(position, text)``) written in."""
    parts, at = [], start
    for p, extra in inserts:
        parts += [text[at:p], extra]
        at = p
    return "".join(parts) + text[at:end]


def _first_tag(text: str, rules: Rules, mode: int, scan: int, limit: int) -> tuple[int, int, str] | None:
    """The first-ending tag live in ``mode`` within ``text[scan:limit]`` (ties: list order):
    ``(start, end, kind)``."""
    best = None
    for rank, (kind, pat) in enumerate(p for p in live(rules, mode, ())[0] if p[0] != "stop"):
        at = text.find(pat, scan, limit)
        if at != -1 and (best is None or (at + len(pat), rank) < best[0]):
            best = ((at + len(pat), rank), at, kind)
    return None if best is None else (best[1], best[0][0], best[2])


def segments(text: str, rules: Rules | None, events: Sequence[tuple[int, str]]) -> list[Seg]:
    """``text`` split into modes: at the first-ending tag live in each mode (ties: list
    order), and at ``events`` (``(position, kind)``: a skipped tag id), which release what is
    held and switch mode as ``Router._id_tag`` does where the tag is live in the mode (and
    are nothing elsewhere). A tag that stays text leaves the mode
    as it is, and the search goes on past it:

    * a tool close tag where the body so far ends inside a value (the format's
      ``marker_is_text``); a skipped close tag id there is the body's text where the body
      keeps it (``rules.keeps_id_close``: a separate tool channel), and the decode has none;
    * a bare opener (``TagSet.tool_bare``) where the tags allow it only at the reply's start
      (``bare_at_start``) and content that is not blank came before it, or a tool body did.
      A bare opener that opens a body is the body's first text."""
    if rules is None:
        return [Seg(CONTENT, 0, len(text), None, len(text))]
    t = rules.tags
    body = _Body(families.tool_format(t.tool_format), rules.keeps_id_close)
    segs: list[Seg] = []
    pos, scan, rest, mode, ev = 0, 0, 0, rules.start, list(events)
    at_start = bool(t.tool_bare and t.bare_at_start)
    inserts: list[tuple[int, str]] = []
    while True:
        limit = ev[0][0] if ev else len(text)
        hit = _first_tag(text, rules, mode, scan, limit)
        if hit is None and not ev:
            segs.append(Seg(mode, pos, len(text), None, len(text), rest, tuple(inserts)))
            return segs
        if hit is None:
            at, kind = ev.pop(0)
            end = at
            if all(k != kind for k, _ in live(rules, mode, ())[0]):  # where its text is text: nothing
                continue
            if kind == "t_close" and mode == TOOL and body.is_text(text, pos, at, inserts):
                if body.keeps_id_close:
                    inserts.append((at, t.tool_close))
                scan = rest = at
                continue
        else:
            at, end, kind = hit
            if kind == "t_close" and body.is_text(text, pos, at, inserts):
                scan = rest = end
                continue
            if kind == "t_bare" and t.bare_at_start and not (at_start and not text[pos:at].strip()):
                scan = end  # text, to the stops too: the automaton goes on over it
                continue
        if (mode == CONTENT and text[pos:at].strip()) or kind in ("t_open", "t_bare"):
            at_start = False
        segs.append(Seg(mode, pos, at, kind, end, rest, tuple(inserts)))
        pos = scan = rest = at if kind == "t_bare" else end
        mode, inserts = _NEXT[kind], []


def first_stop(text: str, opts: Opts, rules: Rules | None, events: Sequence[tuple[int, str]], shown: int) -> tuple[int, int, str] | None:
    """The stop string that ends the stream in ``text``: ``(start, end, stop)`` of the first
    one (by mode, then earliest end, then list order) that ends past ``shown`` where stops
    are live, never across a mode change."""
    if not opts.stops:
        return None
    for seg in segments(text, rules, events):
        _, on = live(rules, seg.mode, opts.stops)
        if not on:
            continue
        best = None
        for rank, stop in enumerate(opts.stops):
            at = text.find(stop, seg.start)
            while at != -1 and at + len(stop) <= seg.tag_end:
                end = at + len(stop)
                if end > shown and (best is None or (end, rank) < best[0]):
                    best = ((end, rank), at, stop)
                at = text.find(stop, at + 1)
        if best is not None:
            return best[1], best[0][0], best[2]
    return None


def events_of(o: Oracle, rules: Rules | None, k: int, skip: bool) -> list[tuple[int, str]]:
    """The skipped tag ids among the first ``k`` output ids, at the settled text before each."""
    if rules is None or not rules.id_tags or not skip:
        return []
    return [(len(o.settled(j)), rules.id_tags[t]) for j, t in enumerate(o.out[:k]) if t in rules.id_tags]


def reference(o: Oracle, opts: Opts, rules: Rules | None = None, skip: bool = False) -> Want:
    """What the stream gives for the whole output: steps (1)-(5) of ``DetokenizerState._step``
    over the formula's texts (module docstring)."""
    m = opts.min_tokens
    shown_text = o.text(m).rstrip("\ufffd") if m else ""
    shown_min = len(o.settled(m)) if m else 0
    n = len(o.out)
    for k in range(1, n + 1):
        tid = o.out[k - 1]
        stop_id = (tid in opts.stop_ids or (opts.last_is_stop and k == n)) and k > m
        if not stop_id or opts.include:
            text = o.text(k)
            shown = max(shown_min, len(os.path.commonprefix([shown_text, text]))) if m else 0
            hit = first_stop(text, opts, rules, events_of(o, rules, k, skip), shown) if k > m else None
            if hit is not None:
                start, end, stop = hit
                cut = end if opts.include else start
                return Want(text[:cut], "stop", stop, k, cut)
        if stop_id:
            text = o.text(k) if opts.include else o.text(k - 1)
            if not opts.include and not opts.last_is_stop:
                # What the end releases (an unfinished character, rendered as the decode
                # renders it) never showed: a stop completing in it ends the stream at k.
                shown = max(shown_min, len(os.path.commonprefix([shown_text, text]))) if m else 0
                hit = first_stop(text, opts, rules, events_of(o, rules, k - 1, skip), shown)
                if hit is not None:
                    return Want(text[: hit[0]], "stop", hit[2], k, hit[0])
            return Want(text, "stop", None if tid in opts.eos_ids or opts.last_is_stop else tid, k, len(text))
        if opts.max_tokens is not None and k >= opts.max_tokens:
            return Want(o.text(k), "length", None, k, len(o.text(k)))
    return Want(o.text(n), None, None, n, len(o.text(n)))


def released(o: Oracle, k: int, opts: Opts, rules: Rules | None, skip: bool) -> str:
    """What a live stream has released after ``k`` ids: the settled text less the longest
    suffix of its current mode's text that is a proper prefix of a pattern it holds for (a
    stop kept in the output holds nothing)."""
    text = o.settled(k)
    last = segments(text, rules, events_of(o, rules, k, skip))[-1]
    pats, _ = live(rules, last.mode, opts.stops)
    held = [p for kind, p in pats if not (kind == "stop" and opts.include)]
    tail = text[last.rest :]  # the automaton starts again past a close tag that stayed text
    hold = max((j for p in held for j in range(1, min(len(p) - 1, len(tail)) + 1) if tail.endswith(p[:j])), default=0)
    return text[: len(text) - hold]


class Item(NamedTuple):
    """One part of a chat reply: ``kind`` is ``"content"``, ``"reasoning"`` or ``"body"`` (a
    tool body: ``closed`` when its close tag came, ``bare`` when its bare opener opened it
    and is its first text)."""

    kind: str
    text: str
    closed: bool = False
    bare: bool = False


def channels(text: str, rules: Rules, events: Sequence[tuple[int, str]], kept: str = "") -> list[Item]:
    """``text`` (cut before the stop) and then ``kept`` (the stop string, where the output
    keeps it: no tag ending with it counts) as ``reasoning="separate"``, ``tools="separate"``
    split them, in order, one :class:`Item` per mode's text (none for empty content; an
    empty reasoning too: its tags still end a content segment)."""
    items: list[Item] = []
    segs = segments(text, rules, events)
    last = segs[-1]
    segs[-1] = last._replace(end=last.end + len(kept))
    text += kept
    for n, seg in enumerate(segs):
        if seg.mode == TOOL:  # ended by its close tag, or by the end of the text
            bare = n > 0 and segs[n - 1].tag == "t_bare"
            items.append(Item("body", body_text(text, seg.start, seg.end, seg.inserts), seg.tag == "t_close", bare))
        elif seg.end > seg.start or seg.mode == REASONING:
            items.append(Item("content" if seg.mode == CONTENT else "reasoning", text[seg.start : seg.end]))
    return items
