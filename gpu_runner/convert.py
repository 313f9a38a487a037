"""The default model as a safetensors directory, for servers that cannot read GGUF.

vLLM's CPU build has no GGUF loader, so serving SmolLM2 there needs a plain Hugging Face
directory (``config.json``, ``model.safetensors``, ``tokenizer.json`` with its chat
template). :func:`default_model_directory` makes it once from the GGUF that
:func:`~detok_plugin.gpu_runner.fetch.fetch_default_model` unpacks, and caches it beside it.

Steps:

1. a finished directory in the cache wins (it holds a ``.complete`` marker);
2. otherwise the GGUF is loaded with transformers (dequantized to float32), the GGUF
   quantizer and ``quantization_config`` are dropped (``save_pretrained`` would otherwise
   write a config vLLM reads as a quantized checkpoint), and model and tokenizer are saved
   into a temporary directory beside the target, then renamed: two processes converting at
   once both end with a whole directory.

``python -m detok_plugin.gpu_runner.convert`` prints the directory (scripts use it).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from .fetch import default_cache_dir, fetch_default_model

__all__ = ["default_model_directory"]

_SUBDIR = "smollm2-135m-instruct-safetensors"
_MARKER = ".complete"


def default_model_directory(cache_dir: Path | str | None = None, *, progress: IO[str] | None = sys.stderr) -> Path:
    """The default model's safetensors directory, converted on first use and cached."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / _SUBDIR
    if (target / _MARKER).exists():
        return target
    gguf = fetch_default_model(cache, progress=progress)
    if progress is not None:
        progress.write(f"detok-plugin: converting {gguf.name} to safetensors in {target}\n")
        progress.flush()
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=_SUBDIR + ".", dir=cache))
    try:
        _convert(gguf, scratch)
        (scratch / _MARKER).touch()
        try:
            os.rename(scratch, target)
        except OSError:
            if not (target / _MARKER).exists():  # not a concurrent winner: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # Any: the attributes reset below are not in transformers' annotations of the model.
    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # Loaded from GGUF, the model carries the quantizer that dequantized it; saved as is,
    # its config would still announce a GGUF quantization.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def main() -> int:
    # transformers' progress bars (dequantizing, loading, writing shards) are noise in the
    # test command's setup; a caller's own setting wins.
    os.environ.setdefault("TQDM_DISABLE", "1")
    print(default_model_directory())
    return 0


if __name__ == "__main__":
    sys.exit(main())
