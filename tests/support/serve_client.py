"""A small HTTP client for ``detok-plugin serve`` in tests: stdlib only, bytes kept as sent.

``post(url, path, body)`` returns the status and either the JSON body or, for a streamed
answer, the SSE events' ``data`` payloads as raw bytes (so a test can decode them the way
a browser's streaming ``TextDecoder`` would, or check them byte for byte).
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    status: int
    body: bytes
    events: list[bytes] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)

    def chunks(self) -> list[dict[str, Any]]:
        """The streamed chunks as JSON (each payload decoded alone: it is whole JSON)."""
        return [json.loads(e) for e in self.events if e != b"[DONE]"]


def post(url: str, path: str, body: Any, *, timeout: float = 300, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> Reply:
    """POST ``body`` as JSON (or ``raw`` bytes); split an event-stream answer into events."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        data = raw if raw is not None else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        payload = resp.read()
        reply = Reply(resp.status, payload)
        if resp.getheader("content-type", "").startswith("text/event-stream"):
            for event in payload.split(b"\n\n"):
                if event.startswith(b"data: "):
                    reply.events.append(event[len(b"data: "):])
        return reply
    finally:
        conn.close()


def get(url: str, path: str, *, method: str = "GET") -> Reply:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return Reply(resp.status, resp.read())
    finally:
        conn.close()


def content(reply: Reply, index: int = 0) -> str:
    """A streamed choice's text, joined (chat ``delta.content`` or completion ``text``)."""
    out = []
    for chunk in reply.chunks():
        for choice in chunk["choices"]:
            if choice["index"] == index:
                out.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def token_ids(reply: Reply, index: int = 0) -> list[int]:
    return [i for chunk in reply.chunks() for c in chunk["choices"] if c["index"] == index
            for i in c.get("token_ids", [])]


def finish(reply: Reply, index: int = 0) -> tuple[str | None, Any]:
    for chunk in reply.chunks():
        for c in chunk["choices"]:
            if c["index"] == index and c.get("finish_reason") is not None:
                return c["finish_reason"], c.get("stop_reason")
    return None, None
