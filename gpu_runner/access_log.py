"""The server's access log: one line per request, as uvicorn's access log writes it, with its duration.

uvicorn logs a request when its response starts, so a streamed reply's line would come
before its first token and could not say how long the stream took. This ASGI middleware
logs when the response has ended (its last byte sent, or the client gone), in uvicorn's
words plus the time since the request arrived::

    127.0.0.1:52144 - "POST /v1/chat/completions HTTP/1.1" 200 1532.4 ms

Each line is one ``INFO`` record of the logger ``detok_plugin.gpu_runner.access``, with the
parts also on the record (``method``, ``path``, ``status``, ``duration_ms``).
``detok-plugin serve`` sends them to stderr (:func:`log_to_stderr`); an embedding program
routes them like any other logger's records.

>>> _path_with_query({"path": "/naive/v1/chat/completions", "query_string": b"mode=bytes"})
'/naive/v1/chat/completions?mode=bytes'
"""

from __future__ import annotations

import logging
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import IO, Any

__all__ = ["ACCESS_LOGGER", "AccessLog", "log_to_stderr"]

ACCESS_LOGGER = "detok_plugin.gpu_runner.access"
log = logging.getLogger(ACCESS_LOGGER)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class AccessLog:
    """ASGI middleware: after each HTTP request, one access line (other scopes pass through).

    A request whose handler raised before any response started is logged as 500, the status
    Starlette's error middleware (outside this one) then sends.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            _log_request(scope, status, (time.perf_counter() - start) * 1e3)


def _log_request(scope: Scope, status: int, duration_ms: float) -> None:
    client = scope.get("client")
    addr = f"{client[0]}:{client[1]}" if client else "-"
    method, path = scope["method"], _path_with_query(scope)
    log.info('%s - "%s %s HTTP/%s" %d %.1f ms', addr, method, path, scope.get("http_version", "1.1"), status,
             duration_ms, extra={"method": method, "path": path, "status": status, "duration_ms": duration_ms})


def _path_with_query(scope: Scope) -> str:
    """The request's path and query as uvicorn's access log shows them."""
    path = urllib.parse.quote(scope["path"])
    query = scope.get("query_string", b"")
    return f"{path}?{query.decode('ascii', 'replace')}" if query else path


def log_to_stderr(stream: IO[str] | None = None) -> logging.Handler:
    """Write the access lines to ``stream`` (default: stderr) in uvicorn's layout, and only
    there; returns the handler so that a caller can remove it."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    return handler
