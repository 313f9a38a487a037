#!/usr/bin/env bash
# The README's test command: set up .venv, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DETOK_HYPOTHESIS_EXAMPLES="${DETOK_HYPOTHESIS_EXAMPLES:-300}"
exec .venv/bin/python -m pytest -q -rs "$@"
