"""The SGLang plugin's switch, hooks, contract check and safety net, inside SGLang 0.5.23.

``tests/support/sglang_plugin_checks.py`` runs in ``.venv-sglang`` (one process): SGLang's
own ``load_plugins()`` (what each SGLang process calls first) under each setting of the
switch, asserting which hooks are in place (SGLang only logs a hook that failed) and the one
line the process says; an SGLang whose stop check changed shape (one error line, stock
kept); a stop-string stream and a text stream that raise mid-request (the request goes on
under SGLang's stock code, logged, its text and finish still right; the other request of
the batch untouched). The real server's processes are checked in ``test_sglang_server.py``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import tokenizer_zoo
from sglang_env import require_sglang, sglang_run

require_sglang()

ON_LINE = "detok-plugin: on ({}), replacing SGLang 0.5.23's stop-string check"
STOCK = "SGLang keeps its stock stop-string check and detokenizer"


@pytest.fixture(scope="module")
def checked() -> dict[str, Any]:
    env = {"DETOK_SGLANG_TOKENIZER": str(tokenizer_zoo.directory("qwen3"))}
    done = sglang_run(["tests/support/sglang_plugin_checks.py", "everything"], env={**env, "HOME": os.environ.get("HOME", "")})
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


SAID = {
    "on": ON_LINE.format("DETOK_PLUGIN=1"),
    "sglang_plugins_names_it": ON_LINE.format("SGLANG_PLUGINS names detok_plugin"),
    "off": f"detok-plugin: off (DETOK_PLUGIN=0); {STOCK}",
    "mistaken_value": "detok-plugin: off (DETOK_PLUGIN='maybe' is not one of 1/0/true/false/yes/no/on/off; ignored)",
    "unset": "detok-plugin: off (neither DETOK_PLUGIN=1 nor SGLANG_PLUGINS naming detok_plugin is set)",
    "rust_server": "detok-plugin: NOT switched on (DETOK_PLUGIN=1): SGLANG_RUST_SERVER=1, so SGLang's Rust server detokenizes",
}


@pytest.mark.parametrize("setting", [*SAID, "sglang_plugins_leaves_it_out"])
def test_load_plugins_puts_the_hooks_in_place_as_the_switch_says(checked: dict[str, Any], setting: str) -> None:
    got = checked["load_plugins"][setting]
    on = setting in ("on", "sglang_plugins_names_it")
    assert got["hooks"] == {"check": on, "prefix": on, "detokenizer": on}
    lines = got["stderr"].splitlines()
    if setting == "sglang_plugins_leaves_it_out":  # SGLang never calls the plugin
        assert lines == []
        return
    assert len(lines) == 1, lines  # one line per process, however often SGLang loads plugins
    assert lines[0].startswith(f"[MainProcess] {SAID[setting]}"), lines
    assert got["again"] is (True if on else None)


def test_the_installed_sglang_keeps_the_contract(checked: dict[str, Any]) -> None:
    assert checked["load_plugins"]["problems"] == []


def test_a_changed_seam_keeps_sglang_stock_and_says_why(checked: dict[str, Any]) -> None:
    got = checked["broken_contract"]
    assert got["on"] is False
    assert got["hooks"] == {"check": False, "prefix": False, "detokenizer": False}
    assert "NOT switched on (DETOK_PLUGIN=1): SGLang 0.5.23 breaks the contract: Req._check_str_based_finish is not (self, new_accepted_len)" in got["stderr"]


def test_a_keyword_call_of_the_seam_keeps_sglang_stock_and_says_why(checked: dict[str, Any]) -> None:
    """The request's bound check takes SGLang's one argument by position (read from the
    bytecode of ``update_finish_state``): a keyword call would fail there, so stock stays."""
    got = checked["broken_call"]
    assert got["on"] is False
    assert got["hooks"] == {"check": False, "prefix": False, "detokenizer": False}
    assert "Req.update_finish_state no longer calls _check_str_based_finish with one positional argument" in got["stderr"]


def test_a_stop_stream_that_raises_hands_its_request_to_stock(checked: dict[str, Any]) -> None:
    got = checked["scheduler_hand_over"]
    assert got["watch"] is None  # stock's check from then on
    assert got["own_methods_left"] == []  # the request's own callables removed
    assert got["reason"] == {"type": "stop", "matched": "END"}
    assert got["finished_at"] == got["expected_at"]
    assert "SGLang's stock check serves the rest of this request" in got["logs"]
    assert "RuntimeError: injected fault" in got["logs"]  # with the traceback


@pytest.mark.parametrize("case", ["detokenizer_hand_over", "detokenizer_hand_over_alone"])
def test_a_text_stream_that_raises_hands_its_request_to_stock(checked: dict[str, Any], case: str) -> None:
    """In a batch of two requests and in a batch of one (its own path)."""
    got = checked[case]
    assert got["texts"] == dict.fromkeys(got["texts"], got["expected"]) and "a" in got["texts"]
    assert len(got["texts"]) == (2 if case == "detokenizer_hand_over" else 1)
    assert "SGLang's stock detokenizer serves the rest of this request" in got["logs"]
    assert got["left"] == [] and got["stock_left"] == []  # finished requests leave both states
    assert got["capacity"] == 1 << 16  # stock's DETOKENIZER_MAX_STATES


def test_a_stop_stream_follows_its_request_through_retractions(checked: dict[str, Any]) -> None:
    """SGLang drops a retracted request's output ids (a new array) or cuts them: the stop
    stream starts again from what is left and the stop still ends the request where it
    completes; the prefix check holds exactly the ids of a partial stop."""
    got = checked["scheduler_lifecycle"]
    for case in ("replaced", "cut"):
        assert got[case]["reason"] == {"type": "stop", "matched": "\n\nUser:"}
        assert got[case]["finished_len"] == got[case]["expected_len"]
    assert got["replaced"]["held"] == got["replaced"]["expected_held"]


def test_requests_without_stop_strings_or_with_a_stop_regex_answer_as_stock(checked: dict[str, Any]) -> None:
    got = checked["scheduler_lifecycle"]
    assert got["no_stop_strings_held"] == [False] * 6
    assert got["regex"]["own_methods"] == []  # stock's methods, through the class
    assert got["regex"]["reason"] == {"type": "stop", "matched": "\n\nUser:"}


def test_a_finished_request_is_freed_without_garbage_collection(checked: dict[str, Any]) -> None:
    """The request's own callables reach it weakly: no reference cycle keeps it alive."""
    assert checked["scheduler_lifecycle"]["freed_without_gc"] is True


def test_each_process_builds_its_table_where_sglang_loads_its_tokenizer(checked: dict[str, Any]) -> None:
    """The detokenizer's and the scheduler's ``init_tokenizer`` are wrapped while the plugin
    is on (the build starts there, before the scheduler loads the model) and SGLang's own
    after ``unregister()``; a request starts no build of its own."""
    got = checked["tokenizer_tables"]
    assert got["wrapped"] == {"scheduler": True, "detokenizer": True}
    assert got["restored"] == {"scheduler": True, "detokenizer": True}
    assert got["request_lines"] == []
