"""The differential fuzz's layers (``fuzz.py``): one case through each layer a server uses,
checked against the oracle (``_fuzz_oracle``). Each function returns the problems it found
(empty: the stream passed); an exception is the caller's to count.

Checks per stream: the joined text (each channel's, in the chat layer) is the oracle's;
what was released after every push is a prefix of the final text (nothing taken back) and
is all of the settled text but a genuine partial stop or tag match (nothing held without
one); the finish reason, stop reason and ids taken are the oracle's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from _fuzz_cases import Case, Tok
from _fuzz_oracle import CONTENT, REASONING, Item, Opts, Oracle, Rules, Want, channels, events_of, reference, released

from detok_plugin import ChatStream, ServingStream, TaggedServingStream, TagSet, families, live_tags

LAYERS = ("serving", "tagged", "chat", "vllm", "tgi")


def _short(text: Any) -> str:
    r = repr(text)
    return r if len(r) <= 160 else r[:157] + "..."


class Check:
    """Problems of one stream, each said once."""

    def __init__(self, o: Oracle, want: Want) -> None:
        self.o, self.want, self.problems = o, want, []  # type: tuple[Oracle, Want, list[str]]

    def eq(self, what: str, got: Any, want: Any) -> None:
        if got != want:
            self.problems.append(f"{what}: got {_short(got)}, want {_short(want)}")

    def step(self, joined: str, k: int, live: bool, expect: str | None) -> None:
        """After a push of the first ``k`` ids: nothing taken back; while the stream is live,
        nothing held but a partial match (``expect``, the released text)."""
        if self.problems:
            return
        if not self.want.text.startswith(joined):
            self.problems.append(f"taken back after {k} ids: {_short(joined)} is no prefix of {_short(self.want.text)}")
        elif live and expect is not None and joined != expect:
            self.problems.append(f"held after {k} ids: released {_short(joined)}, settled less partial match {_short(expect)}")


def _chunks(c: Case) -> Iterator[tuple[int, list[int]]]:
    k = 0
    for n in c.chunks:
        if k >= len(c.out):
            return
        yield k, c.out[k : k + n]
        k += n


def _oracle(c: Case, t: Tok, out: Sequence[int] | None = None) -> Oracle:
    return Oracle(t.tok, c.prompt, c.out if out is None else out, c.skip, c.spaces, t.probes)


def serving(c: Case, t: Tok) -> list[str]:
    """``ServingStream``: stops, stop ids, EOS, min/max tokens, both skip values, the include
    flag; ``push_text`` per id or ``push`` of several."""
    o = _oracle(c, t)
    opts = Opts(c.stops, frozenset(c.stop_ids) | frozenset(c.eos), frozenset(c.eos), c.include, c.min_tokens, c.max_tokens)
    want = reference(o, opts, None, c.skip)
    s = ServingStream.from_tokenizer(
        t.tok, prompt_ids=c.prompt, skip_special_tokens=c.skip, spaces_between_special_tokens=c.spaces, stop=c.stops,
        stop_token_ids=c.stop_ids, eos_token_ids=c.eos, include_stop_str_in_output=c.include,
        min_tokens=c.min_tokens, max_tokens=c.max_tokens,
    )
    check, joined, k = Check(o, want), "", 0
    for _, ids in _chunks(c):
        if s.finished:
            break
        if len(ids) == 1:
            joined, k = joined + s.push_text(ids[0]), k + 1
        else:
            d = s.push(ids)
            joined, k = joined + d.text, k + d.consumed
        check.step(joined, k, not s.finished, None if s.finished else released(o, k, opts, None, c.skip))
    if not s.finished:
        joined += s.finish().text
    check.eq("text", joined, want.text)
    check.eq("finish", (s.finish_reason, s.stop_reason), (want.finish_reason, want.stop_reason))
    check.eq("token_ids", s.token_ids, c.out[: want.taken])
    return check.problems


def _rules(c: Case, t: Tok, tags: TagSet, stop_in_reasoning: bool, chat: bool = False) -> Rules:
    start = CONTENT
    if tags.reasoning_open and tags.reasoning_close and c.prompt:
        # A template that ends in the open tag (compared without trailing blanks on both sides:
        # a tag may end in a newline, Gemma 4's "<|channel>thought\n").
        start = REASONING if t.tok.decode(c.prompt[-16:]).rstrip().endswith(tags.reasoning_open.rstrip()) else CONTENT
    kinds = {"r_open": tags.reasoning_open, "r_close": tags.reasoning_close, "t_open": tags.tool_open, "t_close": tags.tool_close}
    id_tags = {t.id_tags[text]: kind for kind, text in kinds.items() if text in t.id_tags}
    return Rules(tags, stop_in_reasoning, start, id_tags if c.skip else {}, keeps_id_close=chat)


def tagged(c: Case, t: Tok) -> list[str]:
    """``TaggedServingStream``: a preset's tags inline, stops outside reasoning and tool bodies."""
    tags = TagSet.preset(c.preset or "qwen3")
    o = _oracle(c, t)
    opts = Opts(c.stops, frozenset(c.stop_ids) | frozenset(c.eos), frozenset(c.eos), c.include, c.min_tokens, c.max_tokens)
    rules = _rules(c, t, tags, False)
    want = reference(o, opts, rules, c.skip)
    s = TaggedServingStream.from_tokenizer(
        t.tok, tags=tags, prompt_ids=c.prompt, skip_special_tokens=c.skip, spaces_between_special_tokens=c.spaces,
        stop=c.stops, stop_token_ids=c.stop_ids, eos_token_ids=c.eos, include_stop_str_in_output=c.include,
        min_tokens=c.min_tokens, max_tokens=c.max_tokens,
    )
    check, joined = Check(o, want), ""
    for _, ids in _chunks(c):
        if s.finished:
            break
        joined += s.push_text(ids[0]) if len(ids) == 1 else s.push(ids).text
        k = len(s.token_ids)
        check.step(joined, k, not s.finished, None if s.finished else released(o, k, opts, rules, c.skip))
    if not s.finished:
        joined += s.finish().text
    check.eq("text", joined, want.text)
    check.eq("finish", (s.finish_reason, s.stop_reason), (want.finish_reason, want.stop_reason))
    check.eq("token_ids", s.token_ids, c.out[: want.taken])
    return check.problems


def _finished_before_cut(fmt: families.ToolFormat, body: str) -> list[tuple[str, str]]:
    """The calls of a body the reply ended inside that the model finished: the body up to
    its last ``call_close`` marker that is no value's text, parsed (none where it does not
    parse, or the format has no such marker)."""
    close = fmt.call_close
    at = body.rfind(close) if close else -1
    while close and at >= 0 and fmt.marker_is_text(body[:at]):
        at = body.rfind(close, 0, at)
    if not close or at < 0:
        return []
    try:
        return fmt.parse(body[: at + len(close)].strip(), None)
    except (ValueError, TypeError):
        return []


class ChatWant(NamedTuple):
    content: str
    reasoning: str
    calls: list[tuple[str, str]]
    irregular: bool  # a body was malformed (sent as content) or cut (dropped)


def _chat_want(tags: TagSet, items: list[Item], edges: bool) -> ChatWant:
    """Content, reasoning and the calls a chat reply's parts make, by the chat layer's rules
    (``detok_plugin._chat``'s module docstring):

    1. a body is finished at its close tag, or at the reply's end for a format whose body
       runs to the end: its parse gives calls; one that does not parse is content, raw (its
       open tag unless a bare opener opened it, its text, its close tag), unless it is
       blank (then it is nothing);
    2. a body the reply ended inside is dropped; the calls finished before the cut stay
       (``ToolFormat.call_close``);
    3. with ``edges`` (live tags): whitespace at the edges of a content or reasoning segment
       is markup (``detok_plugin._edges``). Reasoning (its open tag, empty or not) ends a
       content segment; a body does not: a call goes out of band and the content on both
       sides of it is one segment, and a body sent as content is text of it."""
    fmt = families.tool_format(tags.tool_format)
    content, reasoning, calls = [], [], []  # type: list[str], list[str], list[tuple[str, str]]
    segment: list[str] = []  # the content segment so far
    irregular = False

    def edge(text: str) -> str:
        return text.strip() if edges else text

    def end_segment() -> None:
        content.append(edge("".join(segment)))
        segment.clear()

    for item in items:
        if item.kind == "content":
            segment.append(item.text)
        elif item.kind == "reasoning":
            end_segment()
            reasoning.append(edge(item.text))
        elif not item.closed and tags.tool_close is not None:
            calls += _finished_before_cut(fmt, item.text)
            irregular = True
        else:
            try:
                calls += fmt.parse(item.text.strip(), None)
            except (ValueError, TypeError):
                irregular = True
                if item.text.strip():  # sent as content, raw; a blank body is nothing
                    opener = "" if item.bare else tags.tool_open or ""
                    segment.append(opener + item.text + (tags.tool_close or ""))
    end_segment()
    return ChatWant("".join(content), "".join(reasoning), calls, irregular)


def chat(c: Case, t: Tok) -> list[str]:
    """``ChatStream``: reasoning, content and tool calls as OpenAI delta fields, with stops
    inside reasoning when asked, the live halves of a preset, EOS ending the reply; calls
    sent whole once finished, or (``stream_arguments``, half the streams) as they form. The
    calls, content and reasoning it must give are ``_chat_want``'s, from the decode."""
    preset = TagSet.preset(c.preset or "qwen3")
    live = live_tags(preset, *c.halves)
    tags = live if live is not None else TagSet()
    eos = frozenset(c.eos)
    fed = c.out[:-1] if c.out and c.out[-1] in eos and not c.include else c.out
    o = _oracle(c, t, fed)
    opts = Opts(c.stops, include=c.include, min_tokens=c.min_tokens)
    rules = _rules(c, t, tags, c.stop_in_reasoning, chat=True)
    want = reference(o, opts, rules, c.skip)
    kept = len(want.stop_reason) if c.include and isinstance(want.stop_reason, str) else 0
    before, stop = want.text[: len(want.text) - kept], want.text[len(want.text) - kept :]
    edges = live is not None  # the chat layer's segment edges, where tags are live
    content, reasoning, calls, irregular = _chat_want(tags, channels(before, rules, events_of(o, rules, want.taken, c.skip), stop), edges)
    stream_arguments = bool(c.extra & 1)  # names and arguments as they form, else each call whole
    ids = itertools.count()
    cs = ChatStream(
        t.tok, live, prompt_ids=c.prompt, skip_special_tokens=c.skip, spaces_between_special_tokens=c.spaces,
        stop=c.stops, include_stop_str_in_output=c.include, min_tokens=c.min_tokens,
        stop_in_reasoning=c.stop_in_reasoning, end_ids=lambda: eos, new_call_id=lambda name, fmt: f"call_{next(ids)}",
        stream_arguments=stream_arguments,
    )
    check = Check(o, want)
    got_content, got_reasoning, got_calls = "", "", {}  # type: str, str, dict[int, list[str]]
    steps = list(_chunks(c))
    for n, (k, step) in enumerate(steps):
        fields = cs.message(step, n == len(steps) - 1) or {}
        got_content += fields.get("content", "")
        got_reasoning += fields.get("reasoning", "")
        for call in fields.get("tool_calls", ()):
            entry = got_calls.setdefault(call["index"], ["", ""])
            entry[0] += call["function"].get("name", "")
            entry[1] += call["function"].get("arguments", "")
        if not content.startswith(got_content) or not reasoning.startswith(got_reasoning):
            check.problems.append(f"taken back after {k + len(step)} ids: {_short((got_content, got_reasoning))}")
            break
        if not cs.state.finished:  # nothing held but a partial match (checked while no tool body came)
            taken = len(cs.state.token_ids)
            items = channels(released(o, taken, opts, rules, c.skip), rules, events_of(o, rules, taken, c.skip))
            if all(item.kind != "body" for item in items):  # a segment's trailing whitespace is held
                exp = _chat_want(tags, items, edges)[:2]
                check.eq(f"released after {taken} ids", (got_content, got_reasoning), exp)
    check.eq("content", got_content, content)
    check.eq("reasoning", got_reasoning, reasoning)
    check.eq("complete calls", cs.complete, calls)
    streamed = [tuple(got_calls[i]) for i in sorted(got_calls)]
    if not stream_arguments:  # each call sent whole once the model finished it
        check.eq("streamed calls", streamed, calls)
        return check.problems
    # Streamed as they form: a malformed or cut body's call may have had its name and part
    # of its arguments sent; every finished call went out whole, in order.
    rest = iter(streamed)
    if not all(any(s == call for s in rest) for call in calls) or (len(streamed) != len(calls) and not irregular):
        check.problems.append(f"streamed calls {_short(streamed)}, parsed {_short(calls)}")
    return check.problems
