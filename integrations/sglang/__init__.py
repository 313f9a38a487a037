"""SGLang: detok-plugin as an SGLang plugin, behind ``DETOK_PLUGIN=1``.

SGLang (0.5.23) runs the entry points of the group ``sglang.srt.plugins`` in every process
it starts. :func:`register` (``plugin``) patches two seams there, when the switch is on:

1. the scheduler's stop strings (``Req._check_str_based_finish`` and
   ``Req.check_match_stop_str_prefix``): one :class:`detok_plugin.ServingStream` per
   request with stop strings sees every output id once, so a stop the model spells in any
   number of tokens (one token per character, a CJK stop in byte tokens, across a skipped
   special token) ends the request where its text first contains it (``scheduler``);
2. the detokenizer step (``DetokenizerManager._decode_batch_token_id_output``): one
   ``ServingStream`` per request id turns its ids into text, each character sent once, the
   moment it is complete (``detokenizer``).

The package: ``plugin`` (the entry point and the switch), ``scheduler``, ``detokenizer``,
and ``_framework``, the one module that imports SGLang and checks its contract: a new
SGLang version is a change there. docs/sglang.md says what changes for clients.
"""

from __future__ import annotations

from ._framework import VERIFIED_SGLANG_VERSIONS, contract_problems
from .plugin import PLUGIN_NAME, Settings, is_registered, register, unregister

__all__ = [
    "PLUGIN_NAME",
    "VERIFIED_SGLANG_VERSIONS",
    "Settings",
    "contract_problems",
    "is_registered",
    "register",
    "unregister",
]
