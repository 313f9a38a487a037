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
  at start; it patches when ``transformers.generation.streamers`` is first imported, and
  then says what the switch did in one line (nothing in a process that never imports them).

The package: ``streamers`` (``DetokStreamer``), ``iterators`` (the queue-backed ones),
``stop_criteria``, ``patching`` (switching it on), and ``_framework``, the one module that
imports transformers, lazily: importing the package is cheap and works without
transformers; :func:`install` and :class:`DetokStopCriteria` raise an ImportError naming
``pip install transformers`` when it is missing (detok-plugin never installs a framework).

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

from collections.abc import Sequence

from ..common.startup import pth_command, pth_line
from ..common.switch import ENV_FLAG
from .iterators import AsyncDetokIteratorStreamer, DetokDiffusionStreamer, DetokIteratorStreamer
from .patching import install, installed, startup, uninstall
from .stop_criteria import DetokStopCriteria
from .streamers import DetokStreamer

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

#: The ``.pth`` file and its one line: a dict lookup at interpreter start unless the flag is set.
PTH_NAME = "detok_plugin_transformers.pth"
PTH_LINE = pth_line("detok_plugin.integrations.transformers")

# The drop-ins' public home, as users import them (and as ``type(streamer)`` shows them).
for _cls in (DetokStreamer, DetokIteratorStreamer, AsyncDetokIteratorStreamer, DetokDiffusionStreamer, DetokStopCriteria):
    _cls.__module__ = "detok_plugin.integrations.transformers"

#: What the ``.pth`` line calls.
_startup = startup


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m detok_plugin.integrations.transformers {install-pth,remove-pth,show-pth}``."""
    return pth_command(argv, module="detok_plugin.integrations.transformers", pth_name=PTH_NAME, what="switches transformers' streamers to detok-plugin's")
