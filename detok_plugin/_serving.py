"""``ServingStream``: one request's content stream, as a serving loop (vLLM, SGLang, TGI) needs it.

What a server's step does per request is content only: stop strings, stop token ids, EOS,
``min_tokens`` and ``max_tokens``; no tags, no channels, no log. This class gives exactly
:class:`DetokenizerState`'s content for those options (it wraps one, the reference) and
takes the common token itself:

    the stream is *at rest* (the decoder holds nothing, no stop is partly matched, nothing
    of the prompt is still skipped) and the id's text is known alone (the table's quick
    texts), holds no first character of a stop, is no stop id and does not reach
    ``max_tokens``: then the reference would append the id, release that text and change
    nothing else, so this class does exactly that, without the call.

While the *boundary* is live (the decoder may hold the bytes of an unfinished character, a stop
may be partly matched), an id in the vocabulary that is no stop id and does not reach
``max_tokens`` is fed to the reference's decoder here: its settled text leaves at once when no stop
is partly matched, the text holds no stop's first character and what the decoder holds cannot
complete one; else the reference's boundary takes it, and only what it holds and its node are read
back while it stays live. Held bytes complete a stop only as characters: a byte-level tail never,
a SentencePiece byte run once it ends on a whole character, either when a stop has U+FFFD (then
every id goes to the reference). This is every split character's path.

Every other id goes to the reference, after which the stream reads whether it is at rest again.
The reference's decoder and boundary are the only state: this class keeps none of its own beyond
the shared tables, so it never has to be brought back in step. The reference is built when an id
first needs it (at once on the generic path or with a prompt's held tail to skip), given the
decoder and the ids: a request whose ids all leave at rest never builds it, nor does ``finish``
with nothing held. Nothing is learnt: a stop set never seen before costs what one seen a
thousand times costs. The verbs are ``push_text``, ``push`` and ``finish``, as on the reference;
for a scheduler that only watches for stops, ``follow`` (no text returned) and ``watch`` (its
per-step check of one request, which takes ``follow``'s common steps itself: ``_watch``).

>>> from detok_plugin import ServingStream, TokenTable
>>> table = TokenTable("byte_level", (b"\\xf0\\x9f", b"\\xab", b"\\xa8", b"Hi", b" ###"), frozenset())
>>> s = ServingStream.from_tokenizer(table, stop=["###"])
>>> [s.push_text(i) for i in (3, 0, 1, 2, 4)], s.finish_reason, s.stop_reason
(['Hi', '', '', '🫨', ' '], 'stop', '###')
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ._boundary import held_may_stop
from ._decoders import StreamDecoder
from ._delta import CONTENT, ENDED_EMPTY, Delta, FinishReason
from ._errors import TokenIdError, TokenTypeError
from ._matcher import Step
from ._opening import Opened, as_id
from ._options import StreamConfig, open_with_config
from ._state import DetokenizerState
from ._tables import learn_rest_text
from ._watch import check_for

__all__ = ["ServingStream"]

_UNSEEN: Any = object()  # rest.get's default: an id the at-rest dict has no entry for
_tuple_new = tuple.__new__  # a Delta built as the tuple it is (Delta(...) costs twice that)


class ServingStream:
    """One request's content, for serving loops: ``push_text(id) -> str`` per id,
    ``push(ids) -> Delta`` for several (a speculative step), ``finish() -> Delta``.

    The joined text is :class:`DetokenizerState`'s content for the same options, exactly:
    ``decode(prompt + out)[len(decode(prompt)):]``, cut at a stop as the options say.
    ``finish_reason`` and ``stop_reason`` are attributes to read after each push (vLLM's
    meanings: ``"stop"`` with the stop string or stop token id, None for EOS; ``"length"``),
    and so is ``held``: the settled text held back because a stop may be forming (a
    scheduler holds a request's unsent ids while it is not ``""``).
    ``token_ids`` is the list of output ids taken; do not change it.

    ``on_unknown_id``: given, an id the tokenizer does not know (past its vocabulary, a
    hole in it) is counted and renders as ``""``, as the tokenizer's decode renders it,
    and the callback gets the :class:`TokenIdError` (to log it): for loops where raising
    would fail the server. Without it, such an id raises.
    """

    # What the common token reads comes first.
    __slots__ = (
        "_rest", "token_ids", "_unbounded", "_limit", "_stop_ids", "finish_reason", "stop_reason", "held",
        "_fed_below", "_partial", "_node", "_steps", "_behind", "_runs", "_dec", "_vocab", "_size",
        "_state", "_opening", "_ended", "_known", "_quick", "_first", "_on_unknown"
    )

    token_ids: list[int]
    finish_reason: FinishReason | None
    stop_reason: str | int | None
    held: str
    _rest: dict[int, str | None] | None  # _known while the reference is at rest, else None
    _fed_below: int  # ids below it may be fed to the decoder here: _size while the boundary is live
    _partial: bool  # the boundary is live with a stop partly matched: every fed text goes to it
    _node: int  # the boundary's node (0: no stop partly matched), the reference's once in step (_behind)
    _steps: tuple[dict[str, Step], ...]  # the content matcher's memo of no-match scans, per node
    _behind: bool  # the reference was built and a Matcher.steps move was taken here since
    _runs: bool  # what the decoder holds may complete a stop (state._held_may_stop)
    _dec: StreamDecoder  # the reference's decoder
    _vocab: Sequence[bytes | str | None] | None  # the table's pieces (None: a hole)
    _size: int  # ids the reference takes: 0 <= id < _size
    _known: dict[int, str | None] | None  # the shared rest texts (TokenTable.rest_texts)
    _quick: tuple[str | None, ...]  # the table's quick texts (empty on the generic path)
    _first: Callable[[str], object] | None
    _limit: int  # max_tokens - 1 (sys.maxsize: none)
    _stop_ids: frozenset[int]
    _unbounded: bool  # no stop ids, no max_tokens: an id at rest never ends the stream
    _state: DetokenizerState | None  # the reference, built when an id first needs it
    _opening: tuple[Opened, StreamConfig, str | None, bool, tuple[int, int | None]]  # what builds it
    _ended: bool
    _on_unknown: Callable[[TokenIdError], None] | None

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
        request_id: str | None = None,
        on_unknown_id: Callable[[TokenIdError], None] | None = None,
    ) -> ServingStream:
        """Start a stream; the options mean what they mean on
        :meth:`DetokenizerState.from_tokenizer`."""
        limits = (min_tokens, max_tokens)
        opened, cfg = open_with_config(
            tokenizer, prompt_ids, skip_special_tokens, spaces_between_special_tokens, stop, stop_token_ids,
            eos_token_ids, include_stop_str_in_output, limits, request_id,
        )
        self = cls.__new__(cls)
        self._opening = (opened, cfg, request_id, skip_special_tokens, limits)
        self._state = None
        self.token_ids = []
        self._limit = sys.maxsize if max_tokens is None else max_tokens - 1
        self._stop_ids = stop_ids = cfg.stop_ids
        self._unbounded = not stop_ids and max_tokens is None
        self._on_unknown = on_unknown_id
        self._ended = False  # finish() was called before the reference was built
        self.finish_reason = None
        self.stop_reason = None
        self.held = ""
        dec = self._dec = opened.decoder
        self._vocab = opened.vocab
        self._size = opened.size
        # The texts ids leave with at rest: quick texts with no first character of a stop,
        # learnt per id and shared (TokenTable.rest_texts); None on the generic path.
        content = cfg.matchers[CONTENT]
        table = opened.table
        self._node = 0
        self._behind = False
        if content is None:
            self._steps = ()
            self._first = None
            self._runs = False
            self._known = None if table is None else table.rest_texts(skip_special_tokens, None)
        else:
            self._steps = content.steps
            self._first = content.find_first
            # What the decoder holds may complete a stop (the reference's _held_may_stop, as
            # it starts): a SentencePiece run, whose characters show before it closes, or a
            # stop with U+FFFD.
            self._runs = cfg.has_stops[CONTENT] and held_may_stop(cfg, dec)
            self._known = None if table is None else table.rest_texts(skip_special_tokens, content.first.pattern)
        self._quick = dec.quick  # the table's quick texts (empty on the generic path)
        if table is None or opened.skip_chars:
            self._caught_up()  # the generic path, or a prompt's held tail to skip: the reference now
        else:
            self._at_rest()
        return self

    def _reference(self) -> DetokenizerState:
        """The reference, built the first time an id needs it, and in step. Until then each id
        took a shortcut, where it would have changed only its decoder and ids (these, shared)
        and its boundary's node and held text (``_node``, ``held``: ``Matcher.steps`` moves, no
        stop completed): it is built on both, its boundary put where those moves took it."""
        state = self._state
        if state is None:
            opened, cfg, request_id, skip, limits = self._opening
            state = DetokenizerState._from_opened(opened, cfg, request_id, False, skip, limits)  # noqa: SLF001
            state.token_ids = self.token_ids  # one list: the reference counts it
            self._state = state
            self._behind = self._node != 0
            if self._ended:
                state.finish()  # ended at rest: it releases nothing
        if self._behind:
            state._resume_boundary(self._node, self.held)  # noqa: SLF001
            self._behind = False
        return state

    def push_text(self, token_id: int) -> str:
        """Add one id; return the content it released (``""`` if none)."""
        # Both shortcuts (the module docstring) take only an int id (not a bool, numpy or
        # torch scalar) that is no stop id and does not reach max_tokens (none of either,
        # what a server's detokenizer has: one check).
        if token_id.__class__ is int and (
            self._unbounded or (token_id not in self._stop_ids and len(self.token_ids) < self._limit)
        ):
            rest = self._rest
            if rest is not None:  # at rest: the common token is one lookup
                text: str | None = rest.get(token_id, _UNSEEN)
                if text is _UNSEEN:  # an id not seen at rest yet
                    text = learn_rest_text(rest, self._quick, self._first, token_id)
                if text is not None:
                    self.token_ids.append(token_id)
                    return text
            if 0 <= token_id < self._fed_below and self._vocab[token_id] is not None:  # type: ignore[index]
                return self._fed(token_id)
        return self._by_reference(token_id)

    def follow(self, ids: Sequence[int]) -> bool:
        """Take the ids of ``ids`` (the whole output so far: a list or an ``array``) past the
        ones taken, up to a finish (their text is ``push_text``'s, not returned); return whether
        the stream is then *quiet*: not finished, ``held == ""``. If not, a scheduler reads
        ``finish_reason``, ``stop_reason``, ``held`` and ``len(token_ids)`` (the ids through
        the one that completed a stop). ``ids`` shorter than the ids taken: False, no change."""
        taken = self.token_ids
        n = len(taken)
        if len(ids) == n + 1 and self._unbounded:  # one new id, no stop id, no max_tokens
            token_id = ids[n]
            if token_id.__class__ is int:
                rest = self._rest
                if rest is not None and rest.get(token_id) is not None:  # at rest: one lookup, as in push_text
                    taken.append(token_id)
                    return True
                # The boundary live, the id not one that leaves at rest (a split character's
                # piece, a stop's first character, a partial stop): push_text's second shortcut.
                if 0 <= token_id < self._fed_below and (rest is None or token_id in rest) and self._vocab[token_id] is not None:  # type: ignore[index]
                    self._fed(token_id)
                    return self.finish_reason is None and not self.held
        return self._follow(ids, n)

    def watch(
        self, ids: Sequence[int], otherwise: Callable[[int], Any], holding: Callable[[str], Any]
    ) -> Callable[[int], Any]:
        """A scheduler's per-step stop check over ``ids`` (its whole output, a list or an
        ``array`` grown in place): ``check(appended)`` after appending ``appended`` ids takes
        the common steps, False, and hands every other to ``otherwise(appended)``, which is to
        :meth:`follow` the ids and answer; ``holding(held)``: the stream starts or stops
        holding (``_watch``). Stop ids, ``max_tokens``, other sequences: ``otherwise`` itself."""
        if not self._unbounded or not hasattr(iter(ids), "__setstate__"):
            return otherwise
        return check_for(self, ids, otherwise, holding)

    def _remembered(self, token_id: int) -> Step | None:
        """The boundary's move for an id follow's second shortcut would feed to an idle
        decoder, where its quick text's scan from this node is remembered with no match (as
        in :meth:`_fed`); else None."""
        rest = self._rest
        if (
            token_id.__class__ is int and 0 <= token_id < self._fed_below and (rest is None or token_id in rest)
            and self._vocab[token_id] is not None and self._dec.idle and self._steps  # type: ignore[index]
        ):
            text = self._quick[token_id]
            return None if text is None else self._steps[self._node].get(text)
        return None

    def _follow(self, ids: Sequence[int], n: int) -> bool:
        if len(ids) < n:
            return False
        push = self.push_text
        for i in range(n, len(ids)):
            if self.finish_reason is not None:
                break
            push(ids[i])
        return self.finish_reason is None and not self.held

    def _by_reference(self, token_id: int) -> str:
        """Any id neither shortcut takes: the reference's ``push_text``; at rest again?"""
        state = self._reference()
        try:
            text = state.push_text(token_id)
        except TokenIdError as exc:
            if self._on_unknown is None or state.finished:
                raise
            self._on_unknown(exc)
            self.token_ids.append(token_id)  # counted, rendered as the decode renders it
            return ""
        self._caught_up()
        return text

    def push(self, ids: int | Sequence[int]) -> Delta:
        """Add one id or several; ``Delta.consumed`` says how many were used (fewer when a
        stop completed among them). With ``on_unknown_id``, the ids are taken one by one
        (an unknown one is counted and renders as ``""``); without, a bad id anywhere
        raises before any id of the push is applied."""
        if self._rest is not None and ids.__class__ is list:
            delta = _at_rest(self, ids)
            if delta is not None:
                return delta
        if self._on_unknown is None:
            delta = self._reference().push(ids)
            self._caught_up()
            return delta
        if ids.__class__ is not list:
            if isinstance(ids, int) or hasattr(ids, "__index__"):
                return _one(self, ids)  # type: ignore[arg-type]
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
                raise TokenTypeError(ids, len(self.token_ids), self.request_id)
        return _one_by_one(self, ids)

    def finish(self, drop_incomplete: bool = False) -> Delta:
        """End the stream: release everything held, rendered as the final decode renders
        it (``""`` after a stop string, which cut what followed it). ``drop_incomplete``
        leaves out a last character no token completed (the decode's U+FFFD), as a
        server's stock detokenizer does (see DetokenizerState.finish)."""
        if self._state is None and self._dec.idle and not self._node:  # at rest, nothing held: nothing to build
            if self._ended:
                return self._reference().finish()  # raises, as the reference's second finish
            self._ended = True
            self._rest = None
            self._fed_below = 0
            return ENDED_EMPTY
        delta = self._reference().finish(drop_incomplete)
        self._caught_up()
        return delta

    @property
    def finished(self) -> bool:
        """True after a stop condition or finish(): no further push is accepted."""
        return self._ended if self._state is None else self._state.finished

    @property
    def path(self) -> str:
        """The decoder's path: ``byte_level``, ``sentencepiece`` or ``generic``."""
        return self._dec.path

    @property
    def why(self) -> str:
        return self._opening[0].why

    @property
    def request_id(self) -> str | None:
        return self._opening[2]

    def _fed(self, token_id: int) -> str:
        """The boundary live (the module docstring): the id fed here, its text taken as the reference's would be."""
        dec = self._dec
        if dec.idle and (text := self._quick[token_id]) is not None:
            # Fed to an idle decoder, an id with a quick text leaves it idle: a scan of that
            # text from this node remembered with no match is the boundary's move (_remembered's too).
            step = self._steps[self._node].get(text) if self._steps else None
            if step is not None:
                self.token_ids.append(token_id)
                return self._moved(step)
        text = dec.feed_one(token_id)
        self.token_ids.append(token_id)
        runs = self._runs and self._held_shows()
        if self._partial or runs or (text and self._first is not None and self._first(text) is not None):
            # A stop is partly matched, may start in it, or may complete in what the decoder
            # holds: the boundary decides, as the reference's push_text would, by a scan of
            # this text from this node remembered with no match where the decoder holds
            # nothing that may complete a stop (Matcher.steps), else by the reference's own.
            step = None if runs else self._steps[self._node].get(text)
            return self._through_boundary(text) if step is None else self._moved(step)
        self._rest = self._known if dec.idle else None
        return text

    def _moved(self, step: Step) -> str:
        """The boundary's move by a remembered scan: what leaves; its node and held text are
        this stream's until the reference is next asked (``_reference``)."""
        text, node, self.held = step
        self._node = node
        self._partial = node != 0
        self._rest = self._known if not node and self._dec.idle else None
        self._behind = self._state is not None
        return text

    def _through_boundary(self, text: str) -> str:
        """An id fed here (appended, the decoder fed) whose settled ``text`` the reference's
        boundary must take: what leaves. Where the boundary stays live (no stop completed,
        the common case: a stop's first character, a partial stop going on or given up),
        only what it holds and its node change, read here; else the whole catch-up."""
        state = self._reference()
        text = state._text_boundary(text)  # noqa: SLF001 (one package)
        node = state._boundary_node()  # noqa: SLF001
        if node is None:
            self._caught_up()
        else:
            self.held = state.held
            self._node = node
            self._partial = node != 0
            self._rest = self._known if not node and self._dec.idle else None
        return text

    def _caught_up(self) -> None:
        """After any call into the reference: mirror its finish, and whether it is at rest."""
        state = self._reference()
        self.finish_reason = state.finish_reason
        self.stop_reason = state.stop_reason
        self.held = state.held  # changes only in the reference: the shortcuts hold nothing
        self._at_rest(state._boundary_node())  # noqa: SLF001

    def _at_rest(self, node: int | None = 0) -> None:
        """Which shortcuts apply, ``node``: the reference's boundary's (0: at rest, as
        before the reference is built; a stop partly matched; None: not live)."""
        self._node = node or 0
        self._partial = bool(node)
        self._rest = self._known if node == 0 and self._dec.idle else None
        # A stop with U+FFFD, which even a byte-level tail may complete, sends every id to
        # the reference (a SentencePiece run's characters are checked after each feed).
        self._fed_below = self._size if node is not None and not (self._runs and self._opening[1].fffd_stops) else 0

    def _held_shows(self) -> bool:
        """What the decoder holds renders as characters now (a SentencePiece run that ends
        on a whole character), so it may complete a stop."""
        dec = self._dec
        return not dec.idle and not dec.renders_replacement()


def _one(stream: ServingStream, token_id: int) -> Delta:
    text = stream.push_text(token_id)
    return Delta(text, finish_reason=stream.finish_reason, stop_reason=stream.stop_reason, consumed=1)


def _at_rest(stream: ServingStream, ids: list[int]) -> Delta | None:
    """Several ids, each leaving the stream at rest: push_text's first shortcut for all at once
    (None for any other: unseen or leaving rest, no int, a stop id, max_tokens reached)."""
    rest, texts = stream._rest, []  # noqa: SLF001
    for token_id in ids:
        text = rest.get(token_id)  # type: ignore[union-attr]
        if text is None or token_id.__class__ is not int:
            return None
        texts.append(text)
    taken = stream.token_ids
    if not stream._unbounded and (len(taken) + len(ids) > stream._limit or not stream._stop_ids.isdisjoint(ids)):  # noqa: SLF001
        return None
    taken += ids
    return _tuple_new(Delta, ("".join(texts), "", (), None, None, len(ids)))


def _one_by_one(stream: ServingStream, ids: Sequence[Any]) -> Delta:
    """Ids through push_text; types first (a value that is no id refuses the whole push)."""
    at, rid = len(stream.token_ids), stream.request_id  # a property: read once, not per id
    batch = [v if type(v) is int else as_id(v, at + k, rid) for k, v in enumerate(ids)]
    push_text, parts = stream.push_text, []
    for token_id in batch:
        parts.append(push_text(token_id))
        if stream.finish_reason is not None:
            break
    return _tuple_new(Delta, ("".join(parts), "", (), stream.finish_reason, stream.stop_reason, len(parts)))
