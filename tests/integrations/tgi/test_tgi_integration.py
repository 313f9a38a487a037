"""The TGI shim's own code, without TGI (``detok_plugin.integrations.tgi``).

None of this is evidence about TGI: TGI's server is not on PyPI, so what the shim does
inside TGI's loop is tested in tests/integrations/tgi/test_tgi_server.py (marker ``tgi``) where it is
installed. Here: import hygiene, the switch, the start-up hook, the mapping of stops,
EOS and length to TGI's finish codes and texts, on real tokenizers against their decode,
and which request's texts each ``Generation`` of a step gets (stand-ins of TGI's records
with the fields the shim reads).
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import types
from pathlib import Path

import pytest
from detok_plugin.integrations import tgi
from detok_plugin.integrations.tgi import _framework as tgi_framework
from detok_plugin.integrations.tgi import patching as tgi_install
from detok_plugin.integrations.tgi.request import (
    FINISH_EOS_TOKEN,
    FINISH_LENGTH,
    FINISH_STOP_SEQUENCE,
    RequestText,
    Settings,
    special_stop_ids,
)

ROOT = Path(__file__).resolve().parents[3]
NAMES = ("qwen3", "mistral_v1", "smollm2")


# --- import hygiene, the switch, the hook ------------------------------------------------


def test_importing_the_shim_imports_no_framework():
    code = (
        "import sys; import detok_plugin.integrations.tgi; "
        "print(sorted(m for m in ('torch', 'transformers', 'text_generation_server', 'loguru', 'grpc') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_install_without_tgi_names_what_is_missing():
    if _has_tgi():
        pytest.skip("TGI is installed here")
    with pytest.raises(ImportError, match="text-generation-server is not installed"):
        tgi.install(Settings(enabled=True))
    with pytest.raises(ImportError, match="text-generation-server"):
        tgi.contract_problems()
    assert not tgi.installed()


def _has_tgi() -> bool:
    import importlib.util

    return importlib.util.find_spec("text_generation_server") is not None


@pytest.mark.parametrize(
    "env, want",
    [
        ({}, Settings()),
        ({"DETOK_PLUGIN": "1"}, Settings(enabled=True)),
        ({"DETOK_PLUGIN": "off"}, Settings()),
        ({"DETOK_PLUGIN": "yes", "DETOK_TGI_STOP": "keep"}, Settings(enabled=True, keep_stop=True)),
        ({"DETOK_PLUGIN": "1", "DETOK_TGI_STRIP_REASONING": "qwen3"}, Settings(enabled=True, strip_reasoning="qwen3")),
    ],
)
def test_settings_from_the_environment(env, want):
    assert Settings.from_env(env) == want


def test_odd_values_are_named_and_keep_their_defaults():
    s = Settings.from_env({"DETOK_PLUGIN": "maybe", "DETOK_TGI_STOP": "drop", "DETOK_TGI_STRIP_REASONING": "nope"})
    assert (s.enabled, s.keep_stop, s.strip_reasoning) == (False, False, None)
    assert [p.split("=")[0] for p in s.problems] == ["DETOK_PLUGIN", "DETOK_TGI_STOP", "DETOK_TGI_STRIP_REASONING"]


def test_a_regular_install_ships_the_hook(tmp_path):
    """The wheel has the hook at its root (site-packages), exactly PTH_LINE."""
    import zipfile

    assert (ROOT / "integrations" / tgi.PTH_NAME).read_text() == tgi.PTH_LINE + "\n"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    [wheel] = tmp_path.glob("detok_plugin-*.whl")
    assert zipfile.ZipFile(wheel).read(tgi.PTH_NAME).decode().strip() == tgi.PTH_LINE


@pytest.mark.parametrize("flag, armed", [("1", True), ("0", False), ("maybe", False), (None, False)])
def test_the_hook_arms_on_the_flag_and_imports_nothing_else(tmp_path, flag, armed):
    """A fresh interpreter processes the hook's .pth (``site.addsitedir`` runs its line as
    ``site`` does at start-up): with the flag it waits for TGI's serving module and has
    imported no framework; without it, the shim is not even imported. Whatever the flag,
    a process that does not import TGI's server hears nothing from the hook."""
    assert tgi._main(["install-pth", "--site-dir", str(tmp_path)]) == 0
    code = (
        f"import site, sys; site.addsitedir({str(tmp_path)!r}); "
        "shim = sys.modules.get('detok_plugin.integrations.tgi.patching'); "
        "armed = shim is not None and shim._HOOK in sys.meta_path; "
        "heavy = [m for m in ('torch', 'transformers', 'text_generation_server') if m in sys.modules]; "
        "print(armed, heavy)"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    if flag is not None:
        env["DETOK_PLUGIN"] = flag
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(armed), "[]"]
    assert out.stderr == ""


@pytest.mark.parametrize(
    "flag, line",
    [
        ("0", "detok-plugin: off (DETOK_PLUGIN=0); TGI keeps its stock text"),
        ("maybe", "detok-plugin: off (DETOK_PLUGIN='maybe' is not one of 1/0/true/false/yes/no/on/off; ignored); "
         "TGI keeps its stock text"),
        ("1", "detok-plugin: NOT switched on (DETOK_PLUGIN=1): ImportError: detok_plugin.integrations.tgi: "
         "text-generation-server is not installed"),
    ],
)
def test_the_hook_says_one_line_when_tgis_server_module_is_imported(tmp_path, flag, line):
    """What the switch did, said once, at the import of TGI's serving module (here a
    stand-in module of that name, as TGI is not installed: with the flag on, install() then
    finds no TGI and says why it stays stock)."""
    if _has_tgi():
        pytest.skip("TGI is installed here: tests/integrations/tgi/test_tgi_server.py runs its real server")
    (tmp_path / "site").mkdir()
    assert tgi._main(["install-pth", "--site-dir", str(tmp_path / "site")]) == 0
    server = tmp_path / "stand_in" / "text_generation_server"
    server.mkdir(parents=True)
    (server / "__init__.py").write_text("")
    (server / "server.py").write_text("")
    code = (
        f"import site, sys; site.addsitedir({str(tmp_path / 'site')!r}); "
        "import text_generation_server.server; import text_generation_server.server"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{tmp_path / 'stand_in'}", "DETOK_PLUGIN": flag}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    said = [x for x in out.stderr.splitlines() if "detok-plugin" in x]
    assert len(said) == 1 and said[0].startswith(line), out.stderr
    assert "UserWarning" not in out.stderr


def test_uninstall_disarms_the_hook(monkeypatch):
    monkeypatch.setenv("DETOK_PLUGIN", "1")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    tgi._startup()
    assert tgi_install._HOOK in sys.meta_path
    assert tgi.uninstall() is True
    assert tgi_install._HOOK not in sys.meta_path


# --- stops, EOS, length: codes and texts on real tokenizers ----------------------------


def _build(tok, prompt, **kw):
    kw.setdefault("stop_sequences", ())
    kw.setdefault("eos_token_ids", (tok.eos_token_id,))
    kw.setdefault("max_new_tokens", 100)
    return RequestText.build(tok, tok(prompt)["input_ids"], **kw)


def _run(req, ids):
    codes = []
    for tid in ids:
        codes.append(req.push(tid))
        if codes[-1] is not None:
            break
    return codes


def _decode(tok, prompt, ids):
    p = tok(prompt)["input_ids"]
    return tok.decode(p + ids, skip_special_tokens=True)[len(tok.decode(p, skip_special_tokens=True)):]


def _decode_ids(tok, prompt_ids, ids):
    whole = tok.decode(prompt_ids + ids, skip_special_tokens=True)
    return whole[len(tok.decode(prompt_ids, skip_special_tokens=True)):]


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name", NAMES)
def test_a_stop_ends_the_request_at_the_id_that_completes_it(name, load_tokenizer):
    tok = load_tokenizer(name)
    ids = _ids(tok, "你好🫨 and more text after it")
    req = _build(tok, "Q:", stop_sequences=["🫨"])
    codes = _run(req, ids)
    # The first prefix whose decode shows the stop is where it ends.
    k = next(k for k in range(1, len(ids) + 1) if "🫨" in _decode(tok, "Q:", ids[:k]))
    assert codes == [None] * (k - 1) + [FINISH_STOP_SEQUENCE]
    assert req.text == _decode(tok, "Q:", ids[:k]).split("🫨")[0]
    assert req.text == "".join(req.texts) and len(req.texts) == k


@pytest.mark.parametrize("name", NAMES)
def test_keep_stop_keeps_the_stop_and_nothing_after_it(name, load_tokenizer):
    tok = load_tokenizer(name)
    ids = _ids(tok, "ab 你好 cd")
    req = _build(tok, "Q:", stop_sequences=["你"], settings=Settings(keep_stop=True))
    _run(req, ids)
    whole = _decode(tok, "Q:", ids)
    assert req.text == whole[: whole.index("你") + 1]


@pytest.mark.parametrize("name", NAMES)
def test_eos_and_ignored_eos(name, load_tokenizer):
    tok = load_tokenizer(name)
    ids = _ids(tok, "hello 🫨") + [tok.eos_token_id] + _ids(tok, " more")
    req = _build(tok, "Q:")
    assert _run(req, ids)[-1] == FINISH_EOS_TOKEN and req.generated_tokens == len(_ids(tok, "hello 🫨")) + 1
    assert req.text == _decode(tok, "Q:", ids[: req.generated_tokens])
    ignoring = _build(tok, "Q:", eos_token_ids=(), max_new_tokens=len(ids))
    assert _run(ignoring, ids) == [None] * (len(ids) - 1) + [FINISH_LENGTH]
    assert ignoring.text == _decode(tok, "Q:", ids)


@pytest.mark.parametrize("name", NAMES)
def test_length_inside_a_character_renders_as_the_decode(name, load_tokenizer):
    """TGI #1235: stock's generated_text is "" when the output ends inside a character;
    here it is what the decode shows (U+FFFD where it has one)."""
    tok = load_tokenizer(name)
    ids = _ids(tok, "ok 🫨🫨")
    cut = next(k for k in range(1, len(ids)) if _decode(tok, "Q:", ids[:k]).endswith("\ufffd"))
    req = _build(tok, "Q:", max_new_tokens=cut)
    assert _run(req, ids)[-1] == FINISH_LENGTH
    assert req.text == _decode(tok, "Q:", ids[:cut])


@pytest.mark.parametrize("name", NAMES)
def test_a_stop_on_the_last_allowed_id_is_a_stop(name, load_tokenizer):
    tok = load_tokenizer(name)
    ids = _ids(tok, "one two")
    stop = _decode(tok, "Q:", ids)[-2:]
    req = _build(tok, "Q:", stop_sequences=[stop], max_new_tokens=len(ids))
    assert _run(req, ids)[-1] == FINISH_STOP_SEQUENCE


@pytest.mark.parametrize(
    "name, special", [("qwen3", "<|endoftext|>"), ("mistral_v1", "<unk>"), ("smollm2", "<|endoftext|>")]
)
def test_a_stop_equal_to_a_special_tokens_text_stops_at_its_id(name, special, load_tokenizer):
    tok = load_tokenizer(name)
    sid = tok.convert_tokens_to_ids(special)
    assert special_stop_ids(tok, ["x", special]) == (sid,)
    ids = _ids(tok, "hi 你") + [sid] + _ids(tok, " after")
    req = _build(tok, "Q:", stop_sequences=[special], eos_token_ids=())
    codes = _run(req, ids)
    assert len(codes) == len(_ids(tok, "hi 你")) + 1 and codes[-1] == FINISH_STOP_SEQUENCE
    assert req.text == _decode(tok, "Q:", ids[: len(codes)])


def test_texts_are_one_per_id_and_join_to_the_text(load_tokenizer):
    tok = load_tokenizer("qwen3")
    ids = _ids(tok, "🫨 你好 é")
    req = _build(tok, "Q:")
    for n, tid in enumerate(ids, 1):
        req.push(tid)
        assert len(req.texts) == n
    assert "".join(req.texts) == req.text == _decode(tok, "Q:", ids)
    assert req.texts[:3] == ["", "", "🫨"]  # 🫨 is three Qwen3 ids


def test_an_unknown_id_is_logged_not_raised(load_tokenizer, caplog):
    tok = load_tokenizer("qwen3")
    req = _build(tok, "Q:")
    with caplog.at_level(logging.WARNING, logger=tgi_framework.logger.name):
        assert req.push(10**9) is None
    assert req.texts == [""] and "1000000000" in caplog.text


def test_reasoning_can_be_stripped(load_tokenizer):
    tok = load_tokenizer("qwen3")
    ids = _ids(tok, "<think>plan 🫨</think>answer 你好")
    req = _build(tok, "Q:", settings=Settings(strip_reasoning="qwen3"))
    _run(req, ids)
    assert req.text == "answer 你好"
    plain = _build(tok, "Q:")
    _run(plain, ids)
    assert plain.text == _decode(tok, "Q:", ids)


# --- the step: each Generation gets its own request's texts ------------------------------


class _StockCriteria:
    """TGI's ``StoppingCriteria``'s shape (``utils/tokens.py``): the base the shim's subclasses."""

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


@dataclasses.dataclass
class _Tokens:  # TGI's models.types.Tokens, the fields rewrite reads
    token_ids: list
    texts: list
    is_special: list


@dataclasses.dataclass
class _Generation:  # TGI's models.types.Generation, the fields rewrite reads
    request_id: int
    tokens: _Tokens
    generated_text: object = None


@pytest.mark.parametrize(
    ("stock_at", "order"),
    [
        pytest.param(None, (0, 1, 2), id="all-ours-in-step"),
        pytest.param(1, (0, 1, 2), id="a-stock-request-between"),
        pytest.param(None, (2, 1, 0), id="as-many-out-of-step"),
        pytest.param(None, (2, 0), id="out-of-step-and-one-missing"),
        pytest.param(0, (2, 1), id="stock-first-and-out-of-step"),
    ],
)
def test_each_generation_gets_its_own_requests_texts(stock_at, order, load_tokenizer):
    from detok_plugin.integrations.tgi.step import criteria_class, prepare, rewrite

    tok = load_tokenizer("qwen3")
    cls = criteria_class(_StockCriteria, Settings(enabled=True))
    prompts = [_ids(tok, p) for p in ("Q:", "你", "Say")]
    outs = [_ids(tok, t) for t in ("🫨 ok", "好 é", " «ü»")]
    criterias = [_StockCriteria(50) if k == stock_at else cls.from_stock(_StockCriteria(50), (), tok) for k in range(3)]
    batch = types.SimpleNamespace(requests=[types.SimpleNamespace(id=10 + k) for k in range(3)],
                                  stopping_criterias=criterias, all_input_ids=prompts)
    sent = {k: [] for k in range(3)}
    for t in range(max(map(len, outs))):
        ours = prepare(batch, cls)
        for k in range(3):
            if t < len(outs[k]):
                criterias[k](outs[k][t], "stock")
        gens = [_Generation(10 + k, _Tokens([outs[k][t]], ["stock"], [False])) for k in order if t < len(outs[k])]
        rewrite(gens, ours)
        for g in gens:
            sent[g.request_id - 10] += g.tokens.texts
    for k in order:
        if k == stock_at:
            assert set(sent[k]) == {"stock"}  # TGI's own texts
        else:
            assert "".join(sent[k]) == _decode_ids(tok, prompts[k], outs[k])


@pytest.mark.parametrize("verb", ["push_text", "finish"])
def test_a_stream_that_raises_leaves_its_request_to_tgi_and_raises_nothing(verb, load_tokenizer, monkeypatch, caplog):
    """A RuntimeError in TGI's step kills the shard: should a request's stream raise (a
    bug), in the id-by-id ``push_text`` or in the ``finish`` that ends the request, the
    criteria logs it and answers as TGI's own from then on, and that request's records keep
    TGI's texts; the other request keeps the core's."""
    from detok_plugin.integrations.tgi.step import criteria_class, prepare, rewrite

    from detok_plugin import ServingStream

    tok = load_tokenizer("qwen3")
    outs = [_ids(tok, "🫨 ok 你好"), _ids(tok, "好 é «ü»")]
    prompts = [_ids(tok, "Q:"), _ids(tok, "Say")]
    fault_at = 3 if verb == "push_text" else len(outs[0])  # finish runs on the last id
    real = getattr(ServingStream, verb)
    calls = []

    def faulty(stream, *args):
        if stream.request_id == "10":
            calls.append(args)
            if len(calls) == (fault_at if verb == "push_text" else 1):
                raise RuntimeError("injected")
        return real(stream, *args)

    monkeypatch.setattr(ServingStream, verb, faulty)
    cls = criteria_class(_StockCriteria, Settings(enabled=True))
    criterias = [cls.from_stock(_StockCriteria(len(o)), (), tok) for o in outs]
    batch = types.SimpleNamespace(requests=[types.SimpleNamespace(id=10 + k) for k in range(2)],
                                  stopping_criterias=criterias, all_input_ids=prompts)
    sent, ends = {0: [], 1: []}, {}
    with caplog.at_level(logging.ERROR, logger=tgi_framework.logger.name):
        for t in range(max(map(len, outs))):
            ours = prepare(batch, cls)
            gens = []
            for k in range(2):
                if t < len(outs[k]):
                    stop, _ = criterias[k](outs[k][t], "stock")
                    if stop:
                        ends[k] = t
                    gens.append(_Generation(10 + k, _Tokens([outs[k][t]], ["stock"], [False])))
            rewrite(gens, ours)
            for g in gens:
                sent[g.request_id - 10] += g.tokens.texts
    assert ends == {0: len(outs[0]) - 1, 1: len(outs[1]) - 1}  # both end where TGI's counters say
    assert "request 10: RuntimeError('injected'); it goes on with TGI's stock text" in caplog.text
    cut = fault_at - 1
    assert sent[0][cut:] == ["stock"] * (len(outs[0]) - cut)  # TGI's own texts from the fault on
    assert "".join(sent[0][:cut]) == _decode_ids(tok, prompts[0], outs[0][:cut]).rstrip("\ufffd")
    assert "".join(sent[1]) == _decode_ids(tok, prompts[1], outs[1])
