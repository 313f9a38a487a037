"""SGLang 0.5.23's own scheduler stop check and detokenizer step, stock beside the plugin.

``tests/support/sglang_replay.py`` runs in ``.venv-sglang``: on the four real tokenizers
the tests build, every case becomes a real SGLang ``Req`` fed one output id per step in one
batch (``update_finish_state``, the output streamer's hold rule, ``init_incremental_detokenize``)
and a real ``DetokenizerManager``'s ``_decode_batch_token_id_output`` turns the payloads
into text; once stock, once with the plugin registered. Each run is checked against the
oracle ``decode(prompt + out)[len(decode(prompt)):]`` (the request's flags, cut at the
earliest completing stop, a stop token's text left out): the text exact, each delta a
prefix of it, generation ending at the stop, and no character shipped after the step that
settled it (outside the ids of a genuine partial stop, which SGLang's scheduler holds).
The plugin must be exact everywhere; stock's failures are pinned by name (``STOCK_WRONG``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import tokenizer_zoo
from sglang_checks import late_characters, verdict
from sglang_env import require_sglang, sglang_run

require_sglang()

NAMED = (
    "plain", "split_characters", "prompt_ends_inside_a_character", "stop_spelled_char_by_char",
    "cjk_stop_in_byte_tokens", "stop_in_ordinary_tokens", "stop_kept_no_stop_trim", "partial_stop_that_breaks",
    "stop_across_a_skipped_special_token", "special_token_kept", "length_cut_inside_a_character",
    "eos_ends_the_stream", "byte_run_then_invalid_byte",
) + tuple(f"random_{seed}" for seed in range(6))

_SPELLED = "stock decodes only the last len(encode(stop)) + 1 ids: a stop spelled in more tokens is never seen, leaks, and generation runs on"
_SPECIAL = "stock matches stops on the decode with default flags, where the skipped special token stands between the stop's characters"
_BYTES = "a stop (or its start) spelled in byte tokens: stock's tail decode is too short to see it"

#: Stock SGLang's failures, by (tokenizer, case).
STOCK_WRONG = {
    **{(tok, "stop_spelled_char_by_char"): _SPELLED for tok in tokenizer_zoo.NAMES},
    **{(tok, "cjk_stop_in_byte_tokens"): _SPELLED for tok in tokenizer_zoo.NAMES},
    **{(tok, "stop_across_a_skipped_special_token"): _SPECIAL for tok in tokenizer_zoo.NAMES},
    ("mistral_v1", "byte_run_then_invalid_byte"): "stock ships 你 as soon as its bytes decode, but the invalid byte "
    "after it turns the whole SentencePiece byte run into U+FFFD in the final text",
    ("smollm2", "random_0"): _BYTES,
    ("smollm2", "random_2"): _BYTES,
    ("smollm2", "random_5"): _BYTES,
}

CASES = [pytest.param(tok, case, id=f"{tok}-{case}") for tok in tokenizer_zoo.NAMES for case in NAMED]


@pytest.fixture(scope="module")
def replayed() -> dict[str, Any]:
    args = [f"{name}={tokenizer_zoo.directory(name)}" for name in tokenizer_zoo.NAMES]
    done = sglang_run(["tests/support/sglang_replay.py", *args])
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("tok", "case"), CASES)
def test_plugin_is_exact_with_nothing_late(replayed: dict[str, Any], tok: str, case: str) -> None:
    run = replayed[tok][case]
    assert verdict(run["plugin"], run["oracle"]) == []
    assert late_characters(run["plugin"], run["oracle"]["settled"]) == 0


@pytest.mark.parametrize(("tok", "case"), CASES)
def test_stock_fails_only_where_pinned(replayed: dict[str, Any], tok: str, case: str) -> None:
    run = replayed[tok][case]
    problems = verdict(run["stock"], run["oracle"])
    if (tok, case) in STOCK_WRONG:
        assert problems, f"stock is now right on {tok}/{case}: unpin it ({STOCK_WRONG[tok, case]})"
    else:
        assert problems == []


def test_the_plugin_finishes_stop_requests_as_sglang_reports_them(replayed: dict[str, Any]) -> None:
    """A stop string ends the request with SGLang's own finish reason and length."""
    for tok in tokenizer_zoo.NAMES:
        run = replayed[tok]["stop_spelled_char_by_char"]
        assert run["plugin"]["finish"]["reason"] == {"type": "stop", "matched": "\n\nUser:"}
        assert run["plugin"]["finish"]["finished_len"] == run["oracle"]["steps"]
