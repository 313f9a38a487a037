"""vLLM 0.33.0's own detokenizer and output-processor tests, stock and through the plugin.

``tests/support/vllm_upstream_suite.py`` runs vLLM's test files (from its published sdist) twice,
in processes of their own: once on stock vLLM, once with the plugin registered as
``DETOK_PLUGIN=1`` registers it and every detokenizer the tests build routed through it.
What this module asserts about the two runs:

* they ran the same tests, hundreds of them, and the plugin run really went through the
  plugin (its detokenizers counted per test) while the stock run never did;
* nothing that passes on stock fails with the plugin, and nothing fails with the plugin;
* every stock failure is one reason, checked here on the tokenizer itself rather than
  taken from the run: vLLM's fast detokenizer, given a prompt whose last token ends
  inside a character, loses or garbles that character's completion. vLLM's test expects
  ``decode(prompt + out)[len(decode(prompt)):]``, the plugin's invariant 1.

Marked ``vllm_upstream`` (about 20 minutes on two cores, both runs at once);
``-m "not vllm_upstream"`` leaves it out of a quick run.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
from typing import Any

import pytest
import tokenizer_zoo
import vllm_upstream_suite

pytestmark = pytest.mark.vllm_upstream

if importlib.metadata.version("vllm") != vllm_upstream_suite.VERSION:  # pragma: no cover
    pytest.skip(f"vLLM {vllm_upstream_suite.VERSION} is not the installed vLLM", allow_module_level=True)

_DECODE_STREAMING = "tests/tokenizers_/test_detokenize.py::test_decode_streaming["
# vLLM's tests that detokenize generated ids; each must have built at least one of ours.
_DETOKENIZING = (
    _DECODE_STREAMING,
    "tests/tokenizers_/test_detokenize.py::test_mistral_edge_case[",
    "tests/tokenizers_/test_detokenize.py::test_oov_decode[",
    "tests/tokenizers_/test_detokenize.py::test_slow_decode_long_history",
    "tests/v1/engine/test_output_processor.py::test_incremental_detokenization[",
    "tests/v1/engine/test_output_processor.py::test_stop_string[",
    "tests/v1/engine/test_output_processor.py::test_stop_token[",
    "tests/detokenizer/test_min_tokens.py::",
)


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, dict[str, Any]]]:
    work = vllm_upstream_suite.prepare()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {mode: pool.submit(vllm_upstream_suite.run, mode, work) for mode in ("stock", "plugin")}
        return {mode: future.result() for mode, future in futures.items()}


def _with(outcomes: dict[str, dict[str, Any]], outcome: str) -> set[str]:
    return {test for test, entry in outcomes.items() if entry["outcome"] == outcome}


def test_both_runs_ran_the_same_hundreds_of_tests(runs):
    assert runs["stock"].keys() == runs["plugin"].keys()
    assert len(_with(runs["stock"], "passed")) >= 650
    assert not _with(runs["stock"], "error") and not _with(runs["plugin"], "error")
    assert _with(runs["stock"], "skipped") == _with(runs["plugin"], "skipped")


def test_the_plugin_run_went_through_the_plugin_and_the_stock_run_never_did(runs):
    assert all(entry["ours"] == 0 for entry in runs["stock"].values())
    detokenizing = [
        test for test in _with(runs["plugin"], "passed") if test.startswith(_DETOKENIZING)
    ]
    assert len(detokenizing) >= 300
    assert [test for test in detokenizing if runs["plugin"][test]["ours"] == 0] == []


def test_nothing_fails_with_the_plugin(runs):
    assert sorted(_with(runs["plugin"], "failed")) == []
    assert _with(runs["stock"], "passed") <= _with(runs["plugin"], "passed")


def _tokenizer(name: str) -> Any:
    zoo_name, _ = vllm_upstream_suite.HUB[name]
    return tokenizer_zoo.load(zoo_name)


def _prompt_ends_inside_a_character(params: dict[str, Any]) -> bool:
    """vLLM's test_decode_streaming's prompt, rebuilt: does its decode end in U+FFFD?"""
    tokenizer = _tokenizer(params["tokenizer_name"])
    truth = params["truth"]
    ids = tokenizer(truth, add_special_tokens=False).input_ids
    prompt_len = len(tokenizer(truth[: len(truth) // 2], add_special_tokens=False).input_ids)
    if tokenizer.bos_token_id is not None:
        ids, prompt_len = [tokenizer.bos_token_id, *ids], prompt_len + 1
    prompt = tokenizer.decode(ids[:prompt_len], skip_special_tokens=params["skip_special_tokens"])
    return prompt.endswith("\ufffd")


def test_every_stock_failure_is_a_prompt_ending_inside_a_character_and_passes_with_the_plugin(runs):
    stock_failures = _with(runs["stock"], "failed")
    assert stock_failures, "stock vLLM passed everything: nothing left to show"
    for test in sorted(stock_failures):
        params = runs["stock"][test]["params"]
        assert test.startswith(_DECODE_STREAMING) and params["with_prompt"], test
        assert _prompt_ends_inside_a_character(params), test
        assert runs["plugin"][test]["outcome"] == "passed", test


def test_every_prompt_ending_inside_a_character_passes_with_the_plugin(runs):
    cases = [
        test
        for test, entry in runs["plugin"].items()
        if test.startswith(_DECODE_STREAMING)
        and entry["outcome"] != "skipped"
        and entry["params"]["with_prompt"]
        and vllm_upstream_suite.HUB[entry["params"]["tokenizer_name"]][0] != "tekken"
        and _prompt_ends_inside_a_character(entry["params"])
    ]
    assert len(cases) >= 9
    assert [test for test in cases if runs["plugin"][test]["outcome"] != "passed"] == []
