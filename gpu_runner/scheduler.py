"""The server's one generation thread: requests in, batched through the runner, deltas out.

On a CPU the model's forward pass is the bottleneck, and a batch of B rows costs far less
than B single rows. So every request waits in one queue, and a single worker thread:

1. takes the oldest waiting job, and beside it every waiting job that may share its batch
   (greedy with greedy; sampled without a seed with the same temperature and top-k; a seeded
   request alone, so its seed alone decides its tokens), up to ``max_batch`` rows (a request
   with ``n`` choices is ``n`` rows);
2. runs them as one :meth:`Runner.generate` call with ``max_new_tokens`` the largest any row
   asks for, and gives each row its own :class:`~detok_plugin.ServingStream` with that
   request's ``stop``, ``max_tokens`` and the model's EOS ids: the stream decides when the
   row is done and what text each token releases;
3. hands every delta to the request's asyncio queue (``call_soon_threadsafe``), and stops
   the batch as soon as every row is done or its client has gone (it raises a private
   exception out of the runner's ``on_token`` callback: the runner has no other way to stop
   early, and its rows would otherwise run to the largest ``max_tokens``).

Jobs that do not fit wait for the next batch, in order. A job may also ask for the *naive*
stream the page compares with (``naive="decode"``: each token decoded alone, as a naive
server does; ``naive="bytes"``: each token's own UTF-8 bytes): the same tokens, the same
stream deciding the end, but the text shipped per token instead of the stream's.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from detok_plugin import Delta, ServingStream, build_table

from .openai_api import GenerationRequest
from .settings import GenerationSettings

if TYPE_CHECKING:
    from .runner import Runner

__all__ = [
    "ChoiceEvent",
    "EndEvent",
    "Job",
    "NaiveMode",
    "QueueFullError",
    "Scheduler",
    "byte_mode_available",
    "naive_piece",
]

log = logging.getLogger(__name__)
NaiveMode = Literal["decode", "bytes"]


class QueueFullError(RuntimeError):
    """More requests wait than the server accepts (``max_waiting``); try again later."""


@dataclass(frozen=True, slots=True)
class ChoiceEvent:
    """New output of one choice: ``text`` (``bytes`` in the naive byte mode), the ids it
    consumed, and the finish reason once the choice is done."""

    index: int
    text: str | bytes
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass(frozen=True, slots=True)
class EndEvent:
    """The request is done (``error`` is None) or failed (``error`` says why)."""

    completion_tokens: int
    error: str | None = None


Event = ChoiceEvent | EndEvent


@dataclass(eq=False, slots=True)
class Job:
    """One request in flight: its checked fields, where its events go, and whether its
    client is still there (``cancelled`` is set from the event loop, read by the worker)."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    naive: NaiveMode | None = None
    cancelled: bool = False

    def emit(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled = True

    @property
    def batch_key(self) -> tuple[Any, ...]:
        r = self.request
        if r.greedy:
            return ("greedy",)
        if r.seed is None:
            return ("sampled", r.temperature, r.top_k)
        return ("seeded", id(self))


class _BatchDone(Exception):
    """Raised out of ``on_token`` once every row of the batch is done or abandoned."""


class Scheduler:
    """Owns the generation thread. ``submit(job)`` from the event loop; ``close()`` at exit."""

    def __init__(self, runner: Runner, *, max_batch: int = 16, max_waiting: int = 256) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.runner = runner
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="detok-serve-generate", daemon=True)
        self._table = build_table(runner.tokenizer)[0]
        self.batches = 0  # how many generate() calls ran: read by tests and the soak script

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for job in self._waiting:
                job.emit(EndEvent(0, "the server is shutting down"))
            self._waiting.clear()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    @property
    def byte_mode(self) -> bool:
        """Whether the naive byte mode is served: the tokenizer is byte-level."""
        return byte_mode_available(self._table)

    @property
    def waiting(self) -> int:
        """Jobs queued and not yet in a batch."""
        return len(self._waiting)

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise QueueFullError("the server is shutting down")
            if len(self._waiting) >= self.max_waiting:
                raise QueueFullError(f"{len(self._waiting)} requests are waiting already; try again later")
            self._waiting.append(job)
            self._cond.notify()

    # --- the worker thread ----------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                jobs = self._take()
            if jobs:
                self._run(jobs)

    def _take(self) -> list[Job]:
        """1. The oldest live job and every waiting job that may share its batch."""
        while self._waiting and self._waiting[0].cancelled:
            self._waiting.popleft()
        if not self._waiting:
            return []
        first = self._waiting.popleft()
        jobs, rows = [first], first.request.n
        key = first.batch_key
        for job in list(self._waiting):
            if job.cancelled:
                self._waiting.remove(job)
            elif job.batch_key == key and rows + job.request.n <= self.max_batch:
                self._waiting.remove(job)
                jobs.append(job)
                rows += job.request.n
        return jobs

    def _run(self, jobs: list[Job]) -> None:
        """2-3. One generate() call for all rows of ``jobs``; deltas out as they come."""
        rows = [(job, i) for job in jobs for i in range(job.request.n)]
        streams = [self._stream(job, i) for job, i in rows]
        live = {id(job): job.request.n for job in jobs}
        first = jobs[0].request
        settings = GenerationSettings(
            max_new_tokens=max(job.request.max_tokens for job in jobs),
            temperature=first.temperature,
            top_k=first.top_k,
            seed=first.seed if first.seed is not None else random.randrange(2**63),
            chat_template=False,
        )

        def on_token(row: int, token_id: int, _delta: Delta) -> None:
            job, index = rows[row]
            stream = streams[row]
            if stream.finished or job.cancelled:
                if all(s.finished or j.cancelled for s, (j, _) in zip(streams, rows)):
                    raise _BatchDone
                return
            text = self._text(job, stream, token_id)
            done = stream.finished
            job.emit(ChoiceEvent(index, text, (token_id,), stream.finish_reason if done else None,
                                 stream.stop_reason if done else None))
            if done:
                live[id(job)] -= 1
                if not live[id(job)]:
                    job.emit(EndEvent(sum(len(s.token_ids) for s, (j, _) in zip(streams, rows) if j is job)))
                if all(s.finished or j.cancelled for s, (j, _) in zip(streams, rows)):
                    raise _BatchDone

        self.batches += 1
        try:
            self.runner.generate([list(job.request.prompt_ids) for job, _ in rows], settings, on_token=on_token)
        except _BatchDone:
            pass
        except Exception as exc:  # noqa: BLE001 - a failed batch must not kill the server
            log.exception("generation failed")
            for job in jobs:
                job.emit(EndEvent(0, f"generation failed: {type(exc).__name__}: {exc}"))
            return
        self._finish_stragglers(rows, streams, live)

    def _finish_stragglers(self, rows: list[tuple[Job, int]], streams: list[ServingStream],
                           live: dict[int, int]) -> None:
        # Unreachable while every stream's max_tokens is at most the batch's; kept so that a
        # change there can never leave a client waiting for ever.
        for (job, index), stream in zip(rows, streams):
            if not stream.finished and not job.cancelled:
                delta = stream.finish()
                job.emit(ChoiceEvent(index, delta.text, (), stream.finish_reason or "length", stream.stop_reason))
                live[id(job)] -= 1
                if not live[id(job)]:
                    job.emit(EndEvent(sum(len(s.token_ids) for s, (j, _) in zip(streams, rows) if j is job)))

    def _stream(self, job: Job, index: int) -> ServingStream:
        r = job.request
        return ServingStream.from_tokenizer(
            self.runner.tokenizer,
            prompt_ids=r.prompt_ids,
            skip_special_tokens=r.skip_special_tokens,
            stop=r.stop,
            eos_token_ids=self.runner.eos_token_ids,
            max_tokens=r.max_tokens,
            request_id=f"{id(job):x}-{index}",
        )

    def _text(self, job: Job, stream: ServingStream, token_id: int) -> str | bytes:
        """The text this token ships: the plugin's, or the naive server's per-token piece."""
        text = stream.push_text(token_id)
        if job.naive is None:
            return text
        if stream.finish_reason == "stop" and stream.stop_reason is None:
            return "" if job.naive == "decode" else b""  # the EOS token ends the stream unseen
        return naive_piece(self.runner.tokenizer, self._table, token_id, job.naive,
                           skip_special_tokens=job.request.skip_special_tokens)


def naive_piece(tokenizer: Any, table: Any, token_id: int, mode: NaiveMode, *, skip_special_tokens: bool) -> str | bytes:
    """What a naive server ships for one token.

    ``decode``: ``tokenizer.decode([id])``, the token decoded alone; a byte-level tokenizer
    replaces the bytes of a split character with U+FFFD (``errors="replace"``).
    ``bytes``: the token's own UTF-8 bytes, which may end or start inside a character;
    whoever decodes them between other bytes (the page's ``TextDecoder``) meets the split.
    """
    if mode == "decode":
        text: str = tokenizer.decode([token_id], skip_special_tokens=skip_special_tokens)
        return text
    if skip_special_tokens and token_id in table.special_ids:
        return b""
    piece = table.pieces[token_id]
    return piece if isinstance(piece, bytes) else str(piece).encode()


def byte_mode_available(table: Any) -> bool:
    """The byte mode needs each token's bytes: a byte-level table has them as they are."""
    return table is not None and table.family == "byte_level"

