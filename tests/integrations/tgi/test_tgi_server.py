"""TGI's own server code, with the shim and stock (marker ``tgi``).

TGI's server is not on PyPI; these tests run where ``DETOK_TGI_PYTHON`` names a Python
that imports ``text_generation_server`` and detok-plugin (docs/tgi.md), and skip with the
reason otherwise. The TGI side runs in that interpreter (tests/support/tgi_harness.py: TGI's own
``CausalLM`` with TGI's ``OPTForCausalLM``, tiny random weights over the real tokenizer,
driven as TGI's router drives it); this side judges what it reports against the real
tokenizer's own decode.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import tokenizer_zoo

pytestmark = pytest.mark.tgi

HARNESS = Path(__file__).resolve().parents[2] / "support" / "tgi_harness.py"
NAMES = ("qwen3", "mistral_v1", "smollm2")
LENGTH, EOS_TOKEN, STOP_SEQUENCE = 0, 1, 2  # TGI's FinishReason (proto/v3/generate.proto)


@functools.cache
def tgi_python() -> str:
    """``DETOK_TGI_PYTHON``, checked to import TGI's server and detok-plugin; else skip."""
    python = os.environ.get("DETOK_TGI_PYTHON")
    if not python:
        pytest.skip("DETOK_TGI_PYTHON is not set (a Python with TGI's text_generation_server; docs/tgi.md)")
    if not Path(python).exists():
        pytest.skip(f"DETOK_TGI_PYTHON={python} does not exist")
    probe = subprocess.run(
        [python, "-c", "import text_generation_server.utils.tokens, detok_plugin.integrations.tgi"],
        capture_output=True, text=True, timeout=300, env=_env(),
    )
    if probe.returncode:
        pytest.skip(f"DETOK_TGI_PYTHON={python} cannot import TGI's server and detok-plugin: {probe.stderr[-300:]}")
    return python


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DETOK_PLUGIN"}
    env.update(ATTENTION="paged", PREFIX_CACHING="0", TQDM_DISABLE="1", **extra)
    return env


def _harness(*args: str, timeout: int = 900) -> None:
    out = subprocess.run([tgi_python(), str(HARNESS), *args], capture_output=True, text=True,
                         timeout=timeout, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = tmp_path_factory.mktemp(f"tgi-{name}")
            _harness("model", str(tokenizer_zoo.directory(name)), str(made[name]))
        return made[name]

    return get


@pytest.fixture(scope="module")
def loop_run(model_dir, tmp_path_factory):
    runs: dict[str, dict[str, Any]] = {}

    def get(name: str) -> dict[str, Any]:
        if name not in runs:
            out = tmp_path_factory.mktemp(f"loop-{name}") / "run.json"
            _harness("loop", str(model_dir(name)), str(out))
            runs[name] = json.loads(out.read_text())
        return runs[name]

    return get


# --- the oracle: the real tokenizer's decode -------------------------------------------


def reference(tok: Any, prompt: str, ids: list[int]) -> str:
    """``decode(prompt + out)[len(decode(prompt)):]``, skip_special_tokens=True."""
    p = tok(prompt)["input_ids"]
    return tok.decode(p + ids, skip_special_tokens=True)[len(tok.decode(p, skip_special_tokens=True)):]


def special_stop_ids(tok: Any, stops: list[str]) -> set[int]:
    return {tok.convert_tokens_to_ids(s) for s in stops if s in tok.all_special_tokens}


def expected(tok: Any, meta: dict[str, Any], ids: list[int]) -> tuple[int, int, str]:
    """Where the request must end on these ids, with which finish code, and its text: the
    first id that completes a stop string (in the decode) or is a special stop's id, is EOS
    (unless ignored), or is the ``max_new_tokens``-th; the text is cut before the stop."""
    stops, specials = meta["stops"], special_stop_ids(tok, meta["stops"])
    for k in range(1, len(ids) + 1):
        text = reference(tok, meta["prompt"], ids[:k])
        hits = [text.index(s) for s in stops if s and s in text]
        if hits or ids[k - 1] in specials:
            return k, STOP_SEQUENCE, text[:min(hits)] if hits else text
        if ids[k - 1] == tok.eos_token_id and not meta["ignore_eos"]:
            return k, EOS_TOKEN, text
        if k == meta["max_new_tokens"]:
            return k, LENGTH, text
    return len(ids), -1, reference(tok, meta["prompt"], ids)  # the request did not end


@pytest.mark.parametrize("name", NAMES)
def test_stream_final_and_decode_agree_on_tgis_own_loop(name, loop_run):
    """Every request through TGI's loop with the shim: the streamed texts joined == the
    final ``generated_text`` == the decode, cut at the stop; the ids end where the request
    must end, with the right finish code; ``current_tokens`` and ``generated_tokens`` count
    the ids; ``is_special`` only where a special id's text is ``""``; the criteria are freed
    by the ``filter`` that drops the request."""
    tok = tokenizer_zoo.load(name)
    run = loop_run(name)
    special = set(tok.all_special_ids)
    for rid, meta in run["meta"].items():
        rec = run["ours"][rid]
        assert rec["ours"], rid
        k, code, text = expected(tok, meta, rec["ids"])
        assert (len(rec["ids"]), rec["finish_reason"]) == (k, code), (rid, meta)
        assert "".join(rec["texts"]) == rec["final"] == text, (rid, meta)
        assert rec["generated_tokens"] == rec["current_tokens"] == len(rec["ids"])
        for tid, t, s in zip(rec["ids"], rec["texts"], rec["is_special"]):
            assert s == (tid in special and t == "")
        assert rec["freed"], rid


def test_the_corpus_splits_characters_and_stops(loop_run):
    """The skewed weights do what the tests need: characters split across ids (U+FFFD in a
    lone id's decode), stop strings that complete, a special-token stop, EOS and length."""
    for name in NAMES:
        tok = tokenizer_zoo.load(name)
        run = loop_run(name)
        ids = [i for rec in run["ours"].values() for i in rec["ids"]]
        assert sum("\ufffd" in tok.decode([i]) for i in ids) > len(ids) // 10, name
        codes = [rec["finish_reason"] for rec in run["ours"].values()]
        assert codes.count(STOP_SEQUENCE) >= 3 and codes.count(LENGTH) >= 3, (name, codes)


# --- where stock TGI differs: stock is the one that is wrong ---------------------------


def _stock_final_differs(tok, meta, rec) -> bool:
    # TGI #1235: generated_text is decode_token over the last prompt id + outputs, "" when
    # the output ends inside a character. Judged by stock's own rule (the stop kept).
    return rec["final"] != reference(tok, meta["prompt"], rec["ids"])


def _stop_text_kept(tok, meta, rec) -> bool:
    # TGI #1254, #1724: the matched stop string is streamed and kept in generated_text.
    return rec["finish_reason"] == STOP_SEQUENCE and any(s and rec["final"].endswith(s) for s in meta["stops"])


def _stop_missed(tok, meta, rec) -> bool:
    # TGI #1039: a stop completed by an id whose streamed text was held (or that is a
    # special token's text) does not stop the request; it runs past it.
    k, code, _ = expected(tok, meta, rec["ids"])
    return code == STOP_SEQUENCE and k < len(rec["ids"])


def _special_text_streamed(tok, meta, rec) -> bool:
    # Stock streams special tokens' text (decode_token with skip_special_tokens=False).
    specials = set(tok.all_special_tokens)
    return any(t in specials for t in rec["texts"])


def _stream_differs_from_final(tok, meta, rec) -> bool:
    return "".join(rec["texts"]) != rec["final"]


#: Every way stock TGI is wrong that these tests know of, by name: the check on a stock
#: request, and the tokenizers on whose corpus at least one request shows it.
STOCK_WRONG = {
    "final_text_differs_from_decode": (_stock_final_differs, NAMES),
    "stop_text_kept": (_stop_text_kept, NAMES),
    "stop_missed": (_stop_missed, ("qwen3", "smollm2")),
    "special_token_text_streamed": (_special_text_streamed, NAMES),
    "stream_differs_from_final": (_stream_differs_from_final, NAMES),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", sorted(STOCK_WRONG))
def test_where_stock_differs_stock_is_wrong(name, case, loop_run):
    """Each named way stock TGI is wrong shows on this tokenizer's corpus where expected;
    the shim is right on the same requests (the test above checks all of them)."""
    check, names = STOCK_WRONG[case]
    tok = tokenizer_zoo.load(name)
    run = loop_run(name)
    wrong = [rid for rid, meta in run["meta"].items() if check(tok, meta, run["stock"][rid])]
    if case in ("stop_missed", "special_token_text_streamed", "stream_differs_from_final"):
        assert not any(check(tok, meta, run["ours"][rid]) for rid, meta in run["meta"].items())
    print(f"{name} {case}: stock wrong on {len(wrong)} of {len(run['meta'])} requests")
    if name in names:
        assert wrong, f"stock is no longer wrong here ({case}): drop the case for {name}"


# --- a real server: text-generation-server serve, through TGI's gRPC stubs -------------


def _serve(model: Path, tmp: Path, flag: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Start ``text-generation-server serve`` (DETOK_PLUGIN=flag) on a Unix socket, drive
    it with the harness's gRPC client, stop it; the client's report and the JSON log lines
    the server printed (what TGI's launcher parses and shows)."""
    scripts = Path(tgi_python()).parent
    uds = tmp / f"tgi-{flag}"
    log = (tmp / f"serve-{flag}.log").open("w+")
    proc = subprocess.Popen(
        [str(scripts / "text-generation-server"), "serve", str(model), "--uds-path", str(uds), "--json-output"],
        stdout=log, stderr=subprocess.STDOUT, env=_env(DETOK_PLUGIN=flag),
    )
    try:
        socket = Path(f"{uds}-0")
        deadline = time.monotonic() + 300
        while not socket.exists():
            assert proc.poll() is None, Path(log.name).read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not open its socket in 300 s"
            time.sleep(1)
        report = tmp / f"client-{flag}.json"
        _harness("client", str(socket), str(model), str(report), timeout=300)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    lines = []
    for line in Path(log.name).read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return json.loads(report.read_text()), lines


def test_a_real_server_with_the_flag_on_and_off(model_dir, tmp_path):
    """The start-up hook switches the shim on in a real ``text-generation-server serve``
    when ``DETOK_PLUGIN=1``, and says so in a line TGI's launcher shows (a loguru JSON
    record on stdout, level INFO); with ``DETOK_PLUGIN=0`` TGI is stock."""
    pth = subprocess.run(
        [tgi_python(), "-c", "import sysconfig, pathlib; from detok_plugin.integrations import tgi; "
         "print((pathlib.Path(sysconfig.get_paths()['purelib']) / tgi.PTH_NAME).exists())"],
        capture_output=True, text=True, env=_env(), timeout=300,
    )
    if pth.stdout.strip() != "True":
        pytest.skip("the start-up hook is not installed in DETOK_TGI_PYTHON's site-packages: "
                    "run $DETOK_TGI_PYTHON -m detok_plugin.integrations.tgi install-pth")
    name = "qwen3"
    tok = tokenizer_zoo.load(name)
    model = model_dir(name)
    on, on_lines = _serve(model, tmp_path, "1")
    off, off_lines = _serve(model, tmp_path, "0")

    def said_on(lines: list[dict[str, Any]]) -> bool:
        return any(r["record"]["level"]["name"] == "INFO" and r["text"].startswith("detok-plugin: on")
                   for r in lines)

    assert said_on(on_lines) and not said_on(off_lines)
    assert len(on["requests"]) == len(on["meta"]) == 16
    for rid, meta in on["meta"].items():
        rec = on["requests"][rid]
        meta = {**meta, "ignore_eos": int(rid) % 5 == 0, "max_new_tokens": 8 + (int(rid) * 7) % 33}
        k, code, text = expected(tok, meta, rec["ids"])
        assert (len(rec["ids"]), rec["finish_reason"]) == (k, code), rid
        assert "".join(rec["texts"]) == rec["final"] == text, rid
    stock_wrong = [rid for rid, meta in off["meta"].items()
                   if off["requests"][rid]["final"] != reference(tok, meta["prompt"], off["requests"][rid]["ids"])]
    assert stock_wrong, "the server with DETOK_PLUGIN=0 agreed with the decode everywhere: is it stock?"
