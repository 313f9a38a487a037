"""A request the core failed inside vLLM's loop: vLLM's stock detokenizer serves the rest.

vLLM's output handler calls the detokenizer of every request in one loop, and an exception
there ends the handler: every request in flight fails and the server stops answering
(``AsyncLLM.output_handler``). So an exception the plugin did not plan for (a bug: unknown
ids are already logged and skipped) must end in one request, and quietly for its client.
The adapter then hands that request over, once, with an ERROR log line:

1. vLLM's stock detokenizer is built for the request (its own factory, its own stop
   strings) and fed the ids the stream took before the failing step, then that step;
2. its text replaces the stream's from then on, after the text the stream released (which
   stays released, given to vLLM yet or not: stock holds a stop string's length of text
   the stream had released, and loses bytes held at the end); nothing given is taken back;
3. should stock fail too, the request goes on with no more text, as vLLM's detokenizer for
   ``detokenize=False`` requests does, and ends as the engine ends it.

From the hand-over on, the request's text is stock vLLM's, with stock's own differences
(docs/vllm.md lists them); before it, it was the plugin's. Both are the full decode on
ordinary text, so the client sees one text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ._framework import detokenizer_api

__all__ = ["StockHandover"]

logger = logging.getLogger("vllm.detok_plugin")


class StockHandover:
    """The rest of one request on vLLM's stock detokenizer (see the module docstring).

    What the stream released: ``released``, all of it (``""`` on DELTA requests, which do not
    keep it); ``pending``, the part no delta call returned yet; ``sent``, how many
    characters delta calls cover, ``pending`` included.
    """

    __slots__ = ("_stock", "_released", "_pending", "_sent", "_request_id")

    def __init__(self, stock: Any, *, released: str, pending: str, sent: int, request_id: str) -> None:
        self._stock = stock
        self._released = released
        self._pending = pending
        self._sent = sent
        self._request_id = request_id

    @classmethod
    def start(
        cls, build: Callable[[], Any], ids: Sequence[int], *, released: str, pending: str, sent: int, request_id: str
    ) -> StockHandover:
        """Build stock's detokenizer and feed it ``ids`` (the stream's ids before the
        failing step); a failure leaves the request with no more text (step 3)."""
        self = cls(None, released=released, pending=pending, sent=sent, request_id=request_id)
        try:
            self._stock = build()
            if ids:
                self._stock.update(list(ids), False)
        except Exception as exc:
            self._no_more_text(exc, ids)
        return self

    @property
    def token_ids(self) -> list[int]:
        return self._stock.output_token_ids  # type: ignore[no-any-return]

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Stock's ``update``, never raising."""
        before = self._stock.num_output_tokens()
        try:
            return self._stock.update(new_token_ids, stop_terminated)  # type: ignore[no-any-return]
        except Exception as exc:
            self._no_more_text(exc, [*self.token_ids[:before], *new_token_ids])
            return None

    def text(self, finished: bool, delta: bool) -> str:
        """What ``get_next_output_text(finished, delta)`` returns: what the stream released,
        then stock's text beyond it (``delta``: what no delta call returned yet)."""
        try:
            full: str = self._stock.get_next_output_text(finished, False)
        except Exception as exc:
            self._no_more_text(exc, self.token_ids)
            full = ""
        if delta:
            text = self._pending + full[self._sent :]
            self._pending = ""
            self._sent = max(self._sent, len(full))
            return text
        if len(full) > len(self._released):
            self._released = full
        return self._released

    def _no_more_text(self, exc: Exception, ids: Sequence[int]) -> None:
        logger.error(
            "detok-plugin: request %s: vLLM's stock detokenizer failed too (%r); the request "
            "goes on with no more text",
            self._request_id,
            exc,
        )
        self._stock = detokenizer_api()[0].IncrementalDetokenizer()  # vLLM's detokenizer for detokenize=False
        self._stock.token_ids.extend(ids)
