"""Whether a batch fits: an estimate of what it needs, against what the device has free.

Before allocating anything the runner refuses a batch whose estimate exceeds 90% of the
free memory, with :class:`BatchTooLargeError` saying how large a batch fits: on CPU an
allocation failure would otherwise surface as an untyped ``RuntimeError`` or the OOM killer.
"""

from __future__ import annotations

import os
from typing import Any

from ._deps import torch
from .errors import BatchTooLargeError

__all__ = ["check_batch_fits", "estimate_batch_bytes", "free_bytes"]

#: The share of free memory a batch may plan to use; the rest absorbs the estimate's error.
BUDGET = 0.9


def estimate_batch_bytes(config: Any, batch: int, prompt_len: int, max_new_tokens: int, elem: int) -> int:
    """Bytes a batch needs beyond the weights: the KV cache at full length, the prefill's
    live activations and attention scores, and float32 logits for sampling. An upper-end
    estimate: good enough to refuse a hopeless batch with a clear message."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(text.num_hidden_layers)
    heads = int(text.num_attention_heads)
    hidden = int(text.hidden_size)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    inter = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    total = prompt_len + max_new_tokens
    kv = 2 * layers * batch * total * kv_heads * head_dim * elem
    activations = batch * prompt_len * (4 * hidden + 3 * inter) * elem
    scores = batch * heads * prompt_len * prompt_len * elem
    logits = 3 * batch * int(text.vocab_size) * 4
    return kv + activations + scores + logits


def free_bytes(device: torch.device) -> int | None:
    """Free memory on ``device``: CUDA's own figure, or MemAvailable from /proc/meminfo."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_batch_fits(model: Any, device: torch.device, batch: int, prompt_len: int, max_new_tokens: int) -> None:
    """Raise :class:`BatchTooLargeError` when the batch's estimate exceeds the budget."""
    free = free_bytes(device)
    if free is None:
        return
    elem = int(next(model.parameters()).element_size())
    need = estimate_batch_bytes(model.config, batch, prompt_len, max_new_tokens, elem)
    budget = int(free * BUDGET)
    if need > budget:
        one = estimate_batch_bytes(model.config, 1, prompt_len, max_new_tokens, elem)
        raise BatchTooLargeError(
            batch, prompt_len + max_new_tokens, need, free, str(device), budget // one if one else None
        )
