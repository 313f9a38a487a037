"""The one module of the transformers shim that imports transformers, and the contract it checks.

transformers is imported lazily: importing the shim is cheap and works without it;
:func:`require` raises an ImportError naming the extra to install when it is missing.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

__all__ = ["STREAMERS", "STREAMER_NAMES", "base_streamer", "contract_problems", "namespaces", "require", "stopping_criteria"]

#: The module that defines transformers' streamers.
STREAMERS = "transformers.generation.streamers"

#: transformers' streamer names the shim rebinds (``TextDiffusionStreamer``: transformers 5.x).
STREAMER_NAMES = ("TextStreamer", "TextIteratorStreamer", "AsyncTextIteratorStreamer", "TextDiffusionStreamer")

_HINT = "pip install transformers (detok-plugin never installs a framework)"


def require() -> ModuleType:
    """Import transformers, or say which extra installs it."""
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"detok_plugin.integrations.transformers needs transformers; install it with: {_HINT}"
        ) from exc
    return transformers


def base_streamer() -> type | None:
    """transformers' ``BaseStreamer``, or None where transformers is not installed."""
    try:
        from transformers.generation.streamers import BaseStreamer
    except ImportError:
        return None
    return BaseStreamer


def stopping_criteria() -> Any:
    """transformers' ``StoppingCriteria`` (an ABC our criteria registers with)."""
    require()
    from transformers.generation.stopping_criteria import StoppingCriteria

    return StoppingCriteria


def namespaces() -> list[ModuleType]:
    """Every loaded module through which code reaches the streamer classes by name."""
    names = (STREAMERS, "transformers.generation", "transformers")
    return [m for m in (sys.modules.get(n) for n in names) if m is not None]


def contract_problems(streamers: Any) -> list[str]:
    """How the loaded streamers module differs from what the shim replaces; [] if nothing.
    Only ``TextDiffusionStreamer`` may be missing (transformers 4.x)."""
    return [f"{STREAMERS} has no {name}" for name in STREAMER_NAMES[:3] if not hasattr(streamers, name)]
