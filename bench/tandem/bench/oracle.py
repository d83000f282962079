"""The autoscaling oracle: the fewest replicas per second that would have met the SLO on a run's actual
arrivals, given each pool's measured capacity, to set an autoscaler's replica-seconds against.

Inputs, per pool (`PoolCapacity`): `rps`, the highest request rate one engine of the pool serves within
the SLO for the workload's prompt and output lengths (measured beforehand, e.g. with `tandem bench
--direct` at rising `rate`, the last rate whose SLO attainment stays ≥ 99%); `start_s`, the seconds from
asking for an engine to its being ready; `min_replicas`, the pool's floor.

The oracle knows the future. At every step t it holds `needed(t) = max(min, ⌈rate(t) / rps⌉)` ready
replicas, where `rate(t)` is the larger of the arrival rates over the window ahead, [t, t + window_s),
and the window behind, [t + step_s − window_s, t + step_s): ahead, so that a replica is ready before
the requests it serves arrive; behind, so that it stays until the requests of the window have been
served; a window, not a step, so that Poisson noise is smoothed as an autoscaler's stable window
smooths it. Each replica it adds was asked for `start_s` earlier, so its start is paid too:

    ready replica-seconds    = Σ needed(t) · step_s
    starting replica-seconds = Σ max(0, needed(t) − needed(t − step_s)) · start_s

Example (rps 2, start 5 s, window 1 s, steps of 1 s): arrivals at 1 req/s for 10 s, then 5 req/s for
10 s → needed 1 × 10 then 3 × 10: ready 40 replica-seconds, 2 replicas started once: 10 starting
replica-seconds, 50 in all. A fixed-for-peak deployment holds 3 the whole 20 s: 60.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PoolCapacity:
    """One pool's measured capacity (module docstring); rates in requests per wall second."""

    pool: str
    rps: float
    start_s: float = 0.0
    min_replicas: int = 1

    def __post_init__(self) -> None:
        if self.rps <= 0 or self.start_s < 0 or self.min_replicas < 0:
            raise ValueError(f"pool {self.pool!r}: rps must be > 0, start and min >= 0, got {self}")


@dataclass(frozen=True)
class OracleRun:
    """What the oracle would have held: replicas per step, and their cost in replica-seconds."""

    pool: str
    needed: tuple[int, ...]
    ready_replica_s: float
    starting_replica_s: float

    @property
    def replica_s(self) -> float:
        return self.ready_replica_s + self.starting_replica_s

    @property
    def peak(self) -> int:
        return max(self.needed, default=0)


def oracle(
    arrivals: Sequence[float],
    capacity: PoolCapacity,
    *,
    duration_s: float,
    window_s: float = 5.0,
    step_s: float = 1.0,
) -> OracleRun:
    """The oracle's replicas over [0, duration_s) for requests arriving at `arrivals` (wall seconds
    since the run started)."""
    if window_s <= 0 or step_s <= 0:
        raise ValueError("window_s and step_s must be > 0")
    times = sorted(arrivals)
    needed: list[int] = []
    for index in range(max(0, math.ceil(duration_s / step_s))):
        start = index * step_s
        ahead = _count(times, start, start + window_s)
        behind = _count(times, start + step_s - window_s, start + step_s)
        rate = max(ahead, behind) / window_s
        needed.append(max(capacity.min_replicas, math.ceil(rate / capacity.rps - 1e-9)))
    previous = [capacity.min_replicas, *needed[:-1]]
    started = sum(max(0, now - before) for before, now in zip(previous, needed, strict=True))
    return OracleRun(
        pool=capacity.pool,
        needed=tuple(needed),
        ready_replica_s=sum(needed) * step_s,
        starting_replica_s=started * capacity.start_s,
    )


def _count(times: Sequence[float], start: float, end: float) -> int:
    """Arrivals in [start, end) of the sorted `times`."""
    return bisect.bisect_left(times, end) - bisect.bisect_left(times, start)


def parse_capacity(text: str) -> PoolCapacity:
    """`POOL=RPS[:START_S[:MIN]]` (the `--oracle` flag), e.g. `prefill=2.5:6`. Raises ValueError."""
    pool, sep, rest = text.partition("=")
    fields = rest.split(":")
    if not sep or not pool or not 1 <= len(fields) <= 3:
        raise ValueError(f"{text!r}: expected POOL=RPS[:START_S[:MIN]], e.g. prefill=2.5:6")
    try:
        rps = float(fields[0])
        start_s = float(fields[1]) if len(fields) > 1 else 0.0
        floor = int(fields[2]) if len(fields) > 2 else 1
    except ValueError:
        raise ValueError(f"{text!r}: RPS and START_S are numbers, MIN a whole number") from None
    return PoolCapacity(pool=pool, rps=rps, start_s=start_s, min_replicas=floor)


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The comparison as a table: the run's replica-seconds ÷ the oracle's and ÷ fixed-for-peak."""

    def num(value: float | None, spec: str) -> str:
        return "–" if value is None else format(value, spec)

    lines = [
        "| pool | replica-seconds (ready) | oracle (ready + starting) | oracle peak | fixed-for-peak "
        "| ÷ oracle | ÷ fixed-for-peak |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        ready = row["oracle_ready_replica_s"]
        starting = row["oracle_replica_s"] - ready
        cells = [
            row["pool"],
            num(row["replica_s"], ".0f"),
            f"{row['oracle_replica_s']:.0f} ({ready:.0f} + {starting:.0f})",
            str(row["oracle_peak"]),
            f"{row['fixed_for_peak_replica_s']:.0f}",
            f"{num(row['vs_oracle'], '.2f')}×",
            f"{num(row['vs_fixed'], '.2f')}×",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare(
    measured: Mapping[str, float], runs: Sequence[OracleRun], *, duration_s: float
) -> list[dict[str, Any]]:
    """Per pool: the run's ready replica-seconds (`measured`, keyed by pool name or `service/pool`)
    against the oracle's and against a fixed-for-peak deployment (the oracle's peak, all run long)."""
    rows = []
    for run in runs:
        value = next((v for k, v in measured.items() if k == run.pool or k.endswith(f"/{run.pool}")), None)
        fixed = run.peak * duration_s
        rows.append(
            {
                "pool": run.pool,
                "replica_s": value,
                "oracle_replica_s": run.replica_s,
                "oracle_ready_replica_s": run.ready_replica_s,
                "oracle_peak": run.peak,
                "fixed_for_peak_replica_s": fixed,
                "vs_oracle": None if value is None or run.replica_s == 0 else value / run.replica_s,
                "vs_fixed": None if value is None or fixed == 0 else value / fixed,
            }
        )
    return rows
