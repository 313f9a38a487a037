"""``DetokStopCriteria``: end ``generate()`` at a stop string, asking the streamer's own state."""

from __future__ import annotations

from functools import cache
from typing import Any

from . import _framework
from .streamers import DetokStreamer

__all__ = ["DetokStopCriteria"]


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
        _register()
        if not isinstance(streamer, DetokStreamer):
            raise TypeError(f"DetokStopCriteria needs a DetokStreamer (or subclass), not {type(streamer).__name__}")
        if not streamer.stop:
            raise ValueError("DetokStopCriteria needs a streamer built with stop=[...]")
        self.streamer = streamer

    def __call__(self, input_ids: Any, scores: Any = None, **kwargs: Any) -> Any:
        import torch  # present wherever generate() runs

        done = self.streamer._sync(input_ids)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


@cache
def _register() -> None:
    """Make ``DetokStopCriteria`` a virtual subclass of transformers' ``StoppingCriteria``:
    once a process (an ImportError naming the extra, raised again each time, where
    transformers is missing), not at every request's criteria."""
    _framework.stopping_criteria().register(DetokStopCriteria)

