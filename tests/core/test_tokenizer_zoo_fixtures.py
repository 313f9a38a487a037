"""The zoo's tokenizers are the reference models' own: CanIToolCall's fixtures say so.

Each fixture holds the ids a reference model generated (``output_token_ids``) and their decode
under that model's published tokenizer (``raw_output``, special tokens written out). A zoo
tokenizer stands for a model only if it decodes the ids of **every** fixture of that model to
``raw_output`` exactly (``tokenizer_zoo_more.FIXTURE_MODELS`` lists which stands for which).
Which added tokens are special matters too (``skip_special_tokens`` drops them, and the
``special`` chunking splits at them), so the published flags of the markers the chat layer
reads are pinned beside.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
import tokenizer_zoo
from tokenizer_zoo_more import FIXTURE_MODELS

fixtures_module = pytest.importorskip("canitoolcall.fixtures", reason="canitoolcall is not installed")


def _fixtures_by_model() -> dict[str, list[Any]]:
    by_model: dict[str, list[Any]] = defaultdict(list)
    for fx in fixtures_module.load_fixtures():
        if fx.tokenizer is not None and fx.output_token_ids is not None:
            by_model[fx.tokenizer.repo].append(fx)
    return by_model


BY_MODEL = _fixtures_by_model()
CASES = [pytest.param(name, repo, id=f"{name}-{repo}") for name, repos in FIXTURE_MODELS.items() for repo in repos]


@pytest.mark.parametrize(("name", "repo"), CASES)
def test_every_fixture_of_the_model_decodes_to_its_raw_output(name: str, repo: str) -> None:
    tok = tokenizer_zoo.load(name)
    fixtures = BY_MODEL.get(repo, [])
    assert fixtures, f"CanIToolCall has no fixture with ids for {repo}"
    wrong = [fx.id for fx in fixtures if tok.decode(list(fx.output_token_ids), skip_special_tokens=False) != fx.raw_output]
    assert not wrong, f"{name} decodes {len(wrong)}/{len(fixtures)} fixtures of {repo} wrongly: {wrong[:5]}"


#: name -> (added tokens that are special, added tokens that are not), as each model publishes them.
SPECIAL_FLAGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "qwen35": (("<|im_end|>", "<|endoftext|>", "<|audio_pad|>"), ("<tool_call>", "</tool_call>", "<think>", "</think>")),
    "llama4": (("<|eot|>", "<|eom|>", "<|python_start|>", "<|header_start|>"), ()),
    "deepseek_v32": (("<｜end▁of▁sentence｜>",), ("｜DSML｜", "<think>", "</think>")),
    "gemma4": (("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>", "<|turn>", "<turn|>", "<eos>"), ()),
    "mistral_v3": (("</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[TOOL_RESULTS]"), ()),
    "tekken": (("</s>", "[INST]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"), ()),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SPECIAL_FLAGS))
def test_the_markers_are_special_as_published(name: str) -> None:
    tok = tokenizer_zoo.load(name)
    special, plain = SPECIAL_FLAGS[name]
    flags = {t.content: t.special for t in tok.added_tokens_decoder.values()}
    assert {t: flags.get(t) for t in special} == dict.fromkeys(special, True)
    assert {t: flags.get(t) for t in plain} == dict.fromkeys(plain, False)


@pytest.mark.parametrize("name", sorted(SPECIAL_FLAGS))
def test_a_marker_encodes_to_its_one_id(name: str) -> None:
    tok = tokenizer_zoo.load(name)
    special, plain = SPECIAL_FLAGS[name]
    for marker in special + plain:
        ids = tok.encode(marker, add_special_tokens=False)
        assert ids == [tok.convert_tokens_to_ids(marker)], marker


def test_the_tekken_file_beside_it_is_the_same_tokenizer_for_mistral_common() -> None:
    """vLLM's ``tokenizer_mode="mistral"`` reads tekken.json with mistral-common: same ids, same text."""
    tekken = pytest.importorskip("mistral_common.tokens.tokenizers.tekken")
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

    tok = tekken.Tekkenizer.from_file(str(tokenizer_zoo.directory("tekken") / "tekken.json"))
    for repo in FIXTURE_MODELS["tekken"]:
        for fx in BY_MODEL[repo]:
            assert tok.decode(list(fx.output_token_ids), special_token_policy=SpecialTokenPolicy.KEEP) == fx.raw_output, fx.id
