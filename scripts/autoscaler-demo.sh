#!/usr/bin/env bash
# The autoscaler demo of docs/autoscaler.md: the same ramp against the autoscaled local deployment
# (deploy/examples/local-autoscale.yaml, both pools 1-4) and against a fixed-size one (the same file
# with min = max = replicas = 4 in both pools: the autoscaler only observes, so `tandem bench
# --timeline` records its replica counts the same way). Simulated engines (Tandem's simulator, 7B-on-H100
# profile); nothing here is a real GPU.
#
#   scripts/autoscaler-demo.sh [OUT_DIR]      # default: results/autoscale-demo
#
# Each run: `tandem up` on 127.0.0.1:$PORT (autoscaler metrics on $METRICS_PORT), wait for the gateway,
# `tandem bench --workload ramp --timeline`, stop. Results: OUT_DIR/{autoscaled,fixed}/ (bench.md,
# bench.json, timeline.json, timeline.png, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/autoscale-demo}
PORT=${PORT:-18080}
METRICS_PORT=${METRICS_PORT:-19090}
TANDEM=${TANDEM:-.venv/bin/tandem}
PYTHON=${PYTHON:-.venv/bin/python}
EXAMPLE=deploy/examples/local-autoscale.yaml
mkdir -p "$OUT"

"$PYTHON" - "$EXAMPLE" "$OUT/fixed.yaml" <<'PY'
import sys

import yaml

doc = yaml.safe_load(open(sys.argv[1]))
doc["metadata"]["name"] = "fixed-demo"
for pool in ("prefill", "decode"):
    doc["spec"][pool]["replicas"] = 4
    doc["spec"][pool]["autoscaling"].update(min=4, max=4)
open(sys.argv[2], "w").write(yaml.safe_dump(doc, sort_keys=False))
PY

run() {  # run LABEL FILE
  local label=$1 file=$2 up_pid
  "$TANDEM" up -f "$file" --port "$PORT" --autoscaler-port "$METRICS_PORT" \
    --state-dir "$OUT/state-$label" >"$OUT/up-$label.log" 2>&1 &
  up_pid=$!
  for _ in $(seq 1 300); do
    grep -q '^ready:' "$OUT/up-$label.log" && break
    kill -0 "$up_pid" 2>/dev/null || { cat "$OUT/up-$label.log"; exit 1; }
    sleep 1
  done
  grep -q '^ready:' "$OUT/up-$label.log" || { echo "tandem up did not get ready" >&2; kill -INT "$up_pid"; exit 1; }
  "$TANDEM" bench --url "http://127.0.0.1:$PORT/v1" --model qwen --workload ramp \
    --param idle_rate=0.5 --param peak_rate=8 --param idle_s=20 --param ramp_up_s=10 --param peak_s=40 \
    --param ramp_down_s=10 --param tail_s=70 --param prompt_tokens=4000 --param output_tokens=100 \
    --slo-ttft-ms 1000 --slo-tpot-ms 100 --timeline "http://127.0.0.1:$METRICS_PORT" \
    --out "$OUT/$label" || true
  kill -INT "$up_pid"
  wait "$up_pid" || true
}

for label in ${RUNS:-autoscaled fixed}; do  # RUNS="autoscaled" repeats one of them
  if [ "$label" = autoscaled ]; then run autoscaled "$EXAMPLE"; else run fixed "$OUT/fixed.yaml"; fi
done
echo "results: $OUT/autoscaled/ and $OUT/fixed/ (bench.md, timeline.png)"
