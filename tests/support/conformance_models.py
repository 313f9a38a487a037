"""What the CanIToolCall replay needs to know per model: its tokenizer, its parsers, its prompt.

Three tables, each data, read by ``conformance.py``:

1. :data:`TOKENIZERS`: a fixture's tokenizer pin (``fixture.tokenizer.repo``, else its
   reference model) to the names of ``tokenizer_zoo`` tokenizers that may be the same
   vocabulary. A name counts only if ``tokenizer_zoo`` builds it (a name another change adds
   counts from then on) **and** it reproduces ``raw_output`` exactly, decoding
   ``output_token_ids`` with ``skip_special_tokens=False``, on every fixture of that pin
   (:func:`tokenizer_for`): one mismatch, and the pin has no local tokenizer.
2. :data:`DETOK_PARSERS`: the ``detok_*`` parser names per family and model, named as the
   issue names them (``detok_`` + the name vLLM 0.33 gives its own parser, or the preset of
   that format); a name no family registers yet makes the fixture unsupported, so a family
   counts as soon as its parser is registered. vLLM's own names come from CanIToolCall's
   vLLM adapter (``canitoolcall.adapters.vllm.resolve_parsers``), checked against vLLM
   0.33's registries at run time.
3. :data:`PROMPT_HEADS` and :data:`STOP_TOKENS`: the user turn before the fixture's
   generation prompt (the zoo tokenizers carry no chat template, so the prompt is the
   family's chat markup encoded by the tokenizer), and the token that ended a generation
   that was not cut by ``max_tokens``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tokenizer_zoo

__all__ = [
    "DETOK_PARSERS",
    "MODEL_EOS",
    "MODEL_PROMPT_HEADS",
    "PROMPT_HEADS",
    "STOP_TOKENS",
    "TOKENIZERS",
    "ParserRule",
    "StopRule",
    "TokenizerChoice",
    "detok_parsers_for",
    "prompt_head",
    "tokenizer_for",
    "zoo_tokenizer",
]

#: (pattern over the tokenizer pin's repo, zoo names that may hold that vocabulary, in order).
#: Names not yet in tokenizer_zoo are tried and skipped; ``tokenizer_for`` verifies the rest.
TOKENIZERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r"^Qwen/Qwen3-", ("qwen3",)),  # Qwen3, Qwen3-2507, Qwen3-Coder, Qwen3-Coder-Next
    (r"^Qwen/Qwen3\.[5-9]", ("qwen3_5", "qwen35")),
    (r"^deepseek-ai/DeepSeek-(V3-|V3\.1|R1|V4)", ("deepseek_v3",)),
    (r"^deepseek-ai/DeepSeek-V3\.2", ("deepseek_v32", "deepseek_v3")),
    (r"Llama-3", ("llama3",)),
    (r"Llama-4", ("llama4",)),
    (r"^openai/gpt-oss", ("gpt_oss",)),
    (r"^zai-org/GLM-4\.[56]", ("glm45", "glm4")),
    (r"^zai-org/GLM-(4\.7|5)", ("glm47", "glm5", "glm45", "glm4")),
    (r"^moonshotai/Kimi-K2", ("kimi_k2",)),
    (r"^moonshotai/Kimi-K3", ("kimi_k3",)),
    (r"^google/gemma-4", ("gemma4",)),
    (r"^mistralai/Mistral-7B-Instruct-v0\.3", ("mistral_v3",)),
    (r"^mistralai/Magistral-Small-2506", ("tekken_v11",)),  # Tekken v11: no [THINK] token
    (r"^mistralai/", ("tekken", "mistral_tekken")),
)


#: (pattern over the pin, the model's own EOS) where its tokenizer_config.json names another
#: EOS than the zoo's build of the same vocabulary (the zoo's llama3 is Llama 3.2 1B's, EOS
#: <|end_of_text|>; the Instruct models' is <|eot_id|>). vLLM reads the EOS from the tokenizer.
MODEL_EOS: tuple[tuple[str, str], ...] = ((r"Llama-3\.[1-3]-.*Instruct", "<|eot_id|>"),)


@dataclass(frozen=True, slots=True)
class TokenizerChoice:
    """A pin's local tokenizer (``name``, with the model's ``eos`` where it differs from the
    zoo's), or why it has none (``name`` is None)."""

    name: str | None
    why: str
    eos: str | None = None


@functools.cache
def _zoo_load(name: str, eos: str | None) -> tuple[Any | None, str]:
    try:
        if eos is None:
            return tokenizer_zoo.load(name), ""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer_zoo.directory(name), eos_token=eos), ""
    except KeyError:
        return None, "not in tokenizer_zoo"
    except Exception as exc:  # a builder that cannot build here (a package missing, a changed file)
        return None, f"tokenizer_zoo cannot build it here ({type(exc).__name__}: {exc})"


def zoo_tokenizer(name: str, eos: str | None = None) -> Any | None:
    """The zoo's tokenizer called ``name`` (its EOS ``eos`` if given), or None where
    tokenizer_zoo cannot build it here."""
    return _zoo_load(name, eos)[0]


def _candidates(pin: str) -> list[str]:
    """Zoo names mapped here, then any the zoo itself says reproduce the pin's fixtures."""
    names = list(next((names for pattern, names in TOKENIZERS if re.search(pattern, pin)), ()))
    try:
        from tokenizer_zoo_more import FIXTURE_MODELS
    except ImportError:
        return names
    return names + [n for n, pins in FIXTURE_MODELS.items() if pin in pins and n not in names]


def _reproduces(tok: Any, fixtures: Sequence[Any]) -> str | None:
    """None if ``tok`` decodes every fixture's ids to its raw_output, else the first that does not."""
    size = len(tok)
    for f in fixtures:
        ids = f.output_token_ids
        if ids is None:
            return f"{f.id} has no output_token_ids"
        if max(ids, default=0) >= size or tok.decode(list(ids), skip_special_tokens=False) != f.raw_output:
            return f"{f.id}: the ids do not decode to raw_output"
    return None


def tokenizer_for(pin: str, fixtures: Sequence[Any]) -> TokenizerChoice:
    """The zoo tokenizer for tokenizer pin ``pin``, verified on all of the pin's ``fixtures``."""
    names = _candidates(pin)
    if not names:
        return TokenizerChoice(None, f"no zoo tokenizer is mapped to {pin}")
    tried: list[str] = []
    for name in names:
        tok, why = _zoo_load(name, None)
        if tok is None:
            tried.append(f"{name}: {why}")
            continue
        problem = _reproduces(tok, fixtures)
        if problem is None:
            eos = next((e for pattern, e in MODEL_EOS if re.search(pattern, pin)), None)
            return TokenizerChoice(name, f"{name} reproduces raw_output on all {len(fixtures)} fixtures", eos)
        tried.append(f"{name}: {problem}")
    return TokenizerChoice(None, "; ".join(tried))


@dataclass(frozen=True, slots=True)
class ParserRule:
    """``--reasoning-parser`` / ``--tool-call-parser`` for the models a pattern matches."""

    pattern: str
    reasoning: str | None
    tool: str


#: family -> ordered rules (the first match wins), as CanIToolCall's vLLM map orders vLLM's own.
DETOK_PARSERS: dict[str, tuple[ParserRule, ...]] = {
    "qwen3-hermes": (
        ParserRule(r"Qwen3-.*Instruct-2507", None, "detok_qwen3"),
        ParserRule(r"Qwen2\.5", None, "detok_qwen3"),
        ParserRule(r"Qwen3", "detok_qwen3", "detok_qwen3"),
    ),
    "qwen3-xml": (
        ParserRule(r"Qwen3-Coder", None, "detok_qwen3_coder"),
        ParserRule(r"Qwen3\.[5-9]", "detok_qwen3_coder", "detok_qwen3_coder"),
    ),
    "gpt-oss": (ParserRule(r"gpt-oss", "detok_gpt_oss", "detok_gpt_oss"),),
    "deepseek": (
        ParserRule(r"DeepSeek-V4\.1", "detok_deepseek_v41", "detok_deepseek_v41"),
        ParserRule(r"DeepSeek-V4", "detok_deepseek_v4", "detok_deepseek_v4"),
        ParserRule(r"DeepSeek-V3\.2", "detok_deepseek_v32", "detok_deepseek_v32"),
        ParserRule(r"DeepSeek-V3\.1", "detok_deepseek_v31", "detok_deepseek_v31"),
        ParserRule(r"DeepSeek-R1", "detok_deepseek_r1", "detok_deepseek_r1"),
        ParserRule(r"DeepSeek-V3", None, "detok_deepseek_r1"),
    ),
    "kimi": (
        ParserRule(r"Kimi-K3", "detok_kimi_k3", "detok_kimi_k3"),
        ParserRule(r"Kimi-K2-Instruct", None, "detok_kimi_k2"),
        ParserRule(r"Kimi-K2", "detok_kimi_k2", "detok_kimi_k2"),
    ),
    "glm": (
        ParserRule(r"GLM-4\.[56]", "detok_glm45", "detok_glm45"),
        ParserRule(r"GLM-(4\.7|5)", "detok_glm47", "detok_glm47"),
    ),
    "llama": (
        ParserRule(r"Llama-4", None, "detok_llama4_pythonic"),
        ParserRule(r"Llama-3", None, "detok_llama3"),
    ),
    "mistral": (
        ParserRule(r"Magistral|Mistral-Medium-3\.5|Mistral-Small-4|Ministral-3-.*Reasoning", "detok_magistral", "detok_magistral"),
        ParserRule(r"mistral|ministral|devstral", None, "detok_mistral"),
    ),
    "gemma4": (ParserRule(r"gemma-4", "detok_gemma4", "detok_gemma4"),),
}


def detok_parsers_for(family: str, model: str) -> ParserRule | None:
    """The detok parser names for ``(family, model)``: the first rule whose pattern matches."""
    return next((r for r in DETOK_PARSERS.get(family, ()) if re.search(r.pattern, model, re.IGNORECASE)), None)


_USER = "Use the tools to answer."

#: family -> the chat markup of one user turn, before the fixture's generation prompt.
PROMPT_HEADS: dict[str, str] = {
    "qwen3-hermes": f"<|im_start|>user\n{_USER}<|im_end|>\n",
    "qwen3-xml": f"<|im_start|>user\n{_USER}<|im_end|>\n",
    "deepseek": f"<｜begin▁of▁sentence｜><｜User｜>{_USER}",
    "llama": f"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{_USER}<|eot_id|>",
    "gpt-oss": f"<|start|>user<|message|>{_USER}<|end|>",
    "glm": f"[gMASK]<sop><|user|>\n{_USER}",
    "kimi": f"<|im_user|>user<|im_middle|>{_USER}<|im_end|>",
    "gemma4": f"<bos><|turn>user\n{_USER}<turn|>\n",
    "mistral": f"<s>[INST]{_USER}",
}
#: (pattern over the reference model, its user turn) where a model's markup is not its family's.
MODEL_PROMPT_HEADS: tuple[tuple[str, str], ...] = (
    (r"Llama-4", f"<|begin_of_text|><|header_start|>user<|header_end|>\n\n{_USER}<|eot|>"),
    (r"Kimi-K3", f'<|open|>message role="user"<|sep|>{_USER}<|end_of_msg|>'),
)


def prompt_head(family: str, model: str) -> str:
    """The chat markup of one user turn for ``model`` (of ``family``), before its generation prompt."""
    head = next((h for pattern, h in MODEL_PROMPT_HEADS if re.search(pattern, model)), None)
    return head if head is not None else PROMPT_HEADS.get(family, "")


@dataclass(frozen=True, slots=True)
class StopRule:
    """The token that ended a finished generation: the first of ``after_call`` in the
    vocabulary when the output's last message is a tool call (``call_marker`` in the text
    after ``last_split``), else the first of ``tokens`` in the vocabulary."""

    tokens: tuple[str, ...]
    call_marker: str | None = None
    after_call: tuple[str, ...] = ()
    last_split: str | None = None

    def for_output(self, raw_output: str) -> tuple[str, ...]:
        tail = raw_output.rsplit(self.last_split, 1)[-1] if self.last_split else raw_output
        if self.call_marker is not None and self.call_marker in tail:
            return self.after_call + self.tokens
        return self.tokens


#: family -> its stop rule (the ids of all of the family's stop tokens are the request's
#: stop ids, as vLLM reads them from generation_config.json).
STOP_TOKENS: dict[str, StopRule] = {
    "qwen3-hermes": StopRule(("<|im_end|>",)),
    "qwen3-xml": StopRule(("<|im_end|>",)),
    "deepseek": StopRule(("<｜end▁of▁sentence｜>",)),
    # Llama 3: <|eom_id|> after a <|python_tag|> call, else <|eot_id|>; Llama 4: <|eot|>.
    "llama": StopRule(("<|eot_id|>", "<|eot|>"), "<|python_tag|>", ("<|eom_id|>",)),
    "gpt-oss": StopRule(("<|return|>",), "to=", ("<|call|>",), last_split="<|end|>"),
    "glm": StopRule(("<|user|>",), "<tool_call>", ("<|observation|>",)),
    "kimi": StopRule(("<|im_end|>", "<|end_of_msg|>")),
    "gemma4": StopRule(("<turn|>",), "<|tool_call>", ("<|tool_response>",)),
    "mistral": StopRule(("</s>",)),
}
