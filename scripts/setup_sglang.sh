#!/usr/bin/env bash
# A real SGLang beside the test venv: sglang 0.5.23 in its own venv (.venv-sglang), since it
# pins transformers 5.19 (the test venv's vLLM 0.33 wants 5.20) and torch 2.14.1 with CUDA.
# Installed --no-deps on the CPU build of torch 2.13.0, with the light dependencies its
# server needs to run a text model on this CPU (SGLANG_USE_CPU_ENGINE=1 --device cpu
# --attention-backend torch_native --disable-overlap-schedule: torch's path in every layer).
# PyPI has no CPU build of its kernel package (sglang-kernel, module sgl_kernel), and
# torchvision's wheels are built for a CUDA torch: both are replaced, in this venv only, by
# the inert test stand-ins of tests/support/sglang_standin (every function raises naming
# the op), which only let SGLang import. Then detok-plugin, editable (the sglang.srt.plugins
# entry point). Idempotent: a stamp keyed by this script's content skips a finished install.
# Quiet: pip's log is shown only if a step fails. Prints the venv's python on its last line.
#
#   bash scripts/setup_sglang.sh            # set up, print .venv-sglang/bin/python
#   DETOK_SGLANG_VENV=/path bash scripts/... # another venv (default .venv-sglang)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${DETOK_SGLANG_VENV:-.venv-sglang}"
PY="${PYTHON:-python3}"
say() { echo "sglang: $*" >&2; }
# One installer at a time (test modules may ask for it at once); the lock lives in the venv's
# directory, which .gitignore covers.
mkdir -p "$VENV"
exec 9>"$VENV/.setup.lock"
flock 9
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
LOG="$VENV/setup.log"
# --no-compile: Python compiles what SGLang imports on first use; compiling every file of
# torch, triton and sglang at install took most of the install's CPU time.
pip_() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" --no-compile >>"$LOG" 2>&1 || { cat "$LOG" >&2; exit 1; }; }
STAMP="$VENV/.detok-sglang-$(sha1sum scripts/setup_sglang.sh | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
    say "installing sglang 0.5.23 into $VENV (first run only; a few minutes)"
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    # torch is pinned for every step: a bare or ranged torch would pull CUDA builds.
    echo "torch==2.13.0" >"$WORK/constraints.txt"
    # sglang pins torch 2.14.1, CUDA kernels and 60 more packages: it goes in --no-deps;
    # so do xgrammar (its grammar backend, imported at start) and triton (SGLang's
    # utilities import it at module level; it imports on a CPU).
    pip_ install --no-deps sglang==0.5.23 xgrammar==0.2.7 triton==3.7.1
    # What SGLang's server imports on the way to serving a text model, and their own
    # dependencies: every version pinned (sglang 0.5.23's own pins where it has them:
    # transformers 5.19.0, tokenizers 0.23.2, openai 2.8.0, ...), installed --no-deps, so
    # pip resolves nothing (a resolve of the unpinned list took minutes here).
    cat >"$WORK/pins.txt" <<'PINS'
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
apache-tvm-ffi==0.1.11
asttokens==3.0.2
attrs==26.1.0
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
click==8.5.1
compressed-tensors==0.18.0
dill==0.4.1
distro==1.9.0
einops==0.8.2
executing==2.3.0
fastapi==0.165.0
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
gguf==0.19.0
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httpx==0.28.1
huggingface_hub==1.33.0
idna==3.20
interegular==0.3.3
ipython==9.18.1
ipython_pygments_lexers==1.1.1
jedi==0.20.1
Jinja2==3.1.6
jiter==0.19.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
loguru==0.7.3
markdown-it-py==4.3.0
MarkupSafe==3.0.4
matplotlib-inline==0.2.2
mdurl==0.1.2
mpmath==1.3.0
msgspec==0.22.0
multidict==7.2.1
networkx==3.6.1
numpy==2.4.6
openai==2.8.0
openai-harmony==0.0.4
opentelemetry-api==1.45.2
orjson==3.13.0
packaging==26.4
parso==0.8.7
partial-json-parser==0.2.1.1.post7
pexpect==4.9.0
pillow==13.0.0
prometheus_client==0.26.0
prompt_toolkit==3.0.53
propcache==0.5.4
psutil==7.2.2
ptyprocess==0.7.0
pure_eval==0.2.4
pybase64==1.5.1
pycparser==3.12
pydantic==2.14.4
pydantic_core==2.50.5
Pygments==2.21.0
python-multipart==0.0.34
PyYAML==6.0.4
pyzmq==27.3.0
referencing==0.37.0
regex==2026.11.19
requests==2.34.2
rich==15.0.0
rpds-py==2026.9.1
safetensors==0.8.0
sentencepiece==0.2.1
setproctitle==1.3.8
shellingham==1.5.4
sniffio==1.3.1
soundfile==0.13.1
stack-data==0.6.3
starlette==1.10.0
sympy==1.14.0
tiktoken==0.14.0
tokenizers==0.23.2
torch==2.13.0
tqdm==4.70.1
traitlets==5.16.1
transformers==5.19.0
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
uvicorn==0.54.0
uvloop==0.23.0
wcwidth==0.9.4
xxhash==4.1.0
yarl==1.25.1
PINS
    pip_ install --no-deps -c "$WORK/constraints.txt" -r "$WORK/pins.txt"
    touch "$STAMP"
fi
# The inert stand-ins (sgl_kernel, torchvision): a .pth that puts their directory on the
# path and arms them, only where the real package is absent.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\nimport detok_sglang_standin; detok_sglang_standin.install()\n' "$PWD/tests/support/sglang_standin" >"$SITE/detok_sglang_standin.pth"
pip_ install --no-deps -e .
echo "$VENV/bin/python"
