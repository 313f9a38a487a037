"""``DetokenizerState``: one request's stream, from token ids to channels of settled text.

The reference layer: every option and every rule. Each rule lives in one place:

========================== ================================================================
rule                       where
========================== ================================================================
ids are ints in the vocab  ``_check`` / ``_checked_prompt`` here (typed errors, id + position)
UTF-8 holding, byte runs   the family decoders (``_decoders.py``)
the prompt's held tail     ``_unskip`` here (``decode(prompt)`` renders it as U+FFFD)
stop strings, tags         the boundary (``_boundary.py``), one automaton per channel
provisional stops          ``Boundary._held_hit`` (held text rendered as final)
``min_tokens``             ``Boundary._take`` and ``Boundary._scan_added``; ``_step`` for ids
stop ids, EOS              ``_step`` here
``max_tokens``             ``_step`` and ``_settle`` here; ``_limit`` on the shortcut
reasoning, tool calls      the channels (``_channels.py``)
options                    ``StreamConfig`` (``_options.py``), frozen, shared per options
========================== ================================================================

One checked id goes: count it (1), a stop id ends the stream (2), otherwise its settled
text goes through the boundary (3), then the provisional stop check (4), then
``max_tokens`` (5) (``_step``). ``push_text`` and ``push`` of one plain id take the same
steps without building an ``Out`` when nothing at the boundary can be touched.

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

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._boundary import Boundary, HeldScan
from ._channels import Router
from ._delta import (
    CHANNEL_NAMES,
    CONTENT,
    ENDED_EMPTY,
    ONE_EMPTY,
    REASONING,
    TAG,
    TEXT_DELTAS,
    Delta,
    FinishReason,
    Out,
    Reasoning,
    Segment,
    Tools,
    text_delta,
)
from ._errors import StreamFinishedError
from ._opening import Opened, checked_push
from ._options import Pattern, StreamConfig, forget, id_tags, open_with_config
from ._tags import TagSet

__all__ = ["Delta", "DetokenizerState", "Segment", "forget"]

_NO_ID_TAGS: Mapping[int, Pattern] = {}  # shared: read, never written
_NO_LOG: Any = ()  # shared: stands for a list nothing is ever appended to


class DetokenizerState(Router, Boundary):
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

    # Slot order is memory order: what push_text's common case reads comes first.
    __slots__ = (
        "token_ids",
        "_size",
        "_hot",  # push_text may take its shortcut (a table, no tags, live, nothing to skip)
        "_stop_ids",  # _cfg.stop_ids, read per id
        "_limit",  # max_tokens - 1 (sys.maxsize without): the shortcut takes no id past it
        "_keep_log",
        "finish_reason",
        "stop_reason",
        "_dec",  # the family decoder: settled text per id
        "_ac_state",  # the automaton's node in the current channel
        "_first",  # finds a stop's first character in a text (None: no stops)
        "_held_may_stop",  # held text can complete a stop (see from_tokenizer)
        "_pending",  # settled text held because a stop or tag may be forming
        "_skip_chars",  # characters of the prompt's held tail still to skip (_unskip)
        "_done",  # a stop condition or finish() ended the stream
        "_ended",  # finish() was called
        "_held_scan",  # where the last scan of held text ended (Boundary._held_hit)
        "_early",  # held text that showed by token min_tokens (Boundary._take)
        "_log_text",
        "_log_kind",
        "path",
        "why",
        "request_id",
        "_vocab",
        "_cfg",
        "_min_tokens",  # the request's limits (per request, so not in the shared _cfg)
        "_max_tokens",
        "_id_tags",
        "_mode",  # the channel text goes to: CONTENT, REASONING or TOOL
        "_ac",  # the current channel's automaton
        "_tool_index",
        "_tool_body",
        "_tool_bare",  # the open body began without the tool tag (TagSet.tool_bare)
        "_at_start",  # no text of the reply yet, and a bare body may open only there
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
        tools: Tools = "separate",
        request_id: str | None = None,
        keep_log: bool = True,
    ) -> DetokenizerState:
        """Start a stream on ``tokenizer`` (transformers, ``tokenizers.Tokenizer``, a
        :class:`TokenTable`, or anything with ``decode(ids)``).

        ``eos_token_ids`` defaults to the tokenizer's own EOS ids; pass ``()`` to leave EOS
        to the caller. ``spaces_between_special_tokens`` reaches only tokenizers whose decode
        takes it (slow SentencePiece tokenizers); tokenizers-backed decodes ignore it.
        ``keep_log=False`` keeps no lossless log (``log()`` then refuses): for callers that
        keep the text themselves and want neither the memory nor the per-token append.
        ``tools="inline"`` leaves tool-call tags and bodies in ``Delta.text`` (no
        ``ToolCall`` is built) while stops still skip the bodies: for a stream whose text a
        tool parser downstream reads.
        """
        if reasoning not in ("separate", "strip", "inline"):
            raise ValueError(f"reasoning must be 'separate', 'strip' or 'inline', not {reasoning!r}")
        if tools not in ("separate", "inline"):
            raise ValueError(f"tools must be 'separate' or 'inline', not {tools!r}")
        if isinstance(tags, str):
            tags = TagSet.preset(tags)
        limits = (min_tokens, max_tokens)
        opened, cfg = open_with_config(
            tokenizer, prompt_ids, skip_special_tokens, spaces_between_special_tokens, stop, stop_token_ids,
            eos_token_ids, include_stop_str_in_output, limits, request_id, (tags, reasoning, stop_in_reasoning, tools),
        )
        return cls._from_opened(opened, cfg, request_id, keep_log, skip_special_tokens, limits)

    @classmethod
    def _from_opened(
        cls, opened: Opened, cfg: StreamConfig, request_id: str | None, keep_log: bool, skip: bool, limits: tuple[int, int | None]
    ) -> DetokenizerState:
        """A stream on the decoder and configuration ``open_with_config`` gave: what
        :meth:`from_tokenizer` builds once it has checked the options. The decoder is used as
        it stands (``ServingStream`` builds its reference only when an id needs it)."""
        self = cls.__new__(cls)
        self._start(opened, cfg, request_id, keep_log, skip, limits)
        return self

    def _start(
        self, opened: Opened, cfg: StreamConfig, request_id: str | None, keep_log: bool, skip: bool, limits: tuple[int, int | None]
    ) -> None:
        """Fill the slots: the decoder's, the options', and the running state's."""
        self._min_tokens, self._max_tokens = limits
        self._limit = sys.maxsize if self._max_tokens is None else self._max_tokens - 1
        self.request_id = request_id
        self.path = opened.decoder.path
        self.why = opened.why
        self._dec = opened.decoder
        self._vocab = opened.vocab
        self._size = opened.size
        self._skip_chars = opened.skip_chars
        self._cfg = cfg
        self._stop_ids = cfg.stop_ids
        self.token_ids: list[int] = []
        self._done = self._ended = False
        # Plain slots, read-only by contract: a serving loop reads them after every push
        # (an attribute read, where a property would cost a call).
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None
        tags, table = cfg.tags, opened.table
        self._id_tags = id_tags(table, tags) if tags is not None and table is not None and skip else _NO_ID_TAGS
        # Per-stream containers only where they are used: a request's objects spread the
        # serving loop's own, so fewer per stream is a cheaper step (docs/benchmarks.md).
        self._keep_log = keep_log
        self._log_text: list[str] = [] if keep_log else _NO_LOG
        self._log_kind: list[int] = [] if keep_log else _NO_LOG
        self._tool_index = -1
        self._tool_body: list[str] = [] if tags is not None else _NO_LOG
        self._tool_bare, self._at_start = False, tags is not None and tags.bare_at_start and tags.tool_bare is not None
        self._mode = CONTENT
        if opened.starts_in(tags):
            # A template that ends inside an open reasoning block (``<think>\n``) starts the
            # stream in reasoning; the open tag lives in the prompt.
            self._mode = REASONING
            self._log(TAG, "")
        self._ac = cfg.matchers[self._mode]
        self._ac_state, self._pending = 0, ""
        content = cfg.matchers[CONTENT]
        self._first = content.find_first if content is not None else None
        self._held_scan: HeldScan | None = None
        self._early = ""
        # Text the decoder holds can complete a stop only if, rendered as final, it can
        # contain a stop's characters: never when it is all U+FFFD and no stop has one.
        self._held_may_stop = cfg.has_stops[CONTENT] and self._held_may_stop_now()
        self._hot = self._may_be_hot()

    def _may_be_hot(self) -> bool:
        """The shortcut applies: a table, content only, live, nothing of the prompt left to
        skip. (Stop ids and ``max_tokens`` are checked per id: ``_shortcut``.)"""
        return self._vocab is not None and self._cfg.tags is None and not (self._skip_chars or self._done)

    # --- the verbs ---------------------------------------------------------------------

    def push(self, ids: int | Sequence[int]) -> Delta:
        """Add one id or several (a speculative step); return what is now settled."""
        if self._hot and type(ids) is int:
            # Content only: push_text's text is all of this push's Delta.
            text = self.push_text(ids)
            if self.finish_reason is None:
                return TEXT_DELTAS.get(text) or text_delta(text)
            return Delta(text, finish_reason=self.finish_reason, stop_reason=self.stop_reason, consumed=1)
        return self._push_checked(ids)

    def _push_checked(self, ids: int | Sequence[int]) -> Delta:
        """``push`` off ``push_text``'s shortcut: several ids, a stream with tags, or an id
        the shortcut does not take."""
        if self._done:
            raise StreamFinishedError(len(self.token_ids), self.request_id, self.finish_reason or "finish() was called")
        vocab = self._vocab
        if (
            type(ids) is int
            and vocab is not None
            and 0 <= ids < self._size
            and vocab[ids] is not None
            and not self._skip_chars
            and ids not in self._id_tags
            and ids not in self._stop_ids
        ):
            return self._push_one(ids)
        checked = checked_push(ids, len(self.token_ids), self._vocab, self._size, self.request_id)
        out, consumed = Out(), 0
        for tid in checked:
            consumed += 1
            self._step(tid, out)
            if self.finish_reason is not None:
                self._close(out)
                break
        self._settled()
        if len(checked) == 1 and self.finish_reason is None and out.empty():
            return ONE_EMPTY
        return self._delta(out, consumed)

    def push_text(self, token_id: int) -> str:
        """``push(token_id).text`` without building a Delta: for callers that want content
        only (serving loops that read ``finish_reason`` and ``stop_reason`` off the state).

        Refused on a stream with tags, whose reasoning and tool-call channels it would drop.

        The shortcut, every token's path: an int id in the table's range that is no stop id
        and does not reach ``max_tokens``, on a stream that is live, content only and has
        nothing of the prompt left to skip (``_hot``). An idle decoder's text is then one
        index away; with stops, the boundary in ``_text_boundary``.
        """
        tid = token_id
        if not (self._hot and type(tid) is int and 0 <= tid < self._size and tid not in self._stop_ids and len(self.token_ids) < self._limit):
            if self._cfg.tags is not None:
                raise ValueError("push_text() returns content only; a stream with tags needs push()")
            return self._push_checked(tid).text
        dec = self._dec
        if not dec.idle or (text := dec.quick[tid]) is None:
            if self._vocab[tid] is None:  # type: ignore[index]
                return self._push_checked(tid).text  # a hole in the vocabulary: it raises
            text = dec.feed_one(tid)
        self.token_ids.append(tid)
        if self._first is not None:
            text = self._text_boundary(text)
        elif text and self._keep_log:
            self._log_kind.append(CONTENT)  # _log, inlined: this is every token's path
            self._log_text.append(text)
        if self._early:
            self._settled()
        return text

    def finish(self, drop_incomplete: bool = False) -> Delta:
        """End the stream: release everything held, rendered as the final decode renders it.

        ``drop_incomplete``: leave out a last character no token completed, where the decode
        renders U+FFFD (``max_tokens`` or an abort cut it): what a server's stock
        detokenizer shows, since it never releases a trailing U+FFFD. The text is then the
        decode of the output without those dangling bytes."""
        if self._ended:
            raise StreamFinishedError(len(self.token_ids), self.request_id, "finish() was called")
        self._ended = True
        if self._boundary_at_rest() and self._dec.idle and not self._pending:  # nothing held to release
            self._done, self._hot = True, False
            return ENDED_EMPTY
        out = Out()
        if not self._done:  # a stop already closed the stream: nothing more to release
            self._close(out, drop_incomplete)
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
        merged: list[tuple[int, list[str]]] = []
        for kind, text in zip(self._log_kind, self._log_text):
            if merged and merged[-1][0] == kind and kind != TAG:
                merged[-1][1].append(text)
            else:
                merged.append((kind, [text]))
        segments = (Segment(CHANNEL_NAMES[kind], "".join(parts)) for kind, parts in merged)
        return [seg for seg in segments if seg.text]

    # --- one id ----------------------------------------------------------------------------

    def _step(self, tid: int, out: Out) -> None:
        """One checked id, the reference path: steps (1)-(5) of the module docstring."""
        self.token_ids.append(tid)  # (1)
        cfg = self._cfg
        stop_token = tid in self._stop_ids and len(self.token_ids) > self._min_tokens  # (2)
        if not stop_token or cfg.include_stop:
            if tid in self._id_tags:
                self._id_tag(self._id_tags[tid], out)
            self._take_settled(self._unskip(self._dec.feed_one(tid)), out)  # (3), (4)
        if self.finish_reason is not None:
            return
        if stop_token:
            self.finish_reason = "stop"
            self.stop_reason = None if tid in cfg.eos_ids else tid
        elif self._max_tokens is not None and len(self.token_ids) >= self._max_tokens:  # (5)
            self.finish_reason = "length"

    def _push_one(self, tid: int) -> Delta:
        """``_step`` of one checked id that is no stop id or id tag, with nothing of the
        prompt to skip, without an ``Out`` when nothing at the boundary acts on its text."""
        self.token_ids.append(tid)
        text = self._dec.feed_one(tid)
        limit = self._max_tokens
        released = self._passed(text) if limit is None or len(self.token_ids) < limit else None
        if released is not None:
            self._settled()
            if not released:  # most pieces of a split character
                return ONE_EMPTY
            return self._emit_one(released)
        self._settle(text, out := Out())
        if self.finish_reason is None and out.empty():
            return ONE_EMPTY
        return self._delta(out, 1)

    def _settle(self, text: str, out: Out) -> None:
        """Steps (3)-(5) for an id ``_push_one`` took whose text ``_passed`` did not let
        leave (or at the length limit), and closing on a finish."""
        self._scan_settled(text, out)
        limit = self._max_tokens
        if self.finish_reason is None and limit is not None and len(self.token_ids) >= limit:
            self.finish_reason = "length"
        if self.finish_reason is not None:
            self._close(out)
        self._settled()

    # --- helpers ---------------------------------------------------------------------------

    def _unskip(self, text: str) -> str:
        """Drop what the prompt's held tail already stands for: ``decode(prompt)`` renders
        that tail as final (U+FFFD), so the output starts that many characters in."""
        if self._skip_chars and text:
            cut = min(self._skip_chars, len(text))
            self._skip_chars -= cut
            if not self._skip_chars:
                self._hot = self._may_be_hot()
            return text[cut:]
        return text

    def _close(self, out: Out, drop_incomplete: bool = False) -> None:
        """End the stream: flush the decoder and what is held, unless a stop string cut it
        (what followed the stop is dropped); report an open tool call unterminated."""
        if not self._cut_by_stop() and (text := self._unskip(self._dec.flush(drop_incomplete))):
            self._take(text, out)  # may still complete a stop
        if not self._cut_by_stop():
            self._release_held(out)
        self._close_channels(out)
        self._done = True
        self._hot = False

    def _cut_by_stop(self) -> bool:
        return self.finish_reason == "stop" and isinstance(self.stop_reason, str)

    def _delta(self, out: Out, consumed: int) -> Delta:
        text, reasoning, tools = "".join(out.text), "".join(out.reasoning), tuple(out.tools)
        return Delta(text, reasoning, tools, self.finish_reason, self.stop_reason, consumed)

    def _log(self, kind: int, text: str) -> None:
        if self._keep_log:
            self._log_kind.append(kind)
            self._log_text.append(text)

