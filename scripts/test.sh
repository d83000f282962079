#!/usr/bin/env bash
# The whole test run: lint, format check, types, import contracts, then pytest (unit, component,
# Kubernetes and end-to-end tiers), then the slow tier: real vLLM on CPU, prefill and decode behind the
# gateway with Tandem's KV connector (e2e/test_vllm_pd.py, e2e/test_vllm_routing.py, e2e/test_vllm_lora.py with LoRA adapters, e2e/test_vllm_hetero_tp.py with prefill TP != decode TP; installs .venv-vllm and builds the tiny model
# first, a few minutes), then, in .venv-vllm, the connector's tests that need torch and vLLM, the
# gateway's LMCache keys against LMCache's own, and vLLM's own parser over the operator's engine arguments for every example. TANDEM_SKIP_SLOW=1 leaves the slow tier out. Extra arguments go to the first
# pytest run, e.g. `TANDEM_SKIP_SLOW=1 bash scripts/test.sh -k router`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh dev
step() { printf '\n== %s\n' "$*" >&2; }
step "ruff check";  .venv/bin/ruff check .
step "ruff format"; .venv/bin/ruff format --check .
step "mypy --strict"; .venv/bin/mypy
step "import contracts"; .venv/bin/lint-imports
step "pytest"; .venv/bin/python -m pytest -m "not slow" --durations=25 "$@"
if [ "${TANDEM_SKIP_SLOW:-0}" = 1 ]; then
  step "slow tier skipped (TANDEM_SKIP_SLOW=1)"
  exit 0
fi
step "slow tier: real vLLM on CPU"
bash scripts/bootstrap.sh vllm
TANDEM_SLOW=1 .venv/bin/python -m pytest -m slow e2e/test_vllm_pd.py e2e/test_vllm_routing.py e2e/test_vllm_cold_start.py e2e/test_vllm_lmcache.py e2e/test_vllm_lora.py e2e/test_vllm_hetero_tp.py
step "slow tier: the KV connector on torch tensors, LMCache's own chunk keys, the examples' engine arguments through vLLM's parser (.venv-vllm)"
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
.venv-vllm/bin/python -m pip install -q --disable-pip-version-check \
  "pytest==$(version pytest)" "pytest-asyncio==$(version pytest-asyncio)"
.venv-vllm/bin/python -m pytest tests/kvpool/test_kv_blocks.py tests/kvpool/test_vllm_connector_worker.py \
  tests/kvpool/test_lmcache_keys_vllm.py tests/vllm_engine
