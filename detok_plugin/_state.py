"""``DetokenizerState``: one request's stream, from token ids to channels of settled text.

The safe emission boundary: after every token, text leaves up to the earliest of

1. the last point the decoder has settled (an incomplete UTF-8 character, or a SentencePiece
   byte run that a later byte could still turn into U+FFFD, is held by the decoder);
2. the start of the longest unemitted suffix that is a prefix of a stop string;
3. the start of the longest unemitted suffix that is a prefix of a tag.

Points 2 and 3 are one Aho-Corasick automaton per channel (``_matcher.Matcher``), so a
suffix that cannot become a stop or a tag is held for zero characters, and nothing emitted
is ever taken back.

>>> from detok_plugin import DetokenizerState
>>> from detok_plugin._tables import TokenTable
>>> table = TokenTable("byte_level", (b"\\xf0\\x9f", b"\\xab", b"\\xa8", b"Hi", b" ###"), frozenset())
>>> s = DetokenizerState.from_tokenizer(table, stop=["###"])
>>> [s.push(i).text for i in (3, 0, 1, 2)]   # 🫨 is three byte tokens: it leaves at the third
['Hi', '', '', '🫨']
>>> d = s.push(4); (d.text, d.finish_reason, d.stop_reason)
(' ', 'stop', '###')
"""

from __future__ import annotations

import functools
import operator
import os
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._decoders import ByteLevelStream, GenericStream, SentencePieceStream, StreamDecoder
from ._errors import StreamFinishedError, TokenIdError, TokenTypeError, UnsupportedTokenizerError
from ._matcher import Matcher
from ._tables import TokenTable, build_table, decode_with_table, eos_token_ids_of
from ._tags import TagSet, ToolCall, parse_tool_body

__all__ = ["Delta", "DetokenizerState", "Segment"]

FinishReason = Literal["stop", "length"]
Reasoning = Literal["separate", "strip", "inline"]
Channel = Literal["content", "reasoning", "tool", "tag", "stop"]

_CONTENT, _REASONING, _TOOL, _TAG, _STOP = 0, 1, 2, 3, 4
_CHANNEL_NAMES: tuple[Channel, ...] = ("content", "reasoning", "tool", "tag", "stop")
_EMPTY: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, slots=True)
class Delta:
    """What one ``push`` or ``finish`` released.

    ``text`` is content, ``reasoning`` the reasoning channel, ``tool_calls`` the tool-call
    channel. ``consumed`` is how many of the pushed ids were used: fewer than pushed when a
    stop completed inside a multi-token push, so the caller can drop the rest.
    """

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    consumed: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


_ONE_EMPTY = Delta(consumed=1)

# The hot path builds a one-token content Delta by filling its slots directly: a frozen
# dataclass's __init__ goes through object.__setattr__ once per field, about twice the cost.
_new_delta = object.__new__
_set_text = Delta.text.__set__  # type: ignore[attr-defined]
_set_reasoning = Delta.reasoning.__set__  # type: ignore[attr-defined]
_set_tools = Delta.tool_calls.__set__  # type: ignore[attr-defined]
_set_finish = Delta.finish_reason.__set__  # type: ignore[attr-defined]
_set_stop = Delta.stop_reason.__set__  # type: ignore[attr-defined]
_set_consumed = Delta.consumed.__set__  # type: ignore[attr-defined]


def _text_delta(text: str) -> Delta:
    """``Delta(text, consumed=1)``, built by filling the slots (equal, and faster)."""
    d = _new_delta(Delta)
    _set_text(d, text)
    _set_reasoning(d, "")
    _set_tools(d, _EMPTY)
    _set_finish(d, None)
    _set_stop(d, None)
    _set_consumed(d, 1)
    return d


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of the lossless log: joined, the pieces are the full decode up to the stop."""

    channel: Channel
    text: str


class _Out:
    """Accumulates one call's output before it becomes a frozen Delta."""

    __slots__ = ("text", "reasoning", "tools")

    def __init__(self) -> None:  # list displays: cheaper than dataclass default factories
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tools: list[ToolCall] = []


def _as_id(value: Any, position: int, request_id: str | None) -> int:
    if type(value) is int:
        return value
    if isinstance(value, bool):
        raise TokenTypeError(value, position, request_id)
    try:
        return operator.index(value)  # numpy / torch integer scalars
    except TypeError:
        raise TokenTypeError(value, position, request_id) from None


class DetokenizerState:
    """One request's stream: ``push(ids) -> Delta`` per step, ``finish() -> Delta`` at the end.

    Build it with :meth:`from_tokenizer`. The joined ``Delta.text`` equals
    ``tokenizer.decode(prompt + out)[len(tokenizer.decode(prompt)):]`` with the same
    flags, cut at a stop as the stop options say, and with reasoning and tool calls moved
    to their channels when ``tags`` are given.

    ``finish_reason`` (``"stop"``, ``"length"`` or None) and ``stop_reason`` (the stop
    string or stop token id; None for EOS) are attributes to read, not to set.
    ``token_ids`` is the list of the output ids taken so far; its length is the count that
    ``min_tokens`` and ``max_tokens`` compare with.
    """

    # Slot order is memory order: what push_text's hot branch reads comes first.
    __slots__ = (
        "token_ids",
        "_size",
        "_hot",
        "_keep_log",
        "finish_reason",
        "stop_reason",
        "_dec",
        "_ac_state",
        "_first",
        "_held_may_stop",
        "_steps",
        "_pending",
        "_hot_static",
        "_skip_chars",
        "_done",
        "_fffd_stops",
        "_prov",
        "_early",
        "_log_text",
        "_log_kind",
        "path",
        "why",
        "request_id",
        "_vocab",
        "_holes",
        "_stop_ids",
        "_eos_ids",
        "_include_stop",
        "_min_tokens",
        "_max_tokens",
        "_tags",
        "_reasoning_mode",
        "_id_tags",
        "_matchers",
        "_kinds",
        "_has_stops",
        "_mode",
        "_ac",
        "_tool_index",
        "_tool_body",
    )

    # --- construction ------------------------------------------------------------------

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        *,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = False,
        spaces_between_special_tokens: bool = True,
        stop: str | Iterable[str] | None = (),
        stop_token_ids: Iterable[int] | None = (),
        eos_token_ids: Iterable[int] | None = None,
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
        max_tokens: int | None = None,
        tags: TagSet | str | None = None,
        reasoning: Reasoning = "separate",
        stop_in_reasoning: bool = False,
        request_id: str | None = None,
        keep_log: bool = True,
    ) -> "DetokenizerState":
        """Start a stream on ``tokenizer`` (transformers, ``tokenizers.Tokenizer``, a
        :class:`TokenTable`, or anything with ``decode(ids)``).

        ``eos_token_ids`` defaults to the tokenizer's own EOS ids; pass ``()`` to leave EOS
        to the caller. ``spaces_between_special_tokens`` reaches only tokenizers whose decode
        takes it (slow SentencePiece tokenizers); tokenizers-backed decodes ignore it.
        ``keep_log=False`` keeps no lossless log (``log()`` then refuses): for callers that
        keep the text themselves and want neither the memory nor the per-token append.
        """
        if reasoning not in ("separate", "strip", "inline"):
            raise ValueError(f"reasoning must be 'separate', 'strip' or 'inline', not {reasoning!r}")
        if isinstance(tags, str):
            tags = TagSet.preset(tags)
        self = cls.__new__(cls)
        self.request_id = request_id
        table, why = build_table(tokenizer)
        if table is None and not callable(getattr(tokenizer, "decode", None)):
            raise UnsupportedTokenizerError(
                f"{type(tokenizer).__name__} is not a transformers or tokenizers tokenizer, a "
                "TokenTable, or an object with decode(ids): detok-plugin cannot read it"
            )
        dec: StreamDecoder
        if table is not None:
            self._vocab = table.pieces
            self._holes = table.has_holes
            self._size = len(table.pieces)
            prompt = self._checked_prompt(prompt_ids)
            if table.family == "byte_level":
                dec = ByteLevelStream(table, skip_special_tokens=skip_special_tokens)
            else:
                dec = SentencePieceStream(table, skip_special_tokens=skip_special_tokens)
            dec.prime(prompt)
            # decode(prompt) renders a held tail as final: its characters stand where the
            # output's first characters will, so the output starts that many characters in.
            self._skip_chars = len(dec.peek_final())
            eos_default: tuple[int, ...] = table.eos_token_ids
        else:
            self._vocab = None
            self._holes = False
            self._size = _vocab_size(tokenizer)
            prompt = self._checked_prompt(prompt_ids)
            decode_kwargs: dict[str, Any] = {"skip_special_tokens": skip_special_tokens}
            if _takes_kwarg(tokenizer, "spaces_between_special_tokens"):
                decode_kwargs["spaces_between_special_tokens"] = spaces_between_special_tokens

            def decode(ids: list[int], _d=tokenizer.decode, _k=decode_kwargs) -> str:
                return _d(ids, **_k)

            cleanup = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
            dec = GenericStream(decode, prompt, cleanup=cleanup)
            self._skip_chars = 0
            eos_default = eos_token_ids_of(tokenizer)
        self.path = dec.path
        self.why = why
        self._dec = dec
        self.token_ids: list[int] = []
        self._done = False

        # Stop conditions.
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        self._eos_ids = frozenset(eos_default if eos_token_ids is None else eos_token_ids) or _NO_IDS
        self._stop_ids = (frozenset(stop_token_ids or ()) | self._eos_ids) or _NO_IDS
        self._include_stop = include_stop_str_in_output
        self._min_tokens = min_tokens
        self._max_tokens = max_tokens
        # Plain slots, read-only by contract: a serving loop reads them after every push
        # (an attribute read, where a property would cost a call).
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None

        # Tags and channels: one automaton per channel, over the patterns live in it.
        self._tags = tags
        self._reasoning_mode = reasoning
        # Shared per configuration (_channels), not built per stream.
        self._kinds, self._matchers, self._has_stops = _channels(stops, tags, stop_in_reasoning, include_stop_str_in_output)
        self._id_tags = _id_tags(table, tags) if tags is not None and table is not None and skip_special_tokens else _NO_ID_TAGS
        self._mode = _CONTENT
        # Per-stream containers only where they are used: a request's objects spread the
        # serving loop's own, so fewer per stream is a cheaper step (docs/benchmarks.md).
        self._log_text: list[str] = [] if keep_log else _NO_LOG  # type: ignore[assignment]
        self._log_kind: list[int] = [] if keep_log else _NO_LOG  # type: ignore[assignment]
        self._keep_log = keep_log
        if tags is not None and tags.reasoning_open and tags.reasoning_close and prompt:
            # A template that ends inside an open reasoning block (``<think>\n``) starts the
            # stream in reasoning. Decoded with special tokens kept: the tag may be one.
            tail = decode_with_table(table, prompt[-16:]) if table is not None else tokenizer.decode(prompt[-16:])
            if tail.rstrip().endswith(tags.reasoning_open):
                self._mode = _REASONING
                self._log(_TAG, "")  # the open tag lives in the prompt
        self._ac = self._matchers[self._mode]
        self._ac_state = 0
        self._pending = ""
        self._tool_index = -1
        self._tool_body: list[str] = [] if tags is not None else _NO_LOG  # type: ignore[assignment]
        # push_text's hot branch: a table, no tags, stop ids or max_tokens. Stop strings may
        # be live: a token whose text has no first character of a stop, with nothing held or
        # partly matched, leaves at once. _first finds such a character (None: no stops).
        content = self._matchers[_CONTENT]
        self._hot_static = self._vocab is not None and tags is None and not self._stop_ids and max_tokens is None
        self._first = content.find_first if content is not None else None
        self._steps = content.steps if content is not None else ()
        # Text the decoder holds can complete a stop only if, rendered as final, it can
        # contain a stop's characters: never when it is all U+FFFD and no stop has one.
        self._fffd_stops = any("\ufffd" in s for s in stops)
        self._prov: tuple[Any, int, Any, int, int] | None = None  # _held_hit's last scan of held text
        # The head of the held text that showed by token min_tokens: a stop ending in it
        # completed too early, now and when it is released as it showed (_take).
        self._early = ""
        self._held_may_stop = self._has_stops[_CONTENT] and (not dec.held_is_replacement or self._fffd_stops)
        self._hot = self._hot_static and not self._skip_chars
        return self

    # --- the verbs ---------------------------------------------------------------------

    def push(self, ids: int | Sequence[int]) -> Delta:
        """Add one id or several (a speculative step); return what is now settled."""
        if self._done:
            raise StreamFinishedError(len(self.token_ids), self.request_id, self.finish_reason or "finish() was called")
        if (
            type(ids) is int
            and self._vocab is not None
            and 0 <= ids < self._size
            and self._vocab[ids] is not None
            and not self._skip_chars
            and ids not in self._id_tags
            and ids not in self._stop_ids
        ):
            return self._push_one(ids)
        if type(ids) is int:
            batch: Sequence[Any] = (ids,)
        elif isinstance(ids, (str, bytes, bool)) or not hasattr(ids, "__iter__"):
            raise TokenTypeError(ids, len(self.token_ids), self.request_id)
        else:
            batch = ids if isinstance(ids, (list, tuple)) else list(ids)
        base = len(self.token_ids)
        checked = [_as_id(v, base + k, self.request_id) for k, v in enumerate(batch)]
        for k, tid in enumerate(checked):
            self._check_range(tid, base + k)
        out = _Out()
        consumed = 0
        for tid in checked:
            consumed += 1
            self._step(tid, out)
            if self.finish_reason is not None:
                break
        if self.finish_reason is not None:
            self._close(out)
        self._settled()
        if len(checked) == 1 and not out.text and not out.reasoning and not out.tools and self.finish_reason is None:
            return _ONE_EMPTY
        return self._delta(out, consumed)

    def finish(self) -> Delta:
        """End the stream: release everything held, rendered as the final decode renders it."""
        if self._done and self.finish_reason is None:
            raise StreamFinishedError(len(self.token_ids), self.request_id, "finish() was called")
        if self._done:  # a stop already closed the stream: nothing more to release
            if self._dec is None:
                raise StreamFinishedError(len(self.token_ids), self.request_id, "finish() was called")
            self._dec = None  # type: ignore[assignment]
            return self._delta(_Out(), 0)
        out = _Out()
        self._close(out)
        self._dec = None  # type: ignore[assignment]
        self._hot = False
        return self._delta(out, 0)

    @property
    def finished(self) -> bool:
        """True after a stop condition or finish(): no further push is accepted."""
        return self._done

    @property
    def held(self) -> str:
        """Text settled by the decoder but held back because a stop or tag may be forming."""
        return self._pending

    def log(self) -> list[Segment]:
        """The lossless log, adjacent pieces of one channel merged: joined, the full decode
        up to the stop (the stop string itself is a ``"stop"`` segment when it is cut)."""
        if not self._keep_log:
            raise ValueError("this stream was started with keep_log=False: it keeps no log")
        merged: list[list[Any]] = []
        for kind, text in zip(self._log_kind, self._log_text):
            if merged and merged[-1][0] == kind and kind != _TAG:
                merged[-1][1].append(text)
            else:
                merged.append([kind, [text]])
        segments = (Segment(_CHANNEL_NAMES[kind], "".join(parts)) for kind, parts in merged)
        return [seg for seg in segments if seg.text]

    # --- internals: one token ---------------------------------------------------------

    def _checked_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        """Validate the prompt, in C when it is clean; the per-id path names a bad id."""
        if len(prompt_ids) == 0:
            return []
        try:
            packed = array("q", prompt_ids)  # ints and __index__ objects only
            clean = 0 <= min(packed) and max(packed) < self._size
        except (TypeError, OverflowError):
            clean = False
        vocab = self._vocab
        if clean:
            prompt = packed.tolist()
            if not self._holes or not any(vocab[t] is None for t in set(prompt)):  # type: ignore[index]
                return prompt
        n = len(prompt_ids)
        prompt = [_as_id(v, i - n, self.request_id) for i, v in enumerate(prompt_ids)]
        for i, tid in enumerate(prompt):
            self._check_range(tid, i - n)
        return prompt

    def push_text(self, token_id: int) -> str:
        """``push(token_id).text`` without building a Delta: for callers that want content
        only (serving loops that read ``finish_reason`` and ``stop_reason`` off the state).

        Refused on a stream with tags, whose reasoning and tool-call channels it would drop.
        """
        tid = token_id
        if self._hot and type(tid) is int and 0 <= tid < self._size:
            # Content only, nothing skipped, stream live. An idle decoder's text is one
            # index away.
            dec = self._dec
            if not dec.idle or (text := dec.quick[tid]) is None:
                if self._vocab[tid] is None:  # type: ignore[index]
                    return self.push(tid).text  # a hole in the vocabulary: the checked path raises
                text = dec.feed_one(tid)
            self.token_ids.append(tid)
            first = self._first  # None: no stop strings
            if first is not None:
                held = self._held_may_stop and not dec.idle and dec.holds()
                if not held and (step := self._steps[self._ac_state].get(text)) is not None:
                    # This text was scanned from this node before, with no match: the
                    # same text leaves and the same text is held (Matcher.steps).
                    text, self._ac_state, self._pending = step
                    if text and self._keep_log:
                        self._log(_CONTENT, text)
                elif held or self._ac_state or (text and first(text) is not None):
                    # A stop is partly matched, may start in this text, or may complete in
                    # what the decoder holds: the boundary scan decides.
                    text = self._scan_text(text, held)
                elif text and self._keep_log:
                    self._log(_CONTENT, text)
            elif text and self._keep_log:
                self._log(_CONTENT, text)
            self._settled()
            return text
        if self._tags is not None:
            raise ValueError("push_text() returns content only; a stream with tags needs push()")
        if type(tid) is int and 0 <= tid < self._size and not self._done:
            if (
                self._vocab is not None
                and self._vocab[tid] is not None
                and not self._skip_chars
                and tid not in self._stop_ids
            ):
                return self._push_one(tid, True)  # type: ignore[return-value]
        return self.push(tid).text

    def _scan_text(self, text: str, held: bool) -> str:
        """push_text's boundary step when a stop may be involved (content is the only
        channel). The common outcome, no stop completes in the text nor in what the decoder
        holds rendered as final (the provisional check of ``_take_settled``), is ``_take``'s
        no-match branch without building an ``_Out``; any other goes through ``_settle``,
        which scans again from the same state and decides."""
        ac = self._ac
        start = self._ac_state
        state, hit = ac.scan(start, text)
        if hit is None:
            if not held or self._held_hit(state) is None:
                scanned = text
                text = self._advance(state, text)
                if not held:  # the outcome depends on the text and the start node only
                    memo = self._steps[start]
                    if len(memo) >= ac.STEP_MEMO_LIMIT:
                        memo.clear()
                    memo[scanned] = (text, state, self._pending)
                if text:
                    self._log(_CONTENT, text)
                return text
        out = _Out()
        self._settle(text, out)
        return "".join(out.text)

    def _push_one(self, tid: int, as_text: bool = False) -> Delta | str:
        """``push`` of one checked id that is no stop token or id tag: ``_step`` without
        allocations in the common case (content, nothing held, no pattern can start)."""
        self.token_ids.append(tid)
        text = self._dec.feed_one(tid)
        ac = self._ac
        if (
            text
            and self._mode == _CONTENT
            and self._ac_state == 0
            and (ac is None or ac.first.search(text) is None)
            and (self._max_tokens is None or len(self.token_ids) < self._max_tokens)
            and not (self._has_stops[_CONTENT] and self._dec.holds())
        ):
            if self._keep_log:
                self._log_text.append(text)
                self._log_kind.append(_CONTENT)
            self._settled()
            return text if as_text else _text_delta(text)
        out = _Out()
        self._settle(text, out)
        if as_text:
            return "".join(out.text)
        if self.finish_reason is None and not out.text and not out.reasoning and not out.tools:
            return _ONE_EMPTY
        return self._delta(out, 1)

    def _settle(self, text: str, out: _Out) -> None:
        """The rest of one checked id's push after its decode: the boundary, the
        provisional stop, max_tokens, closing on a finish."""
        self._take_settled(text, out)
        if self.finish_reason is None and self._max_tokens is not None and len(self.token_ids) >= self._max_tokens:
            self.finish_reason = "length"
        if self.finish_reason is not None:
            self._close(out)
        self._settled()

    def _step(self, tid: int, out: _Out) -> None:
        """One checked id: count it; a stop token ends the stream (its text only with
        include_stop_str_in_output); otherwise its settled text goes through the boundary
        scan; then the provisional stop check; then max_tokens."""
        self.token_ids.append(tid)
        stop_token = tid in self._stop_ids and len(self.token_ids) > self._min_tokens
        if not stop_token or self._include_stop:
            if tid in self._id_tags:
                self._id_tag(self._id_tags[tid], out)
            self._take_settled(self._unskip(self._dec.feed_one(tid)), out)
        if self.finish_reason is not None:
            return
        if stop_token:
            self.finish_reason = "stop"
            self.stop_reason = None if tid in self._eos_ids else tid
        elif self._max_tokens is not None and len(self.token_ids) >= self._max_tokens:
            self.finish_reason = "length"

    def _take_settled(self, text: str, out: _Out) -> None:
        """One token's settled text through the boundary, then the provisional stop check."""
        if text:
            self._take(text, out)
        if self.finish_reason is None and self._has_stops[self._mode] and self._dec.holds():
            self._provisional_stop(out)

    def _provisional_stop(self, out: _Out) -> None:
        """Stop where ``decode(prompt + out[:k])`` has the stop, as vLLM's rule says.

        Why: a SentencePiece byte run (or a tail of bytes) is held because a *later* token
        could change it; but if the stream ends here, the held text is final, and when that
        final text completes a stop, ending here is exactly right. So scan the held text as
        if final; on a stop, flush the decoder and let the scan cut the stream.
        """
        if self._ac is None:
            return
        hit = self._held_hit(self._ac_state)
        if hit is None or self._kinds[self._mode][hit[0]][0] != "stop" or len(self.token_ids) <= self._min_tokens:
            return
        self._take(self._unskip(self._dec.flush()), out)

    def _held_hit(self, state: int) -> tuple[int, int] | None:
        """The match ``ac.scan(state, held)`` finds, where ``held`` is what the decoder
        holds rendered as final (less the prompt's skipped characters), or None.

        Why not that scan itself: it runs after every id while the decoder holds text, and
        a SentencePiece byte run can grow without bound, so it would cost O(run) per id
        (O(N^2) for a long run of byte pieces). Instead, while the held text only grows,
        scan only what it added, from where the last scan ended (``_prov``); while it is all
        U+FFFD (a run ending inside a character), only a stop with U+FFFD can match.

        A stop that ends in the characters that showed by token ``min_tokens`` (``_early``)
        completed too early: the scan goes on past it, here and later (as ``_take`` does).
        """
        dec = self._dec
        ac = self._ac
        prov = self._prov
        since = prov[2] if prov is not None and prov[0] is ac and prov[1] == state else None
        growth = dec.final_growth(since)
        if growth is not None:
            added, mark = growth
            if since is not None and since[0] == mark[0]:
                at, base = prov[3], prov[4]  # type: ignore[index]
            else:  # the whole held text: less what the prompt's held tail stands for
                at, base = state, 0
                added = added[self._skip_chars :]
            if len(self.token_ids) <= self._min_tokens:  # all of it shows by token min_tokens
                self._early = self._early + added if base else added
            early, rest = len(self._early) - base, added
            while True:
                at, hit = ac.scan(at, rest)
                if hit is None or hit[1] > early:
                    break
                early -= hit[1]  # too early: go on past it
                rest = rest[hit[1] :]
            if hit is None:  # never past a match: a later call must find it again
                self._prov = (ac, state, mark, at, base + len(added))
            return hit
        if not self._fffd_stops and dec.renders_replacement():
            return None
        held = dec.peek_final()[self._skip_chars :]
        return ac.scan(state, held)[1] if held else None

    def _unskip(self, text: str) -> str:
        """Drop what the prompt's held tail already stands for (see from_tokenizer)."""
        if self._skip_chars and text:
            cut = min(self._skip_chars, len(text))
            self._skip_chars -= cut
            if not self._skip_chars:
                self._hot = self._hot_static and not self._done
            return text[cut:]
        return text

    # --- internals: the boundary --------------------------------------------------------

    def _settled(self) -> None:
        """After a token: once the decoder holds nothing, no held text showed by
        ``min_tokens`` any more (``_early``; released on a path with no match)."""
        if self._early and not self._dec.holds():
            self._early = ""

    def _at_rest(self) -> bool:
        """For the serving layer (``ServingStream``): live, in content, no log or tags, on a
        table, the decoder holding nothing, no stop partly matched, nothing of the prompt
        left to skip. At rest, an id whose quick text holds no first character of a stop,
        that is no stop id and does not reach ``max_tokens``, is appended and its text
        released, and nothing else changes: what ``push_text`` would do."""
        return (
            not (self._done or self._skip_chars or self._ac_state or self._keep_log or self._tags is not None)
            and self._vocab is not None
            and self._dec.idle
        )

    def _check_range(self, tid: int, position: int) -> None:
        vocab = self._vocab
        if not 0 <= tid < self._size or (vocab is not None and vocab[tid] is None):
            raise TokenIdError(tid, position, self._size, self.request_id)

    def _delta(self, out: _Out, consumed: int) -> Delta:
        return Delta(
            "".join(out.text),
            "".join(out.reasoning),
            tuple(out.tools),
            self.finish_reason,
            self.stop_reason,
            consumed,
        )

    def _log(self, kind: int, text: str) -> None:
        if self._keep_log:
            self._log_kind.append(kind)
            self._log_text.append(text)

    def _emit(self, text: str, out: _Out) -> None:
        """Send settled, unheld text to the current channel."""
        if not text:
            return
        mode = self._mode
        self._log(mode, text)
        if mode == _CONTENT:
            out.text.append(text)
        elif mode == _REASONING:
            if self._reasoning_mode == "separate":
                out.reasoning.append(text)
            elif self._reasoning_mode == "inline":
                out.text.append(text)
        else:
            self._tool_body.append(text)
            out.tools.append(ToolCall(self._tool_index, text))

    def _tag_text(self, tag: str, out: _Out) -> None:
        self._log(_TAG, tag)
        if self._reasoning_mode == "inline" and tag and (
            self._tags is not None and tag in (self._tags.reasoning_open, self._tags.reasoning_close)
        ):
            out.text.append(tag)

    def _take(self, text: str, out: _Out) -> None:
        """Scan new settled text; emit up to the safe boundary; act on complete matches.

        A stop is too early while the count is at most ``min_tokens``, and also where it
        ends in held text that showed by then (``_early``), as far as the text released now
        agrees with it (a byte run that turned invalid is released as U+FFFD instead)."""
        early = 0
        if self._early:
            # Held text is released from its head: early as far as it agrees.
            early = len(os.path.commonprefix((self._early, text)))
            self._early = ""
        while text:
            ac = self._ac
            if ac is None:
                self._emit(text, out)
                return
            state, hit = ac.scan(self._ac_state, text)
            if hit is None:
                self._emit(self._advance(state, text), out)
                return
            index, end = hit
            kind, pattern = self._kinds[self._mode][index]
            rest = text[end:]
            if kind == "stop" and (len(self.token_ids) <= self._min_tokens or end <= early):
                # Too early to stop: keep scanning from here as if nothing matched.
                self._emit(self._advance(state, text[:end]), out)
                early -= end
                text = rest
                continue
            buf = self._pending + text[:end]
            self._pending = ""
            self._ac_state = 0
            if kind == "stop":
                if self._include_stop:
                    # Kept stops do not hold, so part of the stop may have left already:
                    # everything up to its end leaves now.
                    self._emit(buf, out)
                    self._log(_STOP, "")
                else:
                    self._emit(buf[: len(buf) - len(pattern)], out)
                    self._log(_STOP, pattern)
                self.finish_reason = "stop"
                self.stop_reason = pattern
                return
            self._emit(buf[: len(buf) - len(pattern)], out)
            self._switch(kind, pattern, out)
            text = rest

    def _advance(self, state: int, text: str) -> str:
        """The automaton is at ``state`` after ``text`` with no match: hold the longest
        unemitted suffix that may still become a pattern; return what leaves."""
        self._ac_state = state
        buf = self._pending + text
        cut = len(buf) - self._ac.hold[state]
        self._pending = buf[cut:]
        return buf[:cut]

    def _switch(self, kind: str, pattern: str, out: _Out) -> None:
        if kind == "r_open":
            self._tag_text(pattern, out)
            self._set_mode(_REASONING)
        elif kind == "r_close":
            self._tag_text(pattern, out)  # a stray close in content is dropped from content
            self._set_mode(_CONTENT)
        elif kind == "t_open":
            self._tag_text(pattern, out)
            self._tool_index += 1
            self._tool_body = []
            self._set_mode(_TOOL)
        elif kind == "t_close":
            self._tag_text(pattern, out)
            self._end_tool(out)
            self._set_mode(_CONTENT)

    def _set_mode(self, mode: int) -> None:
        self._mode = mode
        self._ac = self._matchers[mode]
        self._ac_state = 0

    def _id_tag(self, kind_pattern: tuple[str, str], out: _Out) -> None:
        """A tag token that skip_special_tokens removes from the text: act on its id."""
        kind, _ = kind_pattern
        if self._mode != _CONTENT and kind == "t_open":
            return
        # Text held so far cannot join with a tag that has no text: release it.
        self._emit(self._pending, out)
        self._pending = ""
        self._switch(kind, "", out)

    def _end_tool(self, out: _Out, *, unterminated: bool = False) -> None:
        assert self._tags is not None
        body = "".join(self._tool_body)
        self._tool_body = []
        first = self._tool_index
        if unterminated and self._tags.tool_close is not None:
            out.tools.append(
                ToolCall(first, complete=True, error=f"stream ended before {self._tags.tool_close}")
            )
            return
        try:
            calls = parse_tool_body(body.strip(), self._tags.tool_format)
        except (ValueError, TypeError) as exc:
            out.tools.append(ToolCall(first, complete=True, error=f"malformed tool call: {exc}"))
            return
        for k, (name, args) in enumerate(calls):
            out.tools.append(ToolCall(first + k, name=name, arguments=args, complete=True))
        self._tool_index = first + len(calls) - 1

    def _close(self, out: _Out) -> None:
        """Flush the decoder and everything held; finish an open tool call."""
        if not (self.finish_reason == "stop" and isinstance(self.stop_reason, str)):
            text = self._dec.flush()
            text = self._unskip(text)
            if text:
                self._take(text, out)
        # A stop string cut the stream: what followed it is dropped. Otherwise the held
        # text (a partial stop or tag that never completed) is released as it stands.
        if not (self.finish_reason == "stop" and isinstance(self.stop_reason, str)):
            self._emit(self._pending, out)
            self._pending = ""
        if self._mode == _TOOL:
            self._end_tool(out, unterminated=True)
            self._set_mode(_CONTENT)
        self._done = True
        self._hot = False


_NO_IDS: frozenset[int] = frozenset()
_NO_ID_TAGS: dict[int, tuple[str, str]] = {}  # shared: read, never written
_NO_LOG: tuple[()] = ()  # shared: stands for a list nothing is ever appended to


def forget() -> None:
    """Drop what streams have learnt: the cached stop automata, and with them their scan
    memos (``Matcher.steps``, the one table filled in as streams run). Running streams go
    on exactly with the automaton they have; the next ones build theirs again, cold."""
    _channels.cache_clear()
    Matcher.build.cache_clear()


@functools.lru_cache(maxsize=256)
def _channels(
    stops: tuple[str, ...], tags: TagSet | None, stop_in_reasoning: bool, include_stop: bool
) -> tuple[tuple[tuple[tuple[str, str], ...], ...], tuple[Matcher | None, ...], tuple[bool, ...]]:
    """Per channel: the patterns live in it as (kind, pattern), its automaton, and whether
    a stop is among them. The same for every stream with the same options."""
    kinds: tuple[list[tuple[str, str]], ...] = ([], [], [])
    for s in stops:
        kinds[_CONTENT].append(("stop", s))
        if stop_in_reasoning:
            kinds[_REASONING].append(("stop", s))
    if tags is not None:
        if tags.reasoning_open and tags.reasoning_close:
            kinds[_CONTENT].append(("r_open", tags.reasoning_open))
            kinds[_CONTENT].append(("r_close", tags.reasoning_close))
            kinds[_REASONING].append(("r_close", tags.reasoning_close))
        if tags.tool_open:
            kinds[_CONTENT].append(("t_open", tags.tool_open))
            if tags.tool_close:
                kinds[_TOOL].append(("t_close", tags.tool_close))
    # A stop kept in the output need not be held: its characters leave either way.
    matchers = tuple(
        Matcher.build(tuple(p for _, p in k), tuple(not (kind == "stop" and include_stop) for kind, _ in k)) if k else None
        for k in kinds
    )
    return tuple(tuple(k) for k in kinds), matchers, tuple(any(kind == "stop" for kind, _ in k) for k in kinds)


def _vocab_size(tokenizer: Any) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        size = getattr(tokenizer, "vocab_size", None)
        if isinstance(size, int):
            return size
    return 1 << 62


def _takes_kwarg(tokenizer: Any, name: str) -> bool:
    import inspect

    for fn in (getattr(tokenizer, "_decode", None), getattr(tokenizer, "decode", None)):
        if fn is None:
            continue
        try:
            if name in inspect.signature(fn).parameters:
                return True
        except (TypeError, ValueError):
            continue
    return False


def _id_tags(table: TokenTable, tags: TagSet) -> dict[int, tuple[str, str]]:
    """Tag tokens whose text the decode drops (special tokens under skip_special_tokens)."""
    by_text = {content: i for i, content, special in table.added_tokens if special}
    found: dict[int, tuple[str, str]] = {}
    for kind, text in (
        ("r_open", tags.reasoning_open),
        ("r_close", tags.reasoning_close),
        ("t_open", tags.tool_open),
        ("t_close", tags.tool_close),
    ):
        if text and text in by_text:
            found[by_text[text]] = (kind, text)
    return found
