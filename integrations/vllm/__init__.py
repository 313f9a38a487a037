"""vLLM: replace the v1 incremental detokenizer with detok-plugin, behind a flag.

vLLM's ``OutputProcessor`` builds one detokenizer per request through
``vllm.v1.engine.detokenizer.IncrementalDetokenizer.from_new_request`` and then calls
four things on it each engine step::

    update(new_token_ids, stop_terminated) -> matched stop string | None
    get_next_output_text(finished, delta) -> str
    output_token_ids                        (list of the request's output ids)
    num_output_tokens() -> int

:func:`register` (the ``vllm.general_plugins`` entry point) swaps that factory for one that
returns a :class:`VllmDetokenizer` over a :class:`detok_plugin.ServingStream` whenever
the request has a tokenizer. Three things change for clients, all visible only in streams:

1. no U+FFFD from a character split across tokens or steps, and none taken back later;
2. text near a stop string is held only while it is a genuine prefix of a stop string
   (stock vLLM holds ``max(len(stop)) - 1`` characters at every step);
3. text that stock vLLM loses (bytes held when the stream ends, a prompt ending inside a
   character) follows the full decode instead.

Switched on by ``DETOK_PLUGIN=1`` (or ``VLLM_PLUGINS`` naming ``detok_plugin``; ``plugin``
says exactly how). The package: ``plugin`` (the entry point and the switch),
``detokenizer`` (the adapter), ``handover`` (a request the core failed goes on stock),
``xargs`` (the tags a chat parser passes to the detokenizer), ``chat`` and
``chat_registry`` (the ``detok_*`` parsers), ``parser_names`` (their names, checked at
vLLM's argument validation, the switch off too), ``harmony`` (gpt-oss), ``tool_ids``, and
``_framework``, the one module that imports vLLM and checks its contract: a new vLLM
version is a change there.
"""

from __future__ import annotations

from ._framework import VERIFIED_VLLM_VERSIONS, contract_problems
from .detokenizer import VllmDetokenizer
from .plugin import PLUGIN_NAME, Settings, is_registered, register, unregister

__all__ = [
    "PLUGIN_NAME",
    "VERIFIED_VLLM_VERSIONS",
    "Settings",
    "VllmDetokenizer",
    "contract_problems",
    "is_registered",
    "register",
    "unregister",
]
