#!/usr/bin/env bash
# The whole test run: lint, format check, types, import contracts, then pytest (unit, component,
# Kubernetes and end-to-end tiers). Extra arguments go to pytest, e.g. `bash scripts/test.sh -k router`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh dev
step() { printf '\n== %s\n' "$*" >&2; }
step "ruff check";  .venv/bin/ruff check .
step "ruff format"; .venv/bin/ruff format --check .
step "mypy --strict"; .venv/bin/mypy
step "import contracts"; .venv/bin/lint-imports
step "pytest"; .venv/bin/python -m pytest "$@"
