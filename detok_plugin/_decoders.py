"""Stream decoders: token ids in, text that no future token can change out.

One strategy per tokenizer family (vLLM's ``IncrementalDetokenizer`` has the same shape):
tables for byte-level BPE and SentencePiece byte fallback, else a decode. The verbs:

* ``feed(ids) -> str``: the text those ids settle (``""`` when none);
* ``flush() -> str``: the end of the stream: whatever was held, rendered as final;
* ``peek_final() -> str``: what ``flush`` would return now, without changing state.

And two attributes for a caller's hot loop: while ``idle`` is true, ``feed_one(i)`` is
``quick[i]`` whenever that is not None, and changes nothing (so a caller may index it).

Ids reach a decoder already validated (ints inside the vocabulary).
"""

from __future__ import annotations

import codecs
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from ._tables import TokenTable, surrogate_prefix

__all__ = ["ByteLevelStream", "GenericStream", "SentencePieceStream", "StreamDecoder"]

_utf8_decode = codecs.utf_8_decode
_BYTES = tuple(bytes((b,)) for b in range(256))


class StreamDecoder(ABC):
    """The verbs every family's stream decoder offers."""

    # No __dict__: the subclasses declare their own slots.
    __slots__ = ()

    path: str = ""
    idle: bool = False
    quick: tuple[str | None, ...] = ()
    #: Whether what ``holds`` keeps can only ever render as U+FFFD (``peek_final`` is all
    #: U+FFFD): then held text cannot complete a stop string that has no U+FFFD in it.
    held_is_replacement: bool = False

    @abstractmethod
    def feed(self, ids: Sequence[int]) -> str: ...

    @abstractmethod
    def flush(self, drop_incomplete: bool = False) -> str:
        """End the stream: what is held, rendered as the final decode renders it; with
        ``drop_incomplete``, less a trailing character no token completed (a server's
        stock view of a stream cut inside a character: nothing, where the decode has U+FFFD)."""

    @abstractmethod
    def peek_final(self) -> str: ...

    def feed_one(self, i: int) -> str:
        return self.feed((i,))

    def prime(self, prompt: Sequence[int]) -> None:
        """Take the prompt's ids (their text is the caller's, not the stream's)."""
        self.feed(prompt)

    def holds(self) -> bool:
        """Whether text is held that the end of the stream would render (see peek_final)."""
        return False

    def final_growth(self, since: Any) -> tuple[str, Any] | None:
        """``peek_final()`` as an extension of what it rendered at ``since`` (a mark this
        method returned, or None): ``(added, mark)`` where the held text rendered as final
        is the text at ``since`` followed by ``added``; None where the decoder cannot say
        so cheaply (then ask ``peek_final``). For callers that scan the held text after
        every id: the SentencePiece run it grows is unbounded."""
        return None

    def renders_replacement(self) -> bool:
        """Whether ``peek_final()`` is all U+FFFD now (so it matches no stop without one)."""
        return self.held_is_replacement


class ByteLevelStream(StreamDecoder):
    """Byte-level BPE: concatenate token bytes, decode UTF-8 incrementally.

    CPython's UTF-8 decoder (``codecs.utf_8_decode``, not final) with ``errors="replace"`` holds exactly an
    incomplete-but-possibly-valid tail and replaces each maximal invalid subpart with one
    U+FFFD as soon as it is certain: the same rule as Rust's ``String::from_utf8_lossy``,
    which ``tokenizers``' ByteLevel decoder applies to the whole text.
    """

    path = "byte_level"
    # The tail is at most three bytes of one unfinished character: final, it is one U+FFFD.
    held_is_replacement = True
    __slots__ = ("idle", "quick", "_pieces", "_splits", "_joins", "_skip", "_tail")

    def __init__(self, table: TokenTable, *, skip_special_tokens: bool) -> None:
        self._pieces = table.pieces
        self.quick = table.quick_texts(skip_special_tokens)
        self._splits = table.splits
        self._joins = table.joins
        self._skip = table.special_ids if skip_special_tokens and table.special_ids else None
        self._tail = b""  # bytes of an unfinished character, held
        self.idle = True  # no tail

    def _decode(self, data: bytes) -> str:
        text, self._tail = _settle(data)
        self.idle = not self._tail
        return text

    def feed_one(self, i: int) -> str:
        """The hot path: with nothing held, a token that is valid UTF-8 alone (or a skipped
        special token) is its ``quick`` text."""
        tail = self._tail
        if not tail:
            text = self.quick[i]
            if text is not None:
                return text
            split = self._splits[i]
            if split is None:  # a hole in the vocabulary: the caller's checked path raises
                raise TypeError(f"no piece for token id {i}")
            self._tail = split[1]
            self.idle = not split[1]
            return split[0]
        if self._skip is not None and i in self._skip:
            return ""
        # The per-token path of every split character: what the held bytes and this piece
        # decode to, looked up (a third of a decode's cost), or decoded once for the table.
        data = tail + self._pieces[i]
        text, tail = self._joins.get(data) or join(self._joins, data)
        self._tail = tail
        self.idle = not tail
        return text

    def feed(self, ids: Sequence[int]) -> str:
        if len(ids) == 1:
            return self.feed_one(ids[0])
        pieces, skip = self._pieces, self._skip or ()
        return self._decode(self._tail + b"".join([pieces[i] for i in ids if i not in skip]))

    def prime(self, prompt: Sequence[int]) -> None:
        """Feed only the prompt's last ids that hold its last 4 bytes: what is held after
        the whole prompt starts at a lead byte at most 3 bytes from the end, and a lead byte
        always starts a fresh sequence, so O(1) per request; none after a piece that is text."""
        if prompt and self.quick[prompt[-1]]:
            return
        skip = self._skip or ()
        pieces = self._pieces
        start, nbytes = len(prompt), 0
        while start > 0 and nbytes < 4:
            start -= 1
            i = prompt[start]
            if i not in skip:
                nbytes += len(pieces[i])
        if start < len(prompt):
            self.feed(prompt[start:])

    def holds(self) -> bool:
        return bool(self._tail)

    def flush(self, drop_incomplete: bool = False) -> str:
        tail, self._tail = self._tail, b""
        self.idle = True
        # What is held is always an incomplete but possibly valid character (``_settle``).
        return "" if drop_incomplete else tail.decode("utf-8", "replace")

    def peek_final(self) -> str:
        return self._tail.decode("utf-8", "replace")


JOINS_MAX = 1 << 13  # TokenTable.joins entries; past that the dict starts again (``join``)


def _settle(data: bytes) -> tuple[str, bytes]:
    """``data`` decoded as far as no later byte can change it: (settled text, tail still held)."""
    # codecs.utf_8_decode with final=False is the C core of the incremental decoder:
    # it stops before an incomplete-but-possibly-valid tail and says where.
    text, used = _utf8_decode(data, "replace", False)
    tail = data[used:]
    if tail and surrogate_prefix(tail):
        return text + "\ufffd" * len(tail), b""
    return text, tail


def join(joins: dict[bytes, tuple[str, bytes]], data: bytes) -> tuple[str, bytes]:
    """``_settle(data)`` for a held tail and the next piece, recorded in the table's ``joins``
    (read by every thread with no lock): made whole, then stored by one assignment, the bound
    kept by one ``clear()``, so a reader finds it whole or not at all (``TokenTable``)."""
    got = _settle(data)
    if len(joins) >= JOINS_MAX:
        joins.clear()
    joins[data] = got
    return got


class SentencePieceStream(StreamDecoder):
    """SentencePiece with byte fallback, as ``tokenizers`` decodes it.

    Why a run of ``<0xNN>`` pieces is held until it ends: ByteFallback renders a whole
    run as one U+FFFD per byte piece if any byte in it is invalid, so a later invalid byte
    can still turn an earlier complete character into U+FFFD. The run is released
    (1) when a non-byte piece closes it, (2) at once, as U+FFFD per byte, when it becomes
    certainly invalid, after which each further byte piece of the run is one U+FFFD, or
    (3) at flush. One leading space of the whole text is stripped when the decoder's
    ``Strip`` step says so.
    """

    path = "sentencepiece"
    __slots__ = (
        "idle", "quick", "_pieces", "_bytes", "_skip", "_strip", "_tail", "_run_text", "_run_len", "_run_bad", "_run_serial",
    )

    def __init__(self, table: TokenTable, *, skip_special_tokens: bool) -> None:
        self._pieces = table.pieces
        self.quick = table.quick_texts(skip_special_tokens)
        self._bytes = table.byte_values
        self._skip = table.special_ids if skip_special_tokens and table.special_ids else None
        self._strip = table.strip_leading_space
        self._tail = b""  # the run's bytes of an unfinished character
        self._run_text: list[str] = []
        self._run_len = 0
        self._run_bad = False
        self._run_serial = 0  # which run final_growth's marks belong to
        self.idle = not self._strip  # no run open, and the leading-space strip decided

    def _out(self, s: str) -> str:
        if self._strip and s:
            self._strip = False
            self.idle = not self._run_len
            if s[0] == " ":
                return s[1:]
        return s

    def _render_run(self) -> str:
        if not self._run_len or self._run_bad:
            return ""
        if self._tail:  # an incomplete character at the end: the run is invalid
            return "\ufffd" * self._run_len
        return "".join(self._run_text)

    def _close_run(self) -> str:
        text = self._render_run()
        self._run_serial += 1
        self._run_text.clear()
        self._run_len = 0
        self._run_bad = False
        self.idle = not self._strip
        self._tail = b""
        return text

    def _push_byte(self, b: int) -> str:
        if self._run_bad:
            return "\ufffd"
        self._run_len += 1
        self.idle = False
        # codecs.utf_8_decode, not final: the C decoder, which stops before an incomplete but
        # possibly valid tail (a surrogate's prefix is caught here, as the final decode would).
        data = self._tail + _BYTES[b] if self._tail else _BYTES[b]
        try:
            text, used = _utf8_decode(data, "strict", False)
        except UnicodeDecodeError:
            text, used = "", -1
        if used < 0 or (used < len(data) and b >= 0xA0 and surrogate_prefix(data[used:])):
            self._run_bad = True
            self._tail = b""
            return "\ufffd" * self._run_len
        self._tail = data[used:]
        if text:
            self._run_text.append(text)  # complete characters only: final_growth's marks count them
        return ""

    def feed(self, ids: Sequence[int]) -> str:
        if len(ids) == 1:
            return self.feed_one(ids[0])
        return "".join([self.feed_one(i) for i in ids])

    def feed_one(self, i: int) -> str:
        """One id: a text piece with no run open and the strip decided is its own text."""
        if self._skip is not None and i in self._skip:
            return ""
        b = self._bytes[i]
        if b < 0:
            if not self._run_len and not self._strip:
                return self._pieces[i]  # type: ignore[no-any-return]
            s = self._close_run() + self._pieces[i]
        else:
            s = self._push_byte(b)
        return self._out(s) if s else ""

    def prime(self, prompt: Sequence[int]) -> None:
        """Feed the prompt from its last text piece on (its trailing byte run may matter
        whole), and decide the leading-space strip from whether anything before produced
        text: O(1) per request unless the prompt ends in a long byte run; none after text."""
        if prompt and self.quick[prompt[-1]]:
            self._strip, self.idle = False, True
            return
        skip = self._skip or ()
        byte_values, pieces = self._bytes, self._pieces
        j = len(prompt) - 1
        while j >= 0 and (prompt[j] in skip or byte_values[prompt[j]] >= 0):
            j -= 1
        start = max(j, 0)
        if (
            self._strip
            and start > 0
            and any(i not in skip and (byte_values[i] >= 0 or pieces[i]) for i in prompt[:start])
        ):
            self._strip = False
            self.idle = not self._run_len
        if start < len(prompt):
            self.feed(prompt[start:])

    def holds(self) -> bool:
        return self._run_len > 0 and not self._run_bad

    def flush(self, drop_incomplete: bool = False) -> str:
        if drop_incomplete and self._tail and not self._run_bad:
            # The run as if its last, incomplete character had never begun: its complete
            # characters (the final decode renders the whole run as U+FFFD).
            self._tail = b""
        return self._out(self._close_run())

    def peek_final(self) -> str:
        s = self._render_run()
        if self._strip and s and s[0] == " ":
            return s[1:]
        return s

    def final_growth(self, since: Any) -> tuple[str, Any] | None:
        """An open, valid run that ends on a character boundary renders as its characters,
        and grows only by appending: what it added since ``since`` is the run's pieces
        after the mark. O(added), where ``peek_final`` is O(run) (so a provisional stop
        check per byte piece stays O(1) amortized however long the run)."""
        if not self._run_len or self._run_bad or self._tail:
            return None  # no run, a released one, or one ending inside a character
        serial = self._run_serial
        k = since[1] if since is not None and since[0] == serial else 0
        n = len(self._run_text)
        added = "".join(self._run_text[k:n])
        if k == 0 and self._strip and added[:1] == " ":
            added = added[1:]  # the whole text's leading-space strip, as peek_final does
        return added, (serial, n)

    def renders_replacement(self) -> bool:
        return bool(self._run_len and not self._run_bad and self._tail)


class GenericStream(StreamDecoder):
    """Any tokenizer that offers ``decode(ids)``: a bounded window, diffed by position.

    Algorithm (TGI's prefix/read offsets, with two changes):

    1. Decode ``ids[prefix:]`` and take the text past ``decode(ids[prefix:read])`` by
       position, so the joined stream is ``decode(prompt + out)[len(decode(prompt)):]``.
    2. Hold a trailing run of U+FFFD (an incomplete character may still complete) and,
       when the tokenizer cleans up spaces, a trailing prefix of a cleanup pattern.
    3. When nothing is held, move the window forward (prefix = read, read = end).
    4. Change one: when U+FFFD has been held for more than ``MAX_PENDING`` tokens, the
       text of all but the last 3 tokens is settled (a character spans at most 4 bytes),
       so the window moves anyway: a stream of invalid bytes costs O(1) per token, where
       TGI's window grows without bound (O(N) per token).
    5. Change two: the window keeps ``CONTEXT`` tokens of the prompt, so decoders that
       look at neighbours (leading-space rules) see what they would see in a full decode.
    6. Ids in ``skipped`` (those ``skip_special_tokens=True`` removes before the decoder
       runs) never enter the window: the decode is the same without them, and a window
       that began with them would show the decoder no neighbour, so it would decode the
       next token as the text's first (WordPiece drops its space and keeps ``##``).
    """

    path = "generic"
    CONTEXT = 4
    MAX_PENDING = 8
    _CLEANUP_PREFIXES = (" n'", " n", " '", " ")

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        prompt_ids: Sequence[int],
        *,
        cleanup: bool = False,
        skipped: frozenset[int] = frozenset(),
    ) -> None:
        self._decode = decode
        self._cleanup = cleanup
        self._skipped = skipped
        self._ids = [i for i in prompt_ids if i not in skipped] if skipped else list(prompt_ids)
        self._read = len(self._ids)
        self._prefix = max(0, self._read - self.CONTEXT)
        self._base = decode(self._ids[self._prefix : self._read])
        self._emitted = 0  # characters emitted past ``_base`` in the current window

    def _held(self, window: str) -> int:
        """Characters at the end of the window that a later token may still change."""
        n = len(window) - len(window.rstrip("\ufffd"))
        if n == 0 and self._cleanup:
            for p in self._CLEANUP_PREFIXES:
                if window.endswith(p):
                    return len(p)
        return n

    def _settle(self, upto: int, window_upto: str) -> str:
        """Treat ``decode(ids[prefix:upto])`` as final and move the window to it.

        Positions, not strings, carry over: when the settled text is shorter than the
        base (a prompt's trailing U+FFFD pair became one character), the difference is
        skipped from what follows, as ``decode(prompt + out)[len(decode(prompt)):]`` does.
        """
        settled_len = len(window_upto) - len(self._base)
        out = ""
        if settled_len > self._emitted:
            out = window_upto[len(self._base) + self._emitted :]
            self._emitted = 0
        else:
            self._emitted -= settled_len
        self._prefix, self._read = self._read, upto
        self._base = self._decode(self._ids[self._prefix : self._read])
        return out

    def feed(self, ids: Sequence[int]) -> str:
        if self._skipped:
            ids = [i for i in ids if i not in self._skipped]
            if not ids:  # the decode would not change (step 6)
                return ""
        self._ids.extend(ids)
        window = self._decode(self._ids[self._prefix :])
        # The held tail is measured on the whole window: a prompt that ends inside a
        # character shows U+FFFD in ``_base``, and its completion must not settle early.
        held = self._held(window)
        if held == 0:
            return self._settle(len(self._ids), window)
        out = ""
        ready = len(window) - held - len(self._base)
        if ready > self._emitted:
            out = window[len(self._base) + self._emitted : len(window) - held]
            self._emitted = ready
        if len(self._ids) - self._read > self.MAX_PENDING:
            cut = len(self._ids) - 3
            head = self._decode(self._ids[self._prefix : cut])
            if window.startswith(head):
                out += self._settle(cut, head)
        return out

    def flush(self, drop_incomplete: bool = False) -> str:
        out = self.peek_final()
        self._emitted += len(out)
        # The decode is the tokenizer's own: a character no token completed shows only as
        # trailing U+FFFD (what a server's stock detokenizer holds back for good).
        return out.rstrip("\ufffd") if drop_incomplete else out

    def peek_final(self) -> str:
        window = self._decode(self._ids[self._prefix :])
        start = len(self._base) + self._emitted
        return window[start:] if start < len(window) else ""
