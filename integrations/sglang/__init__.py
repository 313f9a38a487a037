"""SGLang: detok-plugin as an SGLang plugin (``sglang.srt.plugins``), behind ``DETOK_PLUGIN=1``.

Work in progress (issue 32): until the shim lands, :func:`register` keeps SGLang stock.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> bool:
    """The ``sglang.srt.plugins`` entry point; returns whether the plugin is on (not yet)."""
    return False
