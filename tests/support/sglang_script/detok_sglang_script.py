"""A custom logit processor that forces a scripted list of token ids, for SGLang tests.

A real SGLang server started with ``--enable-custom-logit-processor`` and this directory on
its ``PYTHONPATH`` loads :class:`ScriptedIds` from the request (SGLang pickles the class by
reference, with dill: ``ScriptedIds.to_str()``). Each request's ``custom_params`` carries
``{"ids": [...]}``: at output step k every logit but that of ``ids[k]`` is set to -inf, so the
real scheduler, detokenizer and HTTP layer see exactly those ids (then the model's own,
should ``max_tokens`` run past the script). Imported only by the SGLang server process
(``tests/integrations/sglang/test_sglang_server.py``).
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
except ImportError:  # the test venv's doctest collection imports this module; SGLang is not there
    CustomLogitProcessor = object  # type: ignore[assignment,misc]


class ScriptedIds(CustomLogitProcessor):
    """Forces ``custom_params["ids"][len(req.output_ids)]`` for each request."""

    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]] | None = None) -> torch.Tensor:
        for row, params in enumerate(custom_param_list or []):
            ids = params.get("ids") or []
            req = params.get("__req__")
            step = len(req.output_ids) if req is not None else 0
            if step < len(ids):
                logits[row, :] = float("-inf")
                logits[row, ids[step]] = 0.0
        return logits
