"""The runner's framework imports, in one place, with an error that says what to install.

The core (``detok_plugin``) never imports torch; only modules of this package that run a
model import it, through here.
"""

from __future__ import annotations

try:
    import torch
    import transformers
except ImportError as exc:  # pragma: no cover - exercised only where torch is absent
    raise ImportError(
        "detok_plugin.gpu_runner needs torch and transformers: "
        "pip install 'detok-plugin[gpu]' torch (or run scripts/setup.sh)"
    ) from exc

__all__ = ["torch", "transformers"]
