"""Record the autoscaler's metrics once a second while a command runs; write timeline.json and a PNG.

Used for the demo in docs/autoscaler.md until `tandem bench --timeline` records the same:

    .venv/bin/python scripts/autoscaler-timeline.py --metrics http://127.0.0.1:9090/metrics \
        --out results/autoscale -- tandem bench --url http://127.0.0.1:8080/v1 --workload ramp ...

Each sample holds the seconds since start and every `tandem_autoscaler_*` gauge of the page
(series named `<metric>{pool}` or `<metric>`). Replica-seconds per pool are the sum of ready replicas
× the sampling period. With `--metrics` omitted and `--fixed prefill=N,decode=M`, it records the fixed
counts instead (a deployment without autoscaler).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

GAUGES = (
    "tandem_autoscaler_ready_replicas",
    "tandem_autoscaler_desired_replicas",
    "tandem_autoscaler_kv_utilization",
    "tandem_autoscaler_ttft_p90_seconds",
    "tandem_autoscaler_panic",
)


def sample(client: httpx.Client, url: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get(url, timeout=2).text):
        if family.name not in GAUGES:
            continue
        for s in family.samples:
            pool = s.labels.get("pool")
            values[f"{family.name}{{{pool}}}" if pool else family.name] = s.value
    return values


def record(url: str | None, fixed: dict[str, float], stop: threading.Event, out: list[dict[str, Any]]) -> None:
    start = time.monotonic()
    with httpx.Client(trust_env=False) as client:
        while not stop.is_set():
            t = time.monotonic() - start
            try:
                values = sample(client, url) if url else {}
            except (httpx.HTTPError, ValueError):
                values = {}
            for pool, n in fixed.items():
                values[f"tandem_autoscaler_ready_replicas{{{pool}}}"] = n
            out.append({"t": round(t, 2), **values})
            stop.wait(max(0.0, 1.0 - (time.monotonic() - start - t)))


def replica_seconds(timeline: list[dict[str, Any]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for before, after in zip(timeline, timeline[1:], strict=False):
        dt = after["t"] - before["t"]
        for pool in ("prefill", "decode"):
            key = f"tandem_autoscaler_ready_replicas{{{pool}}}"
            if key in before:
                totals[pool] = totals.get(pool, 0.0) + before[key] * dt
    return {pool: round(v, 1) for pool, v in totals.items()}


def plot(timeline: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [row["t"] for row in timeline]
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    for pool in ("prefill", "decode"):
        top.step(t, [row.get(f"tandem_autoscaler_ready_replicas{{{pool}}}") for row in timeline],
                 where="post", label=f"{pool} ready")  # fmt: skip
        top.step(t, [row.get(f"tandem_autoscaler_desired_replicas{{{pool}}}") for row in timeline],
                 where="post", linestyle=":", label=f"{pool} desired")  # fmt: skip
    top.set_ylabel("replicas")
    top.legend(loc="upper right", fontsize="small")
    mid.plot(t, [row.get("tandem_autoscaler_ttft_p90_seconds") for row in timeline], color="tab:red")
    mid.set_ylabel("prefill TTFT p90 (s)")
    low.plot(t, [row.get("tandem_autoscaler_kv_utilization") for row in timeline], color="tab:green")
    low.set_ylabel("decode KV util")
    low.set_xlabel("seconds")
    top.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", help="the autoscaler's /metrics URL")
    parser.add_argument("--fixed", default="", help="prefill=N,decode=M: fixed replica counts instead")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default="autoscaler timeline")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    fixed = {k: float(v) for k, v in (p.split("=") for p in args.fixed.split(",") if p)}
    args.out.mkdir(parents=True, exist_ok=True)
    timeline: list[dict[str, Any]] = []
    stop = threading.Event()
    recorder = threading.Thread(target=record, args=(args.metrics, fixed, stop, timeline))
    recorder.start()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    code = subprocess.call(command)
    stop.set()
    recorder.join()
    (args.out / "timeline.json").write_text(json.dumps(timeline))
    summary = {"replica_seconds": replica_seconds(timeline), "samples": len(timeline)}
    (args.out / "replica-seconds.json").write_text(json.dumps(summary, indent=2))
    plot(timeline, args.out / "timeline.png", args.title)
    print(json.dumps(summary))
    return code


if __name__ == "__main__":
    sys.exit(main())
