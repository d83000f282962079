"""Capacity profile: the highest request rate one engine serves within the SLO for a workload's prompt
and output lengths, the `RPS` the autoscaling oracle (`tandem.bench.oracle`, `--oracle`) divides by.

Method (`tandem bench --capacity-profile 2,4,6,8 --direct --workload ramp --param prompt_tokens=3000
--param output_tokens=120 --slo-ttft-ms 1000 --slo-tpot-ms 100`):

- the workload's own requests (their prompts, messages and `max_tokens`, in order, cycled when more are
  needed) are re-timed as Poisson arrivals at each rate for `seconds` (engine seconds, like every
  offset of a workload), one cold run per rate on fresh engines: `--direct` is one engine and no
  router; a `--policy` target is that gateway in front of the harness's pool (`--engines`,
  `--prefill-engines`, `--pd`), which measures the pool, not one engine;
- each run's SLO attainment (`tandem.bench.stats.slo_report`: both objectives, failures count as
  misses);
- the capacity is the highest rate whose attainment is at least `threshold` (0.99) **and** every lower
  rate's too (a lucky run above a failed one does not count); None when the lowest rate already fails.

Rates are in requests per engine second, as the workload's; `wall_rps` = rate × time scale is what
`--oracle POOL=RPS` takes, since the oracle reads the run's arrivals in wall seconds. Example, time
scale 0.5: attainment 1.0 at 4 and 6, 0.995 at 8, 0.48 at 10 → capacity 8 req/s, `--oracle
prefill=4`. A colocated simulated engine stands in for a prefill-only or decode-only one: it does both
jobs, so its capacity is a lower bound of either pool's.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tandem.bench.driver import DriverSettings
from tandem.bench.harness import HarnessError, PoolSettings, Progress, Tools, run_target
from tandem.bench.records import RequestRecord
from tandem.bench.stats import Slo, percentile, slo_report, timed
from tandem.bench.targets import Target
from tandem.bench.workloads import Workload

#: Attainment a rate must reach to count as served within the SLO.
DEFAULT_THRESHOLD = 0.99
#: Engine seconds of arrivals per rate.
DEFAULT_SECONDS = 30.0


def parse_rates(text: str) -> tuple[float, ...]:
    """`"2,4,6"` → (2.0, 4.0, 6.0), ascending and without repeats; raises ValueError naming a bad entry."""
    rates = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            rate = float(part)
        except ValueError:
            raise ValueError(f"--capacity-profile: {part!r} is not a number") from None
        if not rate > 0 or rate == float("inf"):
            raise ValueError(f"--capacity-profile: {part!r} is not a positive finite rate")
        rates.append(rate)
    if not rates:
        raise ValueError("--capacity-profile: give request rates, e.g. 2,4,6,8")
    return tuple(sorted(set(rates)))


def retimed(workload: Workload, *, rate: float, seconds: float, seed: int) -> Workload:
    """The workload's requests, in order and cycled, at Poisson arrivals of `rate` per engine second
    for `seconds`; at least one request. Open loop: the workload's concurrency bounds are dropped (a
    bound would hold arrivals back and measure less than the rate)."""
    if not workload.requests:
        raise ValueError(f"workload {workload.name!r} has no requests to re-time")
    rng = random.Random(f"tandem-bench:{seed}:capacity:{rate}")
    offsets, t = [], 0.0
    while True:
        offsets.append(t)
        t += rng.expovariate(rate)
        if t >= seconds:
            break
    source = workload.requests
    requests = tuple(
        replace(source[i % len(source)], offset_s=offset, group=f"rate-{rate:g}")
        for i, offset in enumerate(offsets)
    )
    params = {**workload.params, "capacity_rate": rate, "capacity_seconds": seconds}
    return Workload(f"{workload.name}@{rate:g}rps", requests, params)


def capacity(rows: Sequence[Mapping[str, Any]], *, threshold: float = DEFAULT_THRESHOLD) -> float | None:
    """The highest rate whose attainment, and every lower rate's, is at least `threshold` (module
    docstring); None when the lowest one misses. Example: 1.0, 1.0, 0.995, 0.48 at 4, 6, 8, 10 → 8."""
    best = None
    for row in sorted(rows, key=lambda r: r["rate"]):
        attainment = row["attainment"]
        if attainment is None or attainment < threshold:
            break
        best = row["rate"]
    return best


def profile_row(
    rate: float, *, label: str, records: Sequence[RequestRecord], slo: Slo, time_scale: float
) -> dict[str, Any]:
    """One rate's result: requests, successes, attainment and the latencies behind it (engine seconds)."""
    requests = timed(records, time_scale=time_scale)
    report = slo_report(requests, slo)
    ok = [r for r in requests if r.ok]
    return {
        "label": label,
        "rate": rate,
        "wall_rps": rate * time_scale,
        "requests": len(requests),
        "ok": len(ok),
        "attainment": report["attainment"],
        "ttft_p99_s": percentile([v for r in ok if (v := r.ttft) is not None], 99),
    }


def run_profile(
    target: Target,
    *,
    workload: Workload,
    rates: Sequence[float],
    seconds: float,
    pool: PoolSettings,
    tools: Tools,
    driver: DriverSettings,
    slo: Slo,
    state_dir: Path,
    seed: int,
    progress: Progress,
) -> list[dict[str, Any]]:
    """One cold run of `target` per rate, lowest first (module docstring); returns a `profile_row` each.
    Stops after the first rate under the threshold and the one above it: higher rates only fail
    harder, and each costs a whole run."""
    rows: list[dict[str, Any]] = []
    misses = 0
    for rate in rates:
        load = retimed(workload, rate=rate, seconds=seconds, seed=seed)
        progress(f"[{target.label}] capacity at {rate:g} req/s: {len(load.requests)} requests")
        try:
            run = run_target(
                target, workload=load, pool=pool, tools=tools, driver=driver,
                state_dir=state_dir / f"rate-{rate:g}", progress=progress,
            )  # fmt: skip
            records: Sequence[RequestRecord] = run.result.records
        except HarnessError as exc:
            progress(f"[{target.label}] failed at {rate:g} req/s: {exc}")
            records = ()
        row = profile_row(rate, label=target.label, records=records, slo=slo, time_scale=driver.time_scale)
        rows.append(row)
        attained = row["attainment"]
        progress(
            f"[{target.label}] {rate:g} req/s: {row['ok']}/{row['requests']} ok, SLO attainment "
            + ("-" if attained is None else f"{attained:.1%}")
        )
        misses += attained is None or attained < DEFAULT_THRESHOLD
        if misses >= 2:
            break
    return rows


def profile_markdown(rows: Sequence[Mapping[str, Any]], *, threshold: float, pools: Sequence[str]) -> str:
    """The table per rate, the capacity, and the `--oracle` flags it gives."""
    lines = [
        "| target | rate (req/s, engine time) | req/s wall | requests | ok | SLO attainment | TTFT p99 (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        attained = "-" if row["attainment"] is None else f"{row['attainment']:.1%}"
        p99 = "-" if row["ttft_p99_s"] is None else f"{row['ttft_p99_s']:.3f}"
        lines.append(
            f"| {row['label']} | {row['rate']:g} | {row['wall_rps']:g} | {row['requests']} | {row['ok']} "
            f"| {attained} | {p99} |"
        )
    out = "\n".join(lines) + "\n\n"
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        found = capacity(mine, threshold=threshold)
        if found is None:
            out += f"- {label}: no rate reached {threshold:.0%} attainment; try lower rates.\n"
            continue
        wall = next(r["wall_rps"] for r in mine if r["rate"] == found)
        flags = " ".join(f"--oracle {p}={wall:g}" for p in pools)
        top = " (the highest rate tried: try higher ones)" if found == max(r["rate"] for r in mine) else ""
        out += (
            f"- {label}: capacity **{found:g} req/s** (engine time; {wall:g} per wall second){top}: "
            f"`{flags}`\n"
        )
    return out
