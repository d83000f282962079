#!/usr/bin/env bash
# The benchmarks of docs/benchmarks.md, each with the exact command the doc shows.
# Usage: scripts/bench-field.sh [routing|pd|overhead|trace|all] [REPEAT]
# Results: bench-results/field/<name>/ (bench.json, bench.md, *.png; overhead.json/md/png).
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:-all}"
repeat="${2:-3}"
tandem=".venv/bin/tandem"
out="bench-results/field"

run() {
  local name="$1"
  shift
  echo "== $name: tandem bench $* --repeat $repeat --out $out/$name" >&2
  echo "   load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  "$tandem" bench "$@" --repeat "$repeat" --out "$out/$name"
}

if [[ "$which" == routing || "$which" == all ]]; then
  run routing --workload shared-prefix --seed 0 --engines 4 --time-scale 0.5 \
    --policy round-robin,tandem,prefix --peer vllm-router:round_robin --peer vllm-router:cache_aware --direct
fi
if [[ "$which" == pd || "$which" == all ]]; then
  run pd --workload shared-prefix --seed 0 --pd --prefill-engines 2 --engines 2 --time-scale 0.5 \
    --policy tandem --peer vllm-router:round_robin
fi
if [[ "$which" == trace || "$which" == all ]]; then
  run trace --workload mooncake-trace --param speed=2 --duration 15 --seed 0 --engines 4 --time-scale 0.5 \
    --policy round-robin,tandem --peer vllm-router:cache_aware
fi
if [[ "$which" == overhead || "$which" == all ]]; then
  run overhead --overhead-sweep 1,4,16,64,256 --sweep-requests 200 \
    --policy round-robin --peer vllm-router:round_robin
fi
