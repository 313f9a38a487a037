"""Hostile input to the TGI shim's ``RequestText`` (one request's text and stop decision, no
TGI needed; "Exact at scale", hostile input).

``RequestText`` answers TGI's ``StoppingCriteria`` call per id. An id the tokenizer does not
know renders as the decode renders it, with a WARNING naming it; what its stream raises
goes to ``_failed`` (here it raises; the criteria in TGI's step hands the request to TGI's
stock text, ``step.py``). Stop strings of any number, length or content stream exactly; an
empty stop string is left out (TGI's stock criteria would stop at the first id on it, its
pattern ``re.escape("") + "$"`` matching every text); ``max_new_tokens=0`` ends at the first
id, as TGI's stock criteria does (its router refuses 0 before); TGI has no ``min_tokens``. A
request TGI filters out of its batch mid-character or mid-stop is dropped: its texts are
what the decode shows, without the half character or the partial stop.
"""

from __future__ import annotations

import logging
import time

import pytest
from detok_plugin.integrations.tgi.request import (
    FINISH_EOS_TOKEN,
    FINISH_LENGTH,
    FINISH_STOP_SEQUENCE,
    RequestText,
    Settings,
    special_stop_ids,
)

from detok_plugin import TokenTypeError

LOGGER = "detok_plugin.integrations.tgi"


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _decode(tok, prompt, ids):
    whole = tok.decode(list(prompt) + list(ids), skip_special_tokens=True)
    return whole[len(tok.decode(list(prompt), skip_special_tokens=True)) :]


def _build(tok, prompt=(), **kw):
    kw.setdefault("stop_sequences", ())
    kw.setdefault("eos_token_ids", (tok.eos_token_id,))
    kw.setdefault("max_new_tokens", 200)
    return RequestText.build(tok, list(prompt), **kw)


def _run(req, ids):
    for tid in ids:
        code = req.push(tid)
        if code is not None:
            return code
    return None


# --- ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [151_700, 2**40, -1], ids=["past-the-vocabulary", "huge", "negative"])
def test_an_id_the_tokenizer_does_not_know_renders_as_the_decode_with_a_warning(qwen3, caplog, bad):
    ids = _ids(qwen3, "a🫨b 你好 ok")
    hostile = [ids[0], ids[1], bad, *ids[2:]]
    req = _build(qwen3, max_new_tokens=len(hostile))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _run(req, hostile) == FINISH_LENGTH
    assert req.text == _decode(qwen3, [], ids) and len(req.texts) == len(hostile) == req.generated_tokens
    assert f"token id {bad} at position 2" in caplog.text


def test_an_integer_tensor_is_an_id(qwen3):
    """TGI's CausalLM hands each id as a 0-d tensor."""
    torch = pytest.importorskip("torch")
    ids = _ids(qwen3, "hello 🫨")
    req = _build(qwen3, max_new_tokens=len(ids))
    assert _run(req, [torch.tensor(i) for i in ids]) == FINISH_LENGTH and req.text == "hello 🫨"


@pytest.mark.parametrize("bad", [1.5, True, "7", "float-tensor"], ids=repr)
def test_a_value_that_is_no_id_is_refused_not_truncated(qwen3, bad):
    """The core's TokenTypeError naming the value and its position (TGI's criteria hands
    the request to its stock text with an ERROR line); ``int()`` took 1.5 and True as
    id 1 and '7' as id 7, silently."""
    if bad == "float-tensor":
        bad = pytest.importorskip("torch").tensor(1.5)
    req = _build(qwen3)
    req.push(_ids(qwen3, "ok")[0])
    with pytest.raises(TokenTypeError, match="at position 1"):
        req.push(bad)
    assert req.generated_tokens == 1 and req.texts == ["ok"]


def test_none_is_refused_and_not_counted(qwen3):
    req = _build(qwen3)
    with pytest.raises(TypeError):
        req.push(None)
    assert req.generated_tokens == 0 and req.texts == []


# --- stop strings ----------------------------------------------------------------------------


def test_a_thousand_stop_strings(qwen3):
    ids = _ids(qwen3, "The quick brown fox 🫨 jumps over the lazy dog. " * 4)
    stops = [f"stop {k}" for k in range(997)] + ["lazy dogs", "🫨 jumps", "own"]
    req = _build(qwen3, stop_sequences=stops)
    assert _run(req, ids) == FINISH_STOP_SEQUENCE
    assert req.text == "The quick br" and req.generated_tokens == len(_ids(qwen3, "The quick brown"))


def test_a_stop_of_ten_thousand_characters(qwen3):
    stop = "ab" * 5000
    ids = _ids(qwen3, "x " + stop + " tail")
    req = _build(qwen3, stop_sequences=[stop], max_new_tokens=len(ids))
    assert req.push(ids[0]) is None and req.texts == ["x"]  # nothing held: "x" cannot start it
    assert _run(req, ids[1:]) == FINISH_STOP_SEQUENCE and req.text == "x "


def test_an_empty_stop_string_is_left_out(qwen3):
    ids = _ids(qwen3, "hello there")
    req = _build(qwen3, stop_sequences=["", "there"], max_new_tokens=len(ids))
    assert _run(req, ids) == FINISH_STOP_SEQUENCE and req.text == "hello "
    req = _build(qwen3, stop_sequences=[""], max_new_tokens=len(ids))
    assert _run(req, ids) == FINISH_LENGTH and req.text == "hello there"


def test_a_stop_of_u_fffd_ends_where_the_decode_shows_one(qwen3):
    ids = _ids(qwen3, "ok 🫨 then")
    req = _build(qwen3, stop_sequences=["\ufffd"])
    assert _run(req, ids) == FINISH_STOP_SEQUENCE and req.text == "ok "


SURROGATES = [pytest.param("\ud83e", id="lone-high"), pytest.param("a\ud83e\udee8", id="pair-in-text")]


@pytest.mark.parametrize("stop", SURROGATES)
def test_a_stop_with_lone_surrogates_never_matches(qwen3, stop):
    """special_stop_ids asked convert_tokens_to_ids for every stop, and a tokenizers-backed
    tokenizer cannot encode a lone surrogate: RequestText.build raised UnicodeEncodeError
    (in TGI the request stayed stock). Such a stop is no token's text: a plain stop string."""
    ids = _ids(qwen3, "a🫨b 🫨 a")
    req = _build(qwen3, stop_sequences=[stop], max_new_tokens=len(ids))
    assert _run(req, ids) == FINISH_LENGTH and req.text == _decode(qwen3, [], ids)
    im_end = qwen3.convert_tokens_to_ids("<|im_end|>")
    assert special_stop_ids(qwen3, [stop, "<|im_end|>", "\udee8<|im_end|>"]) == (im_end,)


class _StockCriteria:
    """TGI's ``StoppingCriteria``'s shape (``utils/tokens.py``), as test_tgi_integration.py
    stands it in: the base of the shim's criteria."""

    def __init__(self, max_new_tokens):
        self.eos_token_ids = set()
        self.stop_sequence_criterias = []
        self.max_new_tokens = max_new_tokens
        self.current_tokens = 0
        self.current_output = ""
        self.ignore_eos_token = False

    def __call__(self, last_token, last_output):
        self.current_tokens += 1
        return (self.current_tokens >= self.max_new_tokens, None)


def _criteria(tok, stops, max_new_tokens=50):
    from detok_plugin.integrations.tgi.step import criteria_class

    cls = criteria_class(_StockCriteria, Settings(enabled=True))
    return cls.from_stock(_StockCriteria(max_new_tokens), tuple(stops), tok)


@pytest.mark.parametrize("stop", SURROGATES)
def test_in_tgis_step_a_stop_with_lone_surrogates_streams_through_the_core(qwen3, caplog, stop):
    ids = _ids(qwen3, "a🫨b")
    criteria = _criteria(qwen3, [stop], max_new_tokens=len(ids))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        criteria.detok_build([], 7)
    assert criteria.stream is not None and "stays stock" not in caplog.text
    assert [criteria(i, "")[0] for i in ids] == [False] * (len(ids) - 1) + [True]
    assert criteria.text == "a🫨b"


def test_in_tgis_step_a_request_the_shim_cannot_open_stays_stock_with_a_warning(caplog):
    criteria = _criteria(object(), ["STOP"], max_new_tokens=3)  # no tokenizer the core can read
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        criteria.detok_build([], 7)
    assert criteria.stream is None and "request 7 stays stock" in caplog.text
    assert [criteria(i, "")[0] for i in (1, 2, 3)] == [False, False, True]  # TGI's own answers


def test_in_tgis_step_a_value_that_is_no_id_hands_the_request_to_stock_with_an_error(qwen3, caplog):
    ids = _ids(qwen3, "hello there")
    criteria = _criteria(qwen3, ["STOP"])
    criteria.detok_build([], 8)
    assert criteria(ids[0], "") == (False, None) and criteria.texts == ["hello"]
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert criteria(None, "") == (False, None)  # stock's answer
    assert criteria.stream is None and "request 8" in caplog.text and "stock text" in caplog.text


# --- limits, prompts, aborts -----------------------------------------------------------------


def test_max_new_tokens_zero_ends_at_the_first_id_as_tgis_own_criteria_does(qwen3):
    ids = _ids(qwen3, "hello there")
    req = _build(qwen3, max_new_tokens=0)
    assert req.push(ids[0]) == FINISH_LENGTH and req.texts == ["hello"]


def test_eos_on_the_last_allowed_id_is_eos(qwen3):
    ids = [*_ids(qwen3, "hi"), qwen3.eos_token_id]
    req = _build(qwen3, max_new_tokens=len(ids))
    assert _run(req, ids) == FINISH_EOS_TOKEN and req.text == "hi"


def test_a_prompt_of_a_hundred_thousand_ids(qwen3):
    prompt = _ids(qwen3, "你好🫨 hello ありがとう " * 14_000)[: 100_000 - 1]  # ends inside 🫨
    out = _ids(qwen3, "🫨 and after")
    t0 = time.process_time()
    req = _build(qwen3, prompt, stop_sequences=["\n\nUser:"], max_new_tokens=len(out))
    assert _run(req, out) == FINISH_LENGTH
    assert time.process_time() - t0 < 5
    assert req.text == _decode(qwen3, prompt, out)


@pytest.mark.parametrize("where", ["mid-character", "mid-stop"])
def test_a_request_filtered_out_inside_a_character_or_a_stop(qwen3, where):
    """TGI drops a cancelled request from its batch: nothing is asked of it again. Its texts
    so far hold neither the half character nor the partial stop (the decode has neither)."""
    text = "Hello 🫨" if where == "mid-character" else "Hello.\n\nUs"
    ids = _ids(qwen3, text)
    cut = len(ids) - 1 if where == "mid-character" else len(ids)
    req = _build(qwen3, stop_sequences=["\n\nUser:"], settings=Settings())
    assert _run(req, ids[:cut]) is None
    assert req.text == ("Hello " if where == "mid-character" else "Hello.")
    assert len(req.texts) == cut
