"""``detok-plugin serve``: the reference runner behind an OpenAI-compatible HTTP API.

Routes (127.0.0.1 by default):

``POST /v1/chat/completions``, ``POST /v1/completions``
    OpenAI's request and response shapes (``openai_api.py``), streamed as Server-Sent Events
    with ``"stream": true``. Every choice's text comes from a :class:`~detok_plugin.ServingStream`
    (``scheduler.py``): exact, no U+FFFD from split characters, stops cut where they start.
``POST /naive/v1/chat/completions?mode=decode|bytes``
    The same tokens streamed the way a naive server streams them, for the page to compare
    with: ``decode`` ships each token decoded alone (U+FFFD for split characters, made by the
    tokenizer's own decode); ``bytes`` ships each token's own UTF-8 bytes inside its event,
    so the client's ``TextDecoder`` meets the split characters between event framing.
``GET /``
    The page (``page.html``): one prompt, the two streams side by side, each read with the
    browser's ``TextDecoder`` in streaming mode, with a count of U+FFFD in each.
``GET /v1/models``, ``GET /health``

Bad requests get a 4xx JSON body in OpenAI's shape; a full queue gets 503. Generation runs
on one thread that batches waiting requests (``scheduler.py``); the event loop only moves
bytes. Every request leaves one access line (``access_log.py``) when its response ends.
:func:`running` starts a server in a thread (tests, the soak script); :func:`serve` is the
CLI's blocking entry point, and sends the access lines to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from importlib import resources
from typing import TYPE_CHECKING, Any

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - exercised only where the extra is missing
    raise ImportError("detok-plugin serve needs starlette and uvicorn: pip install 'detok-plugin[serve]'") from exc

from .access_log import AccessLog, log_to_stderr
from .openai_api import Envelope, Kind, RequestError, ServeDefaults, parse_request, sse, usage
from .prompts import DEFAULT_CHAT_PROMPT
from .scheduler import ChoiceEvent, EndEvent, Job, NaiveMode, QueueFullError, Scheduler
from .settings import GenerationSettings

if TYPE_CHECKING:
    from .runner import Runner

__all__ = ["create_app", "defaults_for", "render_page", "running", "serve"]

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_NAIVE_MODES: dict[str, NaiveMode] = {"decode": "decode", "bytes": "bytes"}


def create_app(runner: Runner, defaults: ServeDefaults, *, max_batch: int = 16) -> Starlette:
    """The ASGI app: routes over one :class:`Scheduler` started and closed with the app."""
    scheduler = Scheduler(runner, max_batch=max_batch)
    api = _Api(runner, defaults, scheduler)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        scheduler.start()
        try:
            yield
        finally:
            scheduler.close()

    routes = [
        Route("/", api.page, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/naive/v1/chat/completions", api.naive_chat, methods=["POST"]),
    ]
    handlers = {HTTPException: _http_error, RequestError: _request_error, QueueFullError: _queue_full}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan, middleware=[Middleware(AccessLog)])
    app.state.scheduler = scheduler
    return app


class _Api:
    """The route handlers, sharing the runner, the defaults and the scheduler."""

    def __init__(self, runner: Runner, defaults: ServeDefaults, scheduler: Scheduler) -> None:
        self.runner = runner
        self.defaults = defaults
        self.scheduler = scheduler
        self.created = int(time.time())
        self._page = render_page(defaults.model)

    async def page(self, _request: Request) -> Response:
        return HTMLResponse(self._page)

    async def health(self, _request: Request) -> Response:
        # batches: generate() calls so far (a test reads it to see requests share batches).
        return JSONResponse({"status": "ok", "batches": self.scheduler.batches, "waiting": self.scheduler.waiting})

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.defaults.model, "object": "model", "created": self.created, "owned_by": "detok-plugin",
             "max_model_len": self.defaults.context}]})

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat", None)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion", None)

    async def naive_chat(self, request: Request) -> Response:
        asked = request.query_params.get("mode", "decode")
        mode = _NAIVE_MODES.get(asked)
        if mode is None:
            raise RequestError(f"mode must be 'decode' or 'bytes', got {asked!r}", param="mode")
        if mode == "bytes" and not self.scheduler.byte_mode:
            raise RequestError("the byte mode needs a byte-level tokenizer; use mode=decode", param="mode")
        return await self._generate(request, "chat", mode)

    async def _generate(self, request: Request, kind: Kind, naive: NaiveMode | None) -> Response:
        body = await _json_body(request)
        req = parse_request(body, kind, runner=self.runner, defaults=self.defaults)
        if naive is not None and (req.stop or not req.stream):
            raise RequestError("the naive endpoint only streams, and takes no 'stop'", param="stop")
        job = Job(req, asyncio.get_running_loop(), naive=naive)
        self.scheduler.submit(job)
        env = Envelope(kind, f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{secrets.token_hex(12)}",
                       int(time.time()), self.defaults.model)
        if req.stream:
            return StreamingResponse(_stream(job, env), media_type="text/event-stream", headers=_SSE_HEADERS)
        return await _whole(job, env)


def render_page(model: str, prompt: str = DEFAULT_CHAT_PROMPT) -> str:
    """The page at ``/`` for ``model``, with ``prompt`` in its prompt box."""
    page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    return page.replace("{{MODEL}}", html.escape(model)).replace("{{PROMPT}}", html.escape(prompt))


async def _stream(job: Job, env: Envelope) -> AsyncIterator[bytes]:
    """The SSE body: one event per choice delta that carries text, a final event per choice
    with its finish reason, usage when asked, then ``[DONE]``. Leaving early (the client
    went away) marks the job cancelled, and the scheduler drops its rows."""
    req = job.request
    opened: set[int] = set()
    pending: dict[int, list[int]] = {}
    try:
        while True:
            event = await job.events.get()
            if isinstance(event, EndEvent):
                if event.error is not None:
                    yield sse(RequestError(event.error, status=500).body())
                    return
                if req.include_usage:
                    yield sse(env.chunk([], usage(len(req.prompt_ids), event.completion_tokens)))
                yield b"data: [DONE]\n\n"
                return
            ids = pending.setdefault(event.index, [])
            ids.extend(event.token_ids)
            if not event.text and event.finish_reason is None:
                continue  # held back (a split character, a partial stop): nothing to send yet
            if isinstance(event.text, bytes):
                yield _naive_bytes_event(env, event)
            else:
                first = event.index not in opened
                opened.add(event.index)
                choice = env.choice(event.index, event.text, event.finish_reason, event.stop_reason, first=first,
                                    token_ids=ids if req.return_token_ids else None)
                yield sse(env.chunk([choice]))
            pending[event.index] = []
    finally:
        job.cancelled = True  # no-op when it finished; frees its rows when the client left


def _naive_bytes_event(env: Envelope, event: ChoiceEvent) -> bytes:
    """An OpenAI chunk whose content is the token's raw bytes, as a server that writes token
    pieces into its JSON does: ASCII is JSON-escaped, every other byte goes out as it is,
    so a split character's bytes sit between this event's framing and the next one's."""
    assert isinstance(event.text, bytes)
    marker = "\x00detok-raw\x00"
    head, tail = json.dumps(env.chunk([env.choice(event.index, marker, event.finish_reason, event.stop_reason)]),
                            separators=(",", ":")).split(json.dumps(marker)[1:-1])
    raw = b"".join(json.dumps(chr(b))[1:-1].encode() if b < 0x80 else bytes((b,)) for b in event.text)
    return b"data: " + head.encode() + raw + tail.encode() + b"\n\n"


async def _whole(job: Job, env: Envelope) -> Response:
    """The non-streamed answer: every choice's text joined, after the last token."""
    req = job.request
    texts: dict[int, list[str]] = {i: [] for i in range(req.n)}
    ids: dict[int, list[int]] = {i: [] for i in range(req.n)}
    ends: dict[int, tuple[str, str | int | None]] = {}
    try:
        while True:
            event = await job.events.get()
            if isinstance(event, EndEvent):
                break
            texts[event.index].append(str(event.text))
            ids[event.index].extend(event.token_ids)
            if event.finish_reason is not None:
                ends[event.index] = (event.finish_reason, event.stop_reason)
    finally:
        job.cancelled = True
    if event.error is not None:
        return JSONResponse(RequestError(event.error, status=500).body(), status_code=500)
    choices = [env.whole_choice(i, "".join(texts[i]), *ends[i], ids[i] if req.return_token_ids else None)
               for i in range(req.n)]
    return JSONResponse(env.response(choices, usage(len(req.prompt_ids), event.completion_tokens)))


async def _json_body(request: Request) -> Any:
    if "application/json" not in request.headers.get("content-type", "application/json"):
        raise RequestError("send the body as JSON (Content-Type: application/json)", status=415)
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from exc


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse({"error": {"message": exc.detail, "type": kind, "param": None, "code": None}},
                        status_code=exc.status_code, headers=exc.headers)


async def _request_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _queue_full(_request: Request, exc: Exception) -> Response:
    body = RequestError(str(exc), status=503).body()
    return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})


# --- running it ---------------------------------------------------------------------------


def defaults_for(runner: Runner, settings: GenerationSettings, *, max_batch: int = 16) -> ServeDefaults:
    """The server's defaults from the runner and the CLI's generation settings."""
    config = runner.model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return ServeDefaults(
        model=runner.name,
        max_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_k=settings.top_k,
        skip_special_tokens=settings.skip_special_tokens,
        context=int(getattr(text, "max_position_embeddings", 2048) or 2048),
        max_n=max_batch,
    )


def _config(app: Starlette, host: str = "127.0.0.1", port: int = 8000) -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on",
                          timeout_graceful_shutdown=5)


@contextlib.contextmanager
def running(runner: Runner, defaults: ServeDefaults, *, host: str = "127.0.0.1", port: int = 0,
            max_batch: int = 16) -> Iterator[str]:
    """Serve in a background thread for the ``with`` block; yields the base URL.

    ``port=0`` takes a free port (bound here, so the URL is known before the first request).
    """
    app = create_app(runner, defaults, max_batch=max_batch)
    server = uvicorn.Server(_config(app))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="detok-serve", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def serve(runner: Runner, defaults: ServeDefaults, *, host: str, port: int, max_batch: int) -> None:
    """Serve until interrupted (the CLI's ``serve``), one access line per request on stderr."""
    log_to_stderr()
    uvicorn.Server(_config(create_app(runner, defaults, max_batch=max_batch), host, port)).run()
