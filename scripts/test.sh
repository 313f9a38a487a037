#!/usr/bin/env bash
# The README's test command: set up .venv, the real vLLM engine's venv and SGLang's, then run the
# whole suite (tests/integrations/vllm/test_vllm_engine.py drives real `vllm serve` processes from
# .venv-vllm; tests/integrations/sglang/ drives SGLang from .venv-sglang).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_vllm_engine.sh >/dev/null
bash scripts/setup_sglang.sh >/dev/null
export DETOK_HYPOTHESIS_EXAMPLES="${DETOK_HYPOTHESIS_EXAMPLES:-100}"
# vLLM's own tests (marker vllm_upstream, 20-30 min on two cores) run on request, to keep the
# whole command well inside CI's 90 minutes: DETOK_TEST_MARKERS="" bash scripts/test.sh runs them too.
exec .venv/bin/python -m pytest -q -rs -m "${DETOK_TEST_MARKERS-not vllm_upstream}" "$@"
