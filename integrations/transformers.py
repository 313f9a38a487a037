"""Drop-in streamers for transformers' ``generate()``, driven by the core.

``DetokStreamer``, ``DetokIteratorStreamer``, ``AsyncDetokIteratorStreamer`` and
``DetokDiffusionStreamer`` take the constructor arguments of ``TextStreamer``,
``TextIteratorStreamer``, ``AsyncTextIteratorStreamer`` and ``TextDiffusionStreamer``, keep
their attributes, hooks, iterator protocol, timeouts and batch refusal, are instances of
transformers' ``BaseStreamer`` where transformers is installed, and change one thing:
*which text leaves, and when*.

Why: ``TextStreamer`` re-decodes its whole token cache on every ``put`` (O(N) per token)
and releases text only up to the last space, a newline or a CJK ideograph. Japanese kana
and emoji-only replies therefore arrive in one lump at the next newline or at the end
(https://github.com/huggingface/transformers/issues/28849). Here every ``put`` pushes the
new ids into one :class:`~detok_plugin.DetokenizerState`, which releases every character in
the ``put`` of the token that completes it, and never a U+FFFD that a later token would
have turned into a character. The joined stream is exactly what ``tokenizer.decode`` shows.

Additions, all optional and keyword-only: ``stop=`` (stop strings, cut from the stream),
``tags=`` and ``reasoning=`` (reasoning and tool-call channels, as the core defines them),
``deltas=True`` on the iterators (yield :class:`~detok_plugin.Delta` objects instead of
strings), and :class:`DetokStopCriteria`, a ``StoppingCriteria`` that ends ``generate()``
at a stop string by asking the streamer's own state (one matcher, not two).

Switching it on without editing the application (``docs/transformers.md``):

* :func:`install` rebinds ``TextStreamer``, ``TextIteratorStreamer``,
  ``AsyncTextIteratorStreamer`` and ``TextDiffusionStreamer`` (where the installed
  transformers has it) in ``transformers``, ``transformers.generation`` and
  ``transformers.generation.streamers``; :func:`uninstall` restores the originals.
* ``DETOK_PLUGIN=1`` in the environment does the same at interpreter start, through a
  one-line ``.pth`` file that ``python -m detok_plugin.integrations.transformers install-pth``
  writes (or that you add yourself: :data:`PTH_LINE`). It imports nothing from transformers
  at start; it patches when ``transformers.generation.streamers`` is first imported.

This module imports transformers lazily: importing it is cheap and works without
transformers; :func:`install` and :class:`DetokStopCriteria` raise an ImportError naming
``pip install detok-plugin[transformers]`` when it is missing.

>>> import torch
>>> from detok_plugin import TokenTable
>>> table = TokenTable("byte_level", (b"\\xf0\\x9f", b"\\xab", b"\\xa8", b"Hi "), frozenset())
>>> streamer = DetokIteratorStreamer(table, skip_prompt=True)
>>> streamer.put(torch.tensor([[3]]))          # the prompt: skipped, as with TextIteratorStreamer
>>> for i in (3, 0, 1, 2):                     # 🫨 is three byte tokens
...     streamer.put(torch.tensor([i]))
>>> streamer.end()
>>> list(streamer)                              # one item per put, then end()'s
['Hi ', '', '', '🫨', '']
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from queue import Queue
from types import ModuleType
from typing import Any, Literal

from detok_plugin.integrations._import_hook import PTH_ACTIONS, ImportHook, manage_pth

from detok_plugin import Delta, DetokenizerState, TagSet

__all__ = [
    "ENV_FLAG",
    "PTH_LINE",
    "PTH_NAME",
    "AsyncDetokIteratorStreamer",
    "DetokDiffusionStreamer",
    "DetokIteratorStreamer",
    "DetokStopCriteria",
    "DetokStreamer",
    "install",
    "installed",
    "uninstall",
]

#: The environment variable read (only) by :func:`_startup`, once, at interpreter start.
ENV_FLAG = "DETOK_PLUGIN"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})

#: The ``.pth`` file and its one line. Python's ``site`` module executes ``.pth`` lines that
#: start with ``import``; this one costs a dict lookup unless ``DETOK_PLUGIN`` is set.
PTH_NAME = "detok_plugin_transformers.pth"
PTH_LINE = (
    'import os; "DETOK_PLUGIN" in os.environ and '
    '__import__("detok_plugin.integrations.transformers", fromlist=["_startup"])._startup()'
)

Reasoning = Literal["separate", "strip", "inline"]

_HINT = "pip install detok-plugin[transformers]"
# Stock TextStreamer's own message for batch input: a drop-in refuses with the same words.
_BATCH_ERROR = "TextStreamer only supports batch size 1"
# Decode options the core reproduces from its token tables; anything else is honoured by
# calling the tokenizer's own decode (the core's generic path).
_CORE_DECODE_KWARGS = frozenset({"skip_special_tokens", "spaces_between_special_tokens"})
_STREAMERS = "transformers.generation.streamers"
_DIFFUSION_BATCH_ERROR = "TextDiffusionStreamer only supports batch size 1"


def _require_transformers() -> ModuleType:
    """Import transformers, or say which extra installs it."""
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"detok_plugin.integrations.transformers needs transformers; install it with: {_HINT}"
        ) from exc
    return transformers


class _DecodeWith:
    """A tokenizer view whose ``decode`` always applies the streamer's extra decode kwargs.

    The core reproduces ``skip_special_tokens`` (and ``spaces_between_special_tokens``)
    from its tables; any other decode option (``clean_up_tokenization_spaces=...``) is
    honoured by decoding with the tokenizer itself, which this view makes the core do:
    it has ``decode`` but no vocabulary, so the core takes its generic window path.
    """

    __slots__ = ("_tokenizer", "_kwargs", "clean_up_tokenization_spaces", "eos_token_id")

    def __init__(self, tokenizer: Any, kwargs: dict[str, Any]) -> None:
        self._tokenizer = tokenizer
        self._kwargs = kwargs
        self.clean_up_tokenization_spaces = bool(
            kwargs.get("clean_up_tokenization_spaces", getattr(tokenizer, "clean_up_tokenization_spaces", False))
        )
        self.eos_token_id = getattr(tokenizer, "eos_token_id", None)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, **self._kwargs)

    def __len__(self) -> int:
        return len(self._tokenizer)


def _merge(deltas: Sequence[Delta]) -> Delta:
    """One Delta for several pushes (the criteria may push before ``put`` arrives)."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    return Delta(
        "".join(d.text for d in deltas),
        "".join(d.reasoning for d in deltas),
        tuple(t for d in deltas for t in d.tool_calls),
        last.finish_reason,
        last.stop_reason,
        sum(d.consumed for d in deltas),
    )


class DetokStreamer:
    """``TextStreamer`` with exact, prompt text: prints each character when its token arrives.

    Same constructor and contract as ``transformers.TextStreamer``: ``generate()`` calls
    ``put`` with the prompt (2-D), then with each step's tokens, then ``end()``; the text
    goes to the overridable ``on_finalized_text(text, stream_end=False)``, once per ``put``
    (often ``""``) and once at ``end()``. Batch input (more than one row) raises the same
    ``ValueError`` as ``TextStreamer``. After ``end()`` the streamer is ready for another
    ``generate()``.

    What differs is the text: each ``put`` pushes its ids into one
    :class:`~detok_plugin.DetokenizerState`, so the joined text is exactly
    ``tokenizer.decode(ids, **decode_kwargs)`` (the generated ids alone with
    ``skip_prompt=True``, the prompt and the generated ids otherwise), each character
    leaves in the ``put`` of the token that completes it, and nothing is re-decoded.

    Optional, keyword-only: ``stop`` (strings that end the stream; the text from the stop
    on is cut; pair with :class:`DetokStopCriteria` to end ``generate()`` there too),
    ``tags`` (a :class:`~detok_plugin.TagSet` or preset name such as ``"qwen3"``) and
    ``reasoning`` (``"separate"``, ``"strip"`` or ``"inline"``, as in the core). Strings carry
    the content channel only: with ``tags`` and ``reasoning="separate"`` the reasoning and
    tool-call text reach :meth:`on_finalized_delta`, not ``on_finalized_text``.

    With ``tags`` and ``skip_prompt=True`` the prompt is given to the state as context, so
    a chat template that ends inside ``<think>`` starts the stream in reasoning. On a
    SentencePiece tokenizer the first character can then be the space that
    ``decode(generated ids)`` strips (the full decode keeps it).
    """

    def __init__(
        self,
        tokenizer: Any,
        skip_prompt: bool = False,
        *,
        stop: str | Iterable[str] | None = (),
        tags: TagSet | str | None = None,
        reasoning: Reasoning = "separate",
        **decode_kwargs: Any,
    ) -> None:
        # An instance of transformers' BaseStreamer too, where transformers is installed
        # (see _with_base_streamer): the class statement cannot name BaseStreamer, since
        # this module must import without transformers (the DETOK_PLUGIN start-up hook).
        self.__class__ = _with_base_streamer(type(self))
        # The stock attributes, under their stock names.
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.decode_kwargs = decode_kwargs
        self.token_cache: list[int] = []  # the ids of the current stream (stock: since the last newline)
        self.print_len = 0  # characters released so far in the current stream
        self.next_tokens_are_prompt = True
        # Ours.
        self.stop: tuple[str, ...] = (stop,) if isinstance(stop, str) else tuple(stop or ())
        self.tags: TagSet | None = TagSet.preset(tags) if isinstance(tags, str) else tags
        self.reasoning: Reasoning = reasoning
        self.finish_reason: str | None = None  # "stop" once a stop string ended the stream
        self.stop_reason: str | int | None = None
        # Options the core cannot reproduce from its tables send every decode through the
        # tokenizer itself (the generic path), with all options but skip_special_tokens,
        # which the core passes on its own.
        if set(decode_kwargs) - _CORE_DECODE_KWARGS:
            extra = {k: v for k, v in decode_kwargs.items() if k != "skip_special_tokens"}
            self._source: Any = _DecodeWith(tokenizer, extra)
        else:
            self._source = tokenizer
        self._options: dict[str, Any] = {
            "skip_special_tokens": bool(decode_kwargs.get("skip_special_tokens", False)),
            "spaces_between_special_tokens": bool(decode_kwargs.get("spaces_between_special_tokens", True)),
            "stop": self.stop,
            "tags": self.tags,
            "reasoning": reasoning,
            # generate() stops at EOS itself, and decode shows the EOS token's text unless
            # skip_special_tokens drops it: the stream must not treat EOS as a stop.
            "eos_token_ids": (),
        }
        # Build one state now: bad options fail here, not in generate()'s thread, and the
        # token table is built (and cached by the core) before the first token.
        self.path: str = DetokenizerState.from_tokenizer(self._source, **self._options).path
        self._reset()

    # --- the streamer protocol ---------------------------------------------------------

    def put(self, value: Any) -> None:
        """Receive the prompt (first call) or new token ids, and release the settled text."""
        shape = tuple(value.shape)
        if len(shape) > 1 and shape[0] > 1:
            raise ValueError(_BATCH_ERROR)
        if len(shape) > 1:
            value = value[0]
        ids = value.tolist()
        if isinstance(ids, int):  # a 0-d tensor
            ids = [ids]
        if self._prompt_len is None:  # the first put of a stream is the prompt
            self._prompt_len = len(ids)
            self.finish_reason = self.stop_reason = None
            if self.skip_prompt and self.next_tokens_are_prompt:
                self.next_tokens_are_prompt = False
                context = ids if self.tags is not None else ()
                self._state = DetokenizerState.from_tokenizer(self._source, prompt_ids=context, **self._options)
                return
            # Not skipped: the prompt is the start of the stream's text.
            self._state = DetokenizerState.from_tokenizer(self._source, **self._options)
            self._push(ids)
        else:
            # Ids the stopping criteria already pushed (it sees each step first) are skipped.
            start = self._seen
            self._seen += len(ids)
            fresh = ids[max(0, self._fed - start) :]
            self._fed = max(self._fed, self._seen)
            self._push(fresh)
        self._release(stream_end=False)

    def end(self) -> None:
        """Release everything held (an incomplete tail as the decode renders it) and close."""
        state = self._state
        if state is not None and not state.finished:
            self._pending.append(state.finish())
        self._release(stream_end=True)
        self.token_cache = []
        self.print_len = 0
        self.next_tokens_are_prompt = True
        self._reset()

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        """Print the new text; at the end of the stream, also a newline (as ``TextStreamer``)."""
        print(text, flush=True, end="" if not stream_end else None)

    def on_finalized_delta(self, delta: Delta, stream_end: bool = False) -> None:
        """Typed hook: every release as a :class:`~detok_plugin.Delta`, once per ``put``.

        The default passes ``delta.text`` to :meth:`on_finalized_text`; override it to see
        reasoning and tool calls as well.
        """
        self.on_finalized_text(delta.text, stream_end)

    # --- internals ---------------------------------------------------------------------

    def _reset(self) -> None:
        self._state: DetokenizerState | None = None
        self._prompt_len: int | None = None
        self._seen = 0  # generated ids received through put()
        self._fed = 0  # generated ids pushed into the state (by put() or the criteria)
        self._pending: list[Delta] = []

    def _push(self, ids: list[int]) -> None:
        state = self._state
        if not ids or state is None or state.finished:
            return  # after a stop string, later ids are cut (as the core does)
        delta = state.push(ids)
        self.token_cache.extend(ids[: delta.consumed])
        self._pending.append(delta)
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason

    def _release(self, *, stream_end: bool) -> None:
        delta = _merge(self._pending) if self._pending else Delta()
        self._pending = []
        self.print_len += len(delta.text)
        self.on_finalized_delta(delta, stream_end)

    def _sync(self, input_ids: Any) -> bool:
        """Push the ids in ``input_ids`` (batch, seq) that the state has not seen; True once
        a stop string has ended the stream. Called by :class:`DetokStopCriteria`."""
        if input_ids.shape[0] != 1:
            raise ValueError(_BATCH_ERROR)
        if self._prompt_len is None:
            raise RuntimeError(
                "DetokStopCriteria saw tokens before its streamer saw the prompt: pass the "
                "same streamer to generate(streamer=...) as to DetokStopCriteria(streamer)"
            )
        state = self._state
        if state is not None and not state.finished:
            fresh = input_ids[0, self._prompt_len + self._fed :].tolist()
            self._fed += len(fresh)
            self._push(fresh)
        return self.finish_reason == "stop"


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


@functools.cache
def _with_base_streamer(cls: type) -> type:
    """``cls``, or where transformers is installed a subclass of it and of transformers'
    ``BaseStreamer`` (same name and qualified name), so that ``isinstance(s, BaseStreamer)``
    holds for our streamers as for stock ones. One per class, made at its first instance,
    whose ``__class__`` :meth:`DetokStreamer.__init__` sets to it: BaseStreamer adds nothing
    but its type (no slots, no state; its ``put``/``end`` come after ours)."""
    try:
        from transformers.generation.streamers import BaseStreamer
    except ImportError:
        return cls
    if issubclass(cls, BaseStreamer):
        return cls
    return type(cls.__name__, (cls, BaseStreamer), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})


class DetokStopCriteria:
    """A ``StoppingCriteria`` that ends ``generate()`` when the streamer's stop string appears.

    It asks the streamer's own :class:`~detok_plugin.DetokenizerState` (one matcher, not
    two): ``generate()`` calls the criteria with the step's ``input_ids`` *before* it calls
    ``streamer.put``, so the criteria pushes the new ids into the streamer's state, and
    ``put`` then releases what they settled without pushing them again. A stop string that
    spans tokens, or completes inside a multi-byte character, ends generation at the token
    that completes it.

    Usage::

        streamer = DetokIteratorStreamer(tok, skip_prompt=True, stop=["\\n\\n"])
        model.generate(**inputs, streamer=streamer,
                       stopping_criteria=[DetokStopCriteria(streamer)])

    It is registered as a virtual subclass of ``transformers.StoppingCriteria``. Batch size
    above one raises ``ValueError`` (as the streamer does). Limitation: on Apple ``mps``,
    where ``generate()`` defers its stop check by one step, an extra step's token reaches
    the criteria after EOS has ended generation; it is pushed into the stream too.
    """

    def __init__(self, streamer: DetokStreamer) -> None:
        _require_transformers()
        from transformers.generation.stopping_criteria import StoppingCriteria

        StoppingCriteria.register(DetokStopCriteria)
        if not isinstance(streamer, DetokStreamer):
            raise TypeError(f"DetokStopCriteria needs a DetokStreamer (or subclass), not {type(streamer).__name__}")
        if not streamer.stop:
            raise ValueError("DetokStopCriteria needs a streamer built with stop=[...]")
        self.streamer = streamer

    def __call__(self, input_ids: Any, scores: Any = None, **kwargs: Any) -> Any:
        import torch  # present wherever generate() runs

        done = self.streamer._sync(input_ids)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


# --- switching it on: install(), uninstall(), DETOK_PLUGIN=1 ------------------------------

_lock = threading.RLock()
_originals: dict[str, Any] = {}


def _namespaces() -> list[ModuleType]:
    """Every module through which code reaches the streamer classes by name."""
    names = (_STREAMERS, "transformers.generation", "transformers")
    return [m for m in (sys.modules.get(n) for n in names) if m is not None]


def _ours() -> dict[str, type]:
    """transformers' streamer names and the drop-in each is rebound to."""
    return {
        "TextStreamer": DetokStreamer,
        "TextIteratorStreamer": DetokIteratorStreamer,
        "AsyncTextIteratorStreamer": AsyncDetokIteratorStreamer,
        "TextDiffusionStreamer": DetokDiffusionStreamer,  # transformers 5.x
    }


def _patch(streamers: ModuleType) -> None:
    with _lock:
        if _originals:
            return
        ours = {name: cls for name, cls in _ours().items() if hasattr(streamers, name)}
        for name in ours:
            _originals[name] = getattr(streamers, name)
        # Rebinding the defining module covers every later lookup: transformers and
        # transformers.generation are lazy modules that resolve names from it on first
        # access. Names they already resolved and cached are rebound as well.
        for module in _namespaces():
            for name, cls in ours.items():
                setattr(module, name, cls)


#: Waits, costing nothing, for transformers' streamers to be imported (DETOK_PLUGIN=1).
_HOOK = ImportHook(_STREAMERS, _patch)


def install() -> None:
    """Make transformers' own streamer names build ours, for every later lookup.

    After ``install()``, ``transformers.TextStreamer(...)``, ``from transformers import
    TextIteratorStreamer`` and ``from transformers.generation.streamers import ...`` give
    :class:`DetokStreamer`, :class:`DetokIteratorStreamer`,
    :class:`AsyncDetokIteratorStreamer` and :class:`DetokDiffusionStreamer`. A name bound before ``install()`` (a module that
    ran ``from transformers import TextStreamer`` earlier) keeps the stock class: call it
    early, or use ``DETOK_PLUGIN=1``. Idempotent; :func:`uninstall` undoes it.
    """
    _require_transformers()
    import importlib

    _patch(importlib.import_module(_STREAMERS))


def uninstall() -> bool:
    """Restore transformers' own streamers (and disarm the ``DETOK_PLUGIN`` hook).

    Returns whether anything was undone. Classes defined by subclassing ours while it was
    installed keep ours as their base.
    """
    with _lock:
        undone = _HOOK.disarm()
        if _originals:
            for module in _namespaces():
                for name, cls in _originals.items():
                    setattr(module, name, cls)
            _originals.clear()
            undone = True
        return undone


def installed() -> bool:
    """Whether transformers' streamer names currently resolve to ours."""
    return bool(_originals)


def _arm() -> None:
    """Patch now if transformers' streamers are loaded, else when they are first imported."""
    with _lock:
        _HOOK.arm()


def _startup() -> None:
    """Called by the ``.pth`` line at interpreter start: honour ``DETOK_PLUGIN``.

    ``1``/``true``/``yes``/``on`` arm the patch; ``0``/``false``/``no``/``off``/empty do
    nothing; anything else warns and does nothing. It never raises: a ``.pth`` line that
    raises would print a traceback at every interpreter start.
    """
    value = os.environ.get(ENV_FLAG, "").strip().lower()
    if value in _FALSE:
        return
    if value not in _TRUE:
        warnings.warn(f"{ENV_FLAG}={value!r} is not one of 1/0/true/false/yes/no/on/off; ignored", stacklevel=2)
        return
    try:
        _arm()
    except Exception as exc:  # never break interpreter start
        warnings.warn(f"{ENV_FLAG}=1: could not arm the transformers streamer patch: {exc!r}", stacklevel=2)


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m detok_plugin.integrations.transformers {install-pth,remove-pth,show-pth}``."""
    import argparse
    import sysconfig
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="python -m detok_plugin.integrations.transformers",
        description=f"Manage the one-line .pth file that makes {ENV_FLAG}=1 switch transformers' streamers to ours.",
    )
    parser.add_argument("action", choices=PTH_ACTIONS)
    parser.add_argument(
        "--site-dir", type=Path, default=Path(sysconfig.get_paths()["purelib"]),
        help="site-packages directory to write to (default: this interpreter's purelib)",
    )
    args = parser.parse_args(argv)
    what = f"{ENV_FLAG}=1 now switches transformers' streamers to detok-plugin's"
    return manage_pth(args.action, args.site_dir / PTH_NAME, PTH_LINE, what)


if __name__ == "__main__":
    raise SystemExit(_main())
