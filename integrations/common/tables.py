"""A tokenizer's table built when a server starts, not inside its first request.

The core reads a tokenizer into a verified :class:`~detok_plugin.TokenTable` the first time a
stream opens on it (``build_table``, cached per tokenizer object): 0.2 s for SmolLM2's 49k
ids, 0.6-0.9 s for Qwen3's 151k, 1.3 s for gpt-oss's 200k on this project's CPU. Inside a
request that is a stall a stock server never has, and it lands on the server's output loop
(every request being served waits). :func:`warm` starts that build in a daemon thread as soon
as a shim sees the tokenizer a server will stream with, so it runs while the server starts
(:func:`warming` wraps the server's method that loads its tokenizer): vLLM builds its
``OutputProcessor`` before its engine core starts loading the model; SGLang's scheduler and
detokenizer load theirs (``init_tokenizer``) before the scheduler loads the model. A
request that arrives while the build runs waits for it (``build_table`` builds each table
once, under a lock), as it would have built it; nothing else changes. One line per tokenizer
says when the table is ready, and on which path.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from detok_plugin import build_table

__all__ = ["join", "warm", "warming"]

#: The tokenizers a build was started for, by id: a weak reference (the entry goes with the
#: tokenizer), or the tokenizer itself where it takes none (then at most 32 are kept).
_started: dict[int, Any] = {}
_threads: list[threading.Thread] = []
_lock = threading.Lock()


def warming(stock: Callable[..., Any], log: logging.Logger, where: str = "") -> Callable[..., Any]:
    """A server's method that sets ``self.tokenizer`` (``stock``, its ``__init__`` or its
    ``init_tokenizer``), then that tokenizer's table built in the background (:func:`warm`;
    ``where`` starts its line)."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = stock(self, *args, **kwargs)
        warm(getattr(self, "tokenizer", None), log, where)
        return result

    method.__name__ = method.__qualname__ = getattr(stock, "__name__", "method")
    return method


def warm(tokenizer: Any, log: logging.Logger, where: str = "") -> threading.Thread | None:
    """Start building ``tokenizer``'s table in a daemon thread, once per tokenizer object;
    returns the thread, or None (no tokenizer, or a build already started for it: a lookup).
    ``where`` starts the line that says it is ready (a process's name). Never raises: a
    tokenizer the table cannot read is found again, and handled, when a stream opens on it."""
    if tokenizer is None or _seen(tokenizer):
        return None
    with _lock:
        if _seen(tokenizer):
            return None
        key = id(tokenizer)
        try:
            _started[key] = weakref.ref(tokenizer, functools.partial(_forget, key))
        except TypeError:  # no weak reference
            if len(_started) >= 32:
                _started.pop(next(iter(_started)))
            _started[key] = tokenizer
        thread = threading.Thread(target=_build, args=(tokenizer, log, where), name="detok-plugin-table", daemon=True)
        _threads[:] = [t for t in _threads if t.is_alive()] + [thread]
    try:
        thread.start()
    except RuntimeError as exc:  # no thread to be had: the first stream builds the table
        log.debug("detok-plugin: the tokenizer's table is not built ahead: %r", exc)
        return None
    return thread


def _seen(tokenizer: Any) -> bool:
    entry = _started.get(id(tokenizer))
    return entry is not None and (entry() if isinstance(entry, weakref.ref) else entry) is tokenizer


def _forget(key: int, ref: weakref.ref[Any]) -> None:
    if _started.get(key) is ref:
        _started.pop(key, None)


def join(timeout: float | None = None) -> None:
    """Wait for the builds in flight (tests, and a caller that wants them done)."""
    with _lock:
        threads = list(_threads)
    for thread in threads:
        thread.join(timeout)


def _build(tokenizer: Any, log: logging.Logger, where: str) -> None:
    start = time.perf_counter()
    try:
        table, why = build_table(tokenizer)
    except Exception as exc:  # found again at the first stream, which handles it
        log.debug("detok-plugin: the tokenizer's table was not built at start-up: %r", exc)
        return
    name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    path = table.family if table is not None else f"generic: {why}"
    log.info("%sdetok-plugin: %s: tokenizer table ready (%s; %.2f s in a background thread)", where, name, path, time.perf_counter() - start)
