"""The queue-backed drop-ins: ``TextIteratorStreamer``, ``AsyncTextIteratorStreamer`` and
``TextDiffusionStreamer``'s contracts over :class:`~.streamers.DetokStreamer`."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterable
from queue import Queue
from typing import Any

from detok_plugin import Delta, TagSet

from .streamers import DetokStreamer, Reasoning

__all__ = ["AsyncDetokIteratorStreamer", "DetokDiffusionStreamer", "DetokIteratorStreamer"]

_DIFFUSION_BATCH_ERROR = "TextDiffusionStreamer only supports batch size 1"


class DetokIteratorStreamer(DetokStreamer):
    """``TextIteratorStreamer`` with exact, prompt text: iterate while ``generate()`` runs.

    Keeps ``text_queue``, ``stop_signal`` and ``timeout``: iteration blocks at most
    ``timeout`` seconds per item and then raises ``queue.Empty``, exactly as the stock
    streamer does. One item per ``put`` (often ``""``) and one at ``end()``, then the stop.

    ``deltas=True`` yields :class:`~detok_plugin.Delta` objects (content ``text``,
    ``reasoning``, ``tool_calls``, ``finish_reason``) instead of strings, and only those that
    carry something, plus the last one.
    """

    def __init__(
        self,
        tokenizer: Any,
        skip_prompt: bool = False,
        timeout: float | None = None,
        *,
        stop: str | Iterable[str] | None = (),
        tags: TagSet | str | None = None,
        reasoning: Reasoning = "separate",
        deltas: bool = False,
        **decode_kwargs: Any,
    ) -> None:
        super().__init__(tokenizer, skip_prompt, stop=stop, tags=tags, reasoning=reasoning, **decode_kwargs)
        self.text_queue: Queue[Any] = Queue()
        self.stop_signal: Any = None
        self.timeout = timeout
        self.deltas = deltas

    def on_finalized_delta(self, delta: Delta, stream_end: bool = False) -> None:
        if not self.deltas:
            self.on_finalized_text(delta.text, stream_end)
            return
        if stream_end or delta.text or delta.reasoning or delta.tool_calls or delta.finish_reason:
            self.text_queue.put(delta, timeout=self.timeout)
        if stream_end:
            self.text_queue.put(self.stop_signal, timeout=self.timeout)

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        """Queue the new text; at the end, queue the stop signal too."""
        self.text_queue.put(text, timeout=self.timeout)
        if stream_end:
            self.text_queue.put(self.stop_signal, timeout=self.timeout)

    def __iter__(self) -> DetokIteratorStreamer:
        return self

    def __next__(self) -> Any:
        value = self.text_queue.get(timeout=self.timeout)  # queue.Empty on timeout, as stock
        if value == self.stop_signal:
            raise StopIteration()
        return value


class AsyncDetokIteratorStreamer(DetokStreamer):
    """``AsyncTextIteratorStreamer`` with exact, prompt text: ``async for`` while ``generate()``
    runs in a thread.

    Build it inside a running event loop (it keeps ``loop``, as the stock one does).
    Keeps ``text_queue``, ``stop_signal``, ``timeout``, ``has_asyncio_timeout`` and
    ``asyncio_timeout``; waiting longer than ``timeout`` for an item raises ``TimeoutError``,
    exactly as the stock streamer does. ``deltas=True`` as in :class:`DetokIteratorStreamer`.
    """

    def __init__(
        self,
        tokenizer: Any,
        skip_prompt: bool = False,
        timeout: float | None = None,
        *,
        stop: str | Iterable[str] | None = (),
        tags: TagSet | str | None = None,
        reasoning: Reasoning = "separate",
        deltas: bool = False,
        **decode_kwargs: Any,
    ) -> None:
        super().__init__(tokenizer, skip_prompt, stop=stop, tags=tags, reasoning=reasoning, **decode_kwargs)
        self.text_queue: asyncio.Queue[Any] = asyncio.Queue()
        self.stop_signal: Any = None
        self.timeout = timeout
        self.deltas = deltas
        self.loop = asyncio.get_running_loop()  # RuntimeError outside a loop, as stock
        timeout_context = getattr(asyncio, "timeout", None)
        self.has_asyncio_timeout = sys.version_info >= (3, 11) and callable(timeout_context)
        self.asyncio_timeout = timeout_context if self.has_asyncio_timeout else None

    def _enqueue(self, item: Any, stream_end: bool) -> None:
        # put() runs in generate()'s thread: hand items to the loop's thread.
        self.loop.call_soon_threadsafe(self.text_queue.put_nowait, item)
        if stream_end:
            self.loop.call_soon_threadsafe(self.text_queue.put_nowait, self.stop_signal)

    def on_finalized_delta(self, delta: Delta, stream_end: bool = False) -> None:
        if not self.deltas:
            self.on_finalized_text(delta.text, stream_end)
        elif stream_end or delta.text or delta.reasoning or delta.tool_calls or delta.finish_reason:
            self._enqueue(delta, stream_end)
        # An empty delta mid-stream is not queued in delta mode.

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        """Queue the new text on the loop; at the end, queue the stop signal too."""
        self._enqueue(text, stream_end)

    def __aiter__(self) -> AsyncDetokIteratorStreamer:
        return self

    async def __anext__(self) -> Any:
        try:
            if self.has_asyncio_timeout and self.asyncio_timeout is not None:
                async with self.asyncio_timeout(self.timeout):
                    value = await self.text_queue.get()
            else:
                value = await asyncio.wait_for(self.text_queue.get(), timeout=self.timeout)
        except asyncio.TimeoutError:  # the builtin TimeoutError from 3.11 on
            raise TimeoutError() from None
        if value == self.stop_signal:
            raise StopAsyncIteration()
        return value


class DetokDiffusionStreamer(DetokStreamer):
    """``TextDiffusionStreamer`` with exact, prompt confirmed text.

    Same constructor and contract as ``transformers.TextDiffusionStreamer``: a diffusion
    model's ``generate()`` calls ``put_draft(ids)`` with each intermediate draft (printed in
    yellow after saving the cursor, and wiped by the next draft or by confirmed text), then
    ``put``/``end`` with the confirmed tokens, as for :class:`DetokStreamer`. Drafts are
    whole sequences the model will overwrite, decoded whole by the tokenizer as stock does
    (a draft needs a tokenizer with ``decode``); what changes is the confirmed text, which
    leaves as :class:`DetokStreamer` releases it: each character with the token that
    completes it, exactly the decode, never a U+FFFD a later token completes.
    """

    def __init__(
        self,
        tokenizer: Any,
        skip_prompt: bool = False,
        sleep_time: float | None = None,
        *,
        stop: str | Iterable[str] | None = (),
        tags: TagSet | str | None = None,
        reasoning: Reasoning = "separate",
        **decode_kwargs: Any,
    ) -> None:
        super().__init__(tokenizer, skip_prompt, stop=stop, tags=tags, reasoning=reasoning, **decode_kwargs)
        self._has_draft = False  # a draft is on screen, after a saved cursor position
        self._takes_logits = False  # stock's switch for put_draft(logits=...): off, as stock
        self.sleep_time = sleep_time

    def put_draft(self, value: Any, **kwargs: Any) -> None:
        """Show a draft (a whole sequence of ids) in place of the previous one."""
        self._clear_draft()
        shape = tuple(value.shape)
        if len(shape) > 1 and shape[0] > 1:
            raise ValueError(_DIFFUSION_BATCH_ERROR)
        if len(shape) > 1:
            value = value[0]
        text = self.tokenizer.decode(value, **self.decode_kwargs)
        # ESC 7 saves the cursor; the draft is yellow (SGR 33) and reset after.
        print("\0337", end="", flush=True)
        print(f"\033[33m{text}\033[0m", end="", flush=True)
        self._has_draft = True
        if self.sleep_time is not None:
            time.sleep(self.sleep_time)

    def put(self, value: Any) -> None:
        """Confirmed ids: wipe the draft, then stream them as :class:`DetokStreamer` does."""
        self._clear_draft()
        super().put(value)

    def end(self) -> None:
        self._clear_draft()
        super().end()

    def _clear_draft(self) -> None:
        if self._has_draft:
            print("\0338\033[J", end="", flush=True)  # ESC 8: back to the saved cursor; clear below
            self._has_draft = False

