"""vLLM's own detokenizer and output-processor tests, offline, against stock vLLM or the plugin.

vLLM publishes its test suite in its source distribution. This module fetches the sdist of
the vLLM version installed in the test venv (0.33.0, checked against its published
sha256), extracts only the test files that exercise detokenization without a GPU engine,
and runs them with pytest in a process of its own, once per mode of the
``detok_vllm_upstream`` pytest plugin (``tests/support/upstream/``): ``stock`` or ``plugin``.

The tests name Hugging Face hub models; there is no hub here. A hub cache is laid out under
the work directory (``HF_HOME``, ``HF_HUB_OFFLINE=1``) in which each repository the tests
name resolves to a real tokenizer built offline by :mod:`tokenizer_zoo` (tests/support): Llama 3's
own where they name Llama 3 (the output-processor tests hard-code its special tokens),
Mistral's Tekken for Pixtral, and for the others one of the same kind (byte-level BPE,
SentencePiece with byte fallback). The tests compute their expected texts with that
tokenizer's own ``decode`` at run time, so the stand-ins change the inputs, not what is
checked.

Used by ``tests/integrations/vllm/test_vllm_upstream.py``; runnable by hand::

    .venv/bin/python tests/support/vllm_upstream_suite.py plugin [pytest args...]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import tokenizer_zoo

__all__ = ["HUB", "VERSION", "prepare", "run"]

VERSION = "0.33.0"
_SDIST_URL = (
    "https://files.pythonhosted.org/packages/f7/25/"
    "aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz"
)
_SDIST_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"

# The test files, as paths inside the sdist's top directory, and the package files and
# fixtures they import.
_MEMBERS = (
    "tests/__init__.py",
    "tests/tokenizers_/__init__.py",
    "tests/tokenizers_/test_detokenize.py",
    "tests/detokenizer/__init__.py",
    "tests/detokenizer/test_check_stop_strings.py",
    "tests/detokenizer/test_min_tokens.py",
    "tests/detokenizer/test_stop_string_while_stop_model_terminates.py",
    "tests/v1/__init__.py",
    "tests/v1/engine/__init__.py",
    "tests/v1/engine/conftest.py",
    "tests/v1/engine/utils.py",
    "tests/v1/engine/test_output_processor.py",
    "tests/distributed/__init__.py",
    "tests/distributed/conftest.py",
    "tests/distributed/test_events.py",
)
_TEST_FILES = tuple(m for m in _MEMBERS if Path(m).name.startswith("test_") and "distributed" not in m)

# Hub repository the tests name -> (tokenizer from tokenizer_zoo, model config wanted).
# Llama 3 is the real one (the tests hard-code its special tokens); the others are real
# tokenizers of the same kind as the one named.
HUB = {
    "meta-llama/Llama-3.2-1B": ("llama3", True),
    "meta-llama/Llama-3.2-1B-Instruct": ("llama3", False),
    # byte-level BPE, GPT-2's alphabet: SmolLM2's tokenizer
    "facebook/opt-125m": ("smollm2", False),
    "openai-community/gpt2": ("smollm2", False),
    "EleutherAI/gpt-j-6b": ("smollm2", False),
    # byte-level BPE with a large vocabulary and many added tokens
    "bigcode/tiny_starcoder_py": ("deepseek_v3", False),
    "EleutherAI/pythia-70m": ("deepseek_v3", False),
    "tiiuae/falcon-7b": ("deepseek_v3", False),
    "bigscience/bloom-560m": ("qwen3", False),
    # SentencePiece with byte fallback
    "codellama/CodeLlama-7b-hf": ("mistral_v1", False),
    # Tekken (Mistral's tiktoken-style tokenizer, read by mistral-common)
    "mistralai/Pixtral-12B-2409": ("tekken", False),
}
_REVISION = "0" * 40


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _download(dest: Path) -> None:
    if dest.exists() and _sha256(dest) == _SDIST_SHA256:
        return
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    with urllib.request.urlopen(_SDIST_URL, timeout=120) as response, open(tmp, "wb") as out:
        shutil.copyfileobj(response, out)
    digest = _sha256(tmp)
    if digest != _SDIST_SHA256:
        tmp.unlink()
        raise RuntimeError(f"vllm-{VERSION}.tar.gz: sha256 {digest}, expected {_SDIST_SHA256}")
    tmp.replace(dest)


def _extract(sdist: Path, work: Path) -> None:
    top = f"vllm-{VERSION}/"
    with tarfile.open(sdist) as tar:
        for member in _MEMBERS:
            info = tar.getmember(top + member)
            target = work / member
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(info)
            assert source is not None, member
            target.write_bytes(source.read())
    (work / ".complete").touch()


def _tokenizer_files(name: str) -> Path:
    if name == "tekken":
        return tokenizer_zoo.package_file("mistral-common", "mistral_common/data/tekken_240911.json")
    return tokenizer_zoo.directory(name)


def _model_files() -> Path:
    from detok_plugin.gpu_runner.convert import default_model_directory

    return default_model_directory(tokenizer_zoo.CACHE_DIR, progress=None)


def _lay_out_hub(hub: Path) -> None:
    """A Hugging Face hub cache in which every repository ``HUB`` names resolves offline."""
    for repo, (tokenizer, wants_model) in HUB.items():
        root = hub / f"models--{repo.replace('/', '--')}"
        snapshot = root / "snapshots" / _REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / "main").write_text(_REVISION)
        files = _tokenizer_files(tokenizer)
        sources = [files] if files.is_file() else sorted(files.iterdir())
        if wants_model:
            model = _model_files()
            sources += [model / "config.json", model / "generation_config.json"]
        else:
            # Recorded as absent, so transformers does not ask the (offline) hub for it.
            absent = root / ".no_exist" / _REVISION
            absent.mkdir(parents=True, exist_ok=True)
            (absent / "config.json").touch()
        for source in sources:
            link = snapshot / ("tekken.json" if tokenizer == "tekken" else source.name)
            if not link.is_symlink():
                link.symlink_to(source)


def prepare(cache: Path | None = None) -> Path:
    """The work directory: vLLM's test files, a pytest.ini and the offline hub (idempotent)."""
    cache = cache or tokenizer_zoo.CACHE_DIR
    work = cache / f"vllm-{VERSION}-upstream-tests"
    if not (work / ".complete").exists():
        cache.mkdir(parents=True, exist_ok=True)
        sdist = cache / f"vllm-{VERSION}.tar.gz"
        _download(sdist)
        scratch = work.with_name(work.name + f".tmp{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        _extract(sdist, scratch)
        try:
            scratch.rename(work)
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)
            if not (work / ".complete").exists():
                raise
    # Its own ini file makes this directory pytest's rootdir: our pyproject's options
    # (doctest collection, testpaths) stay out of vLLM's run.
    (work / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    _lay_out_hub(work / "hf" / "hub")
    return work


def run(mode: str, work: Path, *pytest_args: str) -> dict[str, dict[str, object]]:
    """Run the extracted tests in ``mode``: per test id, its outcome and our detokenizers built.

    Outcomes are ``passed``, ``failed``, ``error`` (in setup or teardown) or ``skipped``;
    ``ours`` counts the plugin's detokenizers the test constructed (see
    ``tests/support/upstream/detok_vllm_upstream.py``).
    """
    report = work / f"report-{mode}-{os.getpid()}.json"
    env = dict(os.environ)
    env.update(
        DETOK_UPSTREAM_MODE=mode,
        DETOK_UPSTREAM_REPORT=str(report),
        HF_HOME=str(work / "hf"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        # A CUDA build of vLLM on a machine without a GPU detects no platform, and an engine
        # config (built by the output-processor tests' fixture) then has no device.
        VLLM_TARGET_DEVICE="cpu",
        PYTHONPATH=os.pathsep.join([str(Path(__file__).parent / "upstream"), str(Path(__file__).parent)]),
    )
    env.pop("DETOK_PLUGIN", None)
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "detok_vllm_upstream",
        "-W", "ignore", *_TEST_FILES, *pytest_args,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    if not report.exists():
        raise RuntimeError(f"vLLM's tests did not run (rc {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    try:
        return json.loads(report.read_text(encoding="utf-8"))
    finally:
        report.unlink()


def main(argv: list[str]) -> int:
    mode, *rest = argv
    outcomes = run(mode, prepare(), *rest)
    counts: dict[str, int] = {}
    for test, entry in sorted(outcomes.items()):
        print(f"{entry['outcome']:8} ours={entry['ours']:<3} {test}")
        counts[str(entry["outcome"])] = counts.get(str(entry["outcome"]), 0) + 1
    print(mode, counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
