"""The safe emission boundary for stop strings and tags, and the ``min_tokens`` rule.

After every token, settled text (what the decoder says no later token can change) leaves
up to the earliest of

1. the start of the longest unemitted suffix that may still become a stop string or tag
   (``Matcher.hold``: zero characters when no pattern can be forming);
2. the end of a complete stop string, where the stream ends (the stop itself is cut
   unless ``include_stop_str_in_output``), or of a complete tag, where the channel changes.

Two rules live only here:

* **Provisional stops.** Text the decoder holds (a SentencePiece byte run that a later byte
  could still turn into U+FFFD) would be final if the stream ended now, so a stop string
  that completes in it, rendered as final, ends the stream now: what
  ``decode(prompt + out[:k])`` shows is what vLLM's rule checks (``_held_hit``).
* **min_tokens.** A stop completed by output token *k* counts only when *k* > ``min_tokens``
  (vLLM's rule). Held text that already showed by token ``min_tokens`` (``_early``) holds no
  stop later either, also when it is released after ``min_tokens``, as far as the text
  released then agrees with what showed.

This module is one part of :class:`~detok_plugin.DetokenizerState` (a slotless base class:
the state's slots are declared there, the rules are kept here).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from ._delta import CONTENT, STOP, Out
from ._matcher import Step

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._decoders import StreamDecoder
    from ._delta import FinishReason
    from ._matcher import Matcher
    from ._options import Pattern, StreamConfig

__all__ = ["held_may_stop"]


class HeldScan(NamedTuple):
    """Where the last scan of held text ended (``_held_hit``), so the next one scans only
    what the held text added since."""

    matcher: Matcher
    node: int  # the automaton node the held text was scanned from
    mark: object  # the decoder's mark of what it held then (``final_growth``)
    at: int  # the node the scan reached
    scanned: int  # characters of held text scanned so far


class Boundary:
    """Stop strings and tags at the boundary (see the module docstring)."""

    if not TYPE_CHECKING:  # slotless at run time; mypy reads the declarations below
        __slots__ = ()

    # Declared in DetokenizerState's slots.
    token_ids: list[int]
    finish_reason: FinishReason | None
    stop_reason: str | int | None
    _cfg: StreamConfig
    _min_tokens: int
    _dec: StreamDecoder
    _ac: Matcher | None
    _ac_state: int
    _pending: str
    _mode: int
    _skip_chars: int
    _early: str
    _held_scan: HeldScan | None
    _keep_log: bool
    _first: Callable[[str], object] | None
    _held_may_stop: bool
    _at_start: bool
    _done: bool
    _vocab: Sequence[bytes | str | None] | None

    if TYPE_CHECKING:  # the other parts of DetokenizerState that the boundary calls

        def _emit(self, text: str, out: Out) -> None: ...
        def _log(self, kind: int, text: str) -> None: ...
        def _switch(self, pattern: Pattern, out: Out) -> None: ...
        def _unskip(self, text: str) -> str: ...
        def _settle(self, text: str, out: Out) -> None: ...
        def _bare_opens(self, lead: str = "") -> bool: ...

    # --- the shortcut's boundary (DetokenizerState.push_text) --------------------------

    def _boundary_at_rest(self) -> bool:
        """Live, in content, no log or tags, on a table, no stop partly matched, nothing of the
        prompt to skip. Then, while what the decoder holds cannot complete a stop (``_held_may_stop``),
        ``push_text`` of an id in the vocabulary, no stop id, short of ``max_tokens``, whose settled
        text has no first character of a stop, appends it, feeds the decoder, releases that text
        and changes nothing else (``ServingStream``); ``finish()`` with the decoder idle, nothing."""
        return self._boundary_node() == 0

    def _resume_boundary(self, node: int, pending: str) -> None:
        """Put the live boundary at ``node`` holding ``pending``: where the moves of
        ``Matcher.steps`` (scans with no match, remembered) took it (``ServingStream``)."""
        self._ac_state, self._pending = node, pending

    def _boundary_node(self) -> int | None:
        """The automaton's node while the boundary is *live* (live, in content, no log or
        tags, on a table, nothing of the prompt to skip, no text held that showed by
        ``min_tokens``): 0 at rest, else a stop is partly matched; None otherwise. While it
        is live, ``push_text`` of an id in the vocabulary, no stop id, short of ``max_tokens``,
        is: append it, feed the decoder, ``_text_boundary`` its settled text (``ServingStream``)."""
        if self._done or self._skip_chars or self._keep_log or self._early or self._cfg.tags is not None or self._vocab is None:
            return None
        return self._ac_state

    def _text_boundary(self, text: str) -> str:
        """The boundary for ``push_text`` when stops are live (content is the only channel)."""
        dec = self._dec
        # Held text can complete a stop only if, rendered as final, it holds a stop's
        # character: not while it is all U+FFFD (a byte run ending inside a character) and
        # no stop has one (as in _held_hit, but before any call: most byte pieces).
        held = (
            self._held_may_stop
            and not dec.idle
            and dec.holds()
            and (self._cfg.fffd_stops or not dec.renders_replacement())
        )
        if held or self._ac_state or (text and self._first(text) is not None):  # type: ignore[misc]
            # A stop is partly matched, may start in this text, or may complete in what
            # the decoder holds.
            step = None if held else self._ac.steps[self._ac_state].get(text)  # type: ignore[union-attr]
            if step is None:  # the boundary scan decides
                return self._scan_text(text, held)
            # This text was scanned from this node before, with no match: the same text
            # leaves and the same text is held (Matcher.steps).
            text, self._ac_state, self._pending = step
        if text and self._keep_log:
            self._log(CONTENT, text)
        return text

    def _scan_text(self, text: str, held: bool) -> str:
        """The common outcome, no stop completes in the text nor in what the decoder holds
        rendered as final, is ``_take``'s no-match branch without an ``Out`` (and is
        remembered per node when nothing is held); any other goes through ``_settle``,
        which scans again from the same node and decides."""
        ac = self._ac
        assert ac is not None
        start = self._ac_state
        node, hit = ac.scan(start, text)
        if hit is None and (not held or self._held_hit(node) is None):
            released = self._advance(node, text)
            if not held:  # the outcome depends on the text and the start node only
                ac.remember(start, text, Step(released, node, self._pending))
            if released:
                self._log(CONTENT, released)
            return released
        out = Out()
        self._settle(text, out)
        return "".join(out.text)

    # --- settled text -------------------------------------------------------------------

    def _passed(self, text: str) -> str | None:
        """What an id's settled ``text`` releases where no pattern completes in it and the
        decoder holds nothing that may complete a stop (``_held_may_stop_now``), else None
        (``_take`` decides). ``text`` leaves whole when no pattern is partly matched and
        none can start in it; else a scan of this text from this node remembered with no
        match (``Matcher.steps``) says what leaves and what is held."""
        if self._cfg.has_stops[self._mode] and self._dec.holds() and self._held_may_stop_now():
            return None
        if not text:
            return text
        ac = self._ac
        if ac is None or (self._ac_state == 0 and ac.first.search(text) is None):
            released = text
        else:
            step = ac.steps[self._ac_state].get(text)
            if step is None:
                return None
            released, self._ac_state, self._pending = step
        self._early = ""  # as in _take: settled text ends what showed by min_tokens
        return released

    def _take_settled(self, text: str, out: Out) -> None:
        """One token's settled text through the boundary: what ``_passed`` lets leave, else
        ``_scan_settled``."""
        released = self._passed(text)
        if released is not None:
            self._emit(released, out)
            return
        self._scan_settled(text, out)

    def _scan_settled(self, text: str, out: Out) -> None:
        """One token's settled text through the boundary's scan, then the provisional stop
        check: for a caller that knows ``_passed`` would not let it leave."""
        if text:
            self._take(text, out)
        if self.finish_reason is None and self._cfg.has_stops[self._mode] and self._dec.holds():
            self._provisional_stop(out)

    def _take(self, text: str, out: Out) -> None:
        """Scan new settled text; emit up to the safe boundary; act on complete matches."""
        early = 0
        if self._early:
            # Held text is released from its head: too early as far as it agrees.
            early = len(os.path.commonprefix((self._early, text)))
            self._early = ""
        while text:
            ac = self._ac
            if ac is None:
                self._emit(text, out)
                return
            start = self._ac_state
            node, hit = ac.scan(start, text)
            if hit is None:
                released = self._advance(node, text)
                ac.remember(start, text, Step(released, node, self._pending))
                self._emit(released, out)
                return
            index, end = hit
            pattern = self._cfg.patterns[self._mode][index]
            if pattern.kind == "stop" and (len(self.token_ids) <= self._min_tokens or end <= early):
                # Too early to stop: a tag ending here too acts (the automaton reports the
                # stop, listed first); else keep scanning from here as if nothing matched.
                tag = _tag_ending(self._cfg.patterns[self._mode], self._pending + text[:end])
                if tag is None:
                    self._emit(self._advance(node, text[:end]), out)
                    early -= end
                    text = text[end:]
                    continue
                pattern = tag
            elif pattern.kind == "t_bare" and not self._bare_opens((self._pending + text[:end])[: -len(pattern.text)]):
                # A bare opener that opens no body is text, to the stops too: one that
                # begins with it or spans it must still match, so scan on from its node.
                self._emit(self._advance(node, text[:end]), out)
                early -= end
                text = text[end:]
                continue
            before = self._pending + text[:end]
            self._pending = ""
            self._ac_state = 0
            if pattern.kind == "stop":
                self._stop_at(before, pattern.text, out)
                return
            self._emit(before[: len(before) - len(pattern.text)], out)
            self._switch(pattern, out)
            text = text[end:]

    def _stop_at(self, before: str, stop: str, out: Out) -> None:
        """``before`` ends with the stop string ``stop``: end the stream there."""
        if self._cfg.include_stop:
            # Kept stops do not hold, so part of the stop may have left already:
            # everything up to its end leaves now.
            self._emit(before, out)
            self._log(STOP, "")
        else:
            self._emit(before[: len(before) - len(stop)], out)
            self._log(STOP, stop)
        self.finish_reason = "stop"
        self.stop_reason = stop

    def _advance(self, node: int, text: str) -> str:
        """The automaton is at ``node`` after ``text`` with no match: hold the longest
        unemitted suffix that may still become a pattern; return what leaves."""
        self._ac_state = node
        buf = self._pending + text
        cut = len(buf) - self._ac.hold[node]  # type: ignore[union-attr]
        self._pending = buf[cut:]
        return buf[:cut]

    def _release_held(self, out: Out) -> None:
        """At the end (no stop string cut the stream): a partial stop or tag that never
        completed is released as it stands."""
        self._emit(self._pending, out)
        self._pending = ""

    def _settled(self) -> None:
        """After a token: once the decoder holds nothing, no held text showed by
        ``min_tokens`` any more (``_early``)."""
        if self._early and not self._dec.holds():
            self._early = ""

    # --- held text: the provisional stop ---------------------------------------------------

    def _provisional_stop(self, out: Out) -> None:
        """Stop where ``decode(prompt + out[:k])`` has the stop, as vLLM's rule says.

        Why: held text is held because a *later* token could change it; but if the stream
        ends here, the held text is final, and when that final text completes a stop,
        ending here is exactly right. So scan the held text as if final; on a stop, flush
        the decoder and let the boundary cut the stream.
        """
        if self._ac is None:
            return
        hit = self._held_hit(self._ac_state)
        if hit is None or len(self.token_ids) <= self._min_tokens:
            return
        if self._cfg.patterns[self._mode][hit[0]].kind != "stop":
            return
        self._take(self._unskip(self._dec.flush()), out)

    def _held_may_stop_now(self) -> bool:
        """What the decoder holds, rendered as final, may complete a stop (so a push that
        leaves it held must ask ``_provisional_stop``): not while it can only be U+FFFD (a
        byte-level tail), no stop has U+FFFD and no text that showed by ``min_tokens`` is
        held."""
        return held_may_stop(self._cfg, self._dec, self._early)

    def _held_hit(self, node: int) -> tuple[int, int] | None:
        """The match ``ac.scan(node, held)`` finds, where ``held`` is what the decoder
        holds rendered as final (less the prompt's skipped characters), or None.

        Why not that scan itself: it runs after every id while the decoder holds text, and
        a SentencePiece byte run can grow without bound, so it would cost O(run) per id
        (O(N^2) for a long run of byte pieces). Instead, while the held text only grows,
        scan only what it added, from where the last scan ended (``_held_scan``); while it
        is all U+FFFD (a run ending inside a character), only a stop with U+FFFD can match.
        """
        ac = self._ac
        assert ac is not None
        last = self._held_scan
        since = last.mark if last is not None and last.matcher is ac and last.node == node else None
        growth = self._dec.final_growth(since)
        if growth is not None:
            added, mark = growth
            if since is not None and since[0] == mark[0]:  # type: ignore[index]
                at, base = last.at, last.scanned  # type: ignore[union-attr]
            else:  # the whole held text: less what the prompt's held tail stands for
                at, base = node, 0
                added = added[self._skip_chars :]
            return self._scan_added(ac, node, mark, at, base, added)
        if not self._cfg.fffd_stops and self._dec.renders_replacement():
            return None
        held = self._dec.peek_final()[self._skip_chars :]
        return ac.scan(node, held)[1] if held else None

    def _scan_added(
        self, ac: Matcher, node: int, mark: object, at: int, base: int, added: str
    ) -> tuple[int, int] | None:
        """Scan what the held text added (``base`` characters were scanned before).

        A stop that ends in the characters that showed by token ``min_tokens`` (``_early``)
        completed too early: the scan goes on past it, here and later (as ``_take`` does).
        """
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
            self._held_scan = HeldScan(ac, node, mark, at, base + len(added))
        return hit


def _tag_ending(patterns: tuple[Pattern, ...], text: str) -> Pattern | None:
    """The first tag among ``patterns`` that ``text`` ends with (a tag is held until it
    completes, so all of it is there), or None."""
    return next((p for p in patterns if p.kind != "stop" and text.endswith(p.text)), None)


def held_may_stop(cfg: StreamConfig, decoder: StreamDecoder, early: str = "") -> bool:
    """What ``decoder`` holds, rendered as final, may complete a stop of ``cfg``: not while
    it can only be U+FFFD (a byte-level tail), no stop has U+FFFD and no text that showed by
    ``min_tokens`` (``early``) is held."""
    return bool(early) or cfg.fffd_stops or not decoder.held_is_replacement
