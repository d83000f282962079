"""The autoscaler timeline: what the autoscaler reported, second by second, next to what clients saw.

During an endpoint-mode run (`tandem bench --url ... --timeline URL`), `TimelineRecorder` scrapes
each URL's `/metrics` every `interval_s` (1 s) and keeps every **gauge** sample whose name starts
with `tandem_autoscaler_` (e.g. `tandem_autoscaler_desired_replicas{service,pool}`,
`tandem_autoscaler_ready_replicas{service,pool}`, `tandem_autoscaler_kv_utilization{service}`,
`tandem_autoscaler_ttft_p90_seconds{service}`) or is one of a gateway's per-engine capacity gauges
(`tandem_router_engine_capacity{pool,endpoint}`, `_capacity_confirmed`, `tandem_router_engine_dispatch_limit`:
give the gateway's URL to `--timeline` too), stamped with wall seconds since the run started. A
failed scrape is counted and skipped; it never fails the run.

`build_timeline` (pure) turns the samples and the run's request records into `timeline.json`:
- `series`: one per (url, name, labels) with its points `[t, value]`;
- `rolling_ttft`: at every second t, the p50 and p90 TTFT of requests whose first token arrived in
  (t − window_s, t] (engine seconds; None when none did);
- `replica_seconds`: per `ready_replicas` series (keyed `service/pool`), the integral of ready
  replicas over time, holding each sample until the next one (the last sample counts for nothing).
  Example: samples 1 at t=0, 3 at t=10, 3 at t=20 → 1 × 10 + 3 × 10 = 40 replica-seconds;
- `slo`: SLO attainment and goodput of the run (`tandem.bench.stats.slo_report`);
- `engine_capacity`: per engine (`endpoint` label; with several gateway workers, per worker too), the
  capacity C the gateway started from, the last one, and the first time it was confirmed (None:
  never). Example: `{"127.0.0.1:8101": {"first": 256, "last": 4, "confirmed_at_s": 1.0}}`.
Replica-seconds against SLO attainment is the autoscaler's trade-off: capacity paid for against
requests served within their objectives.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tandem.bench.counters import families
from tandem.bench.engines import metrics_url
from tandem.bench.stats import Slo, Timed, percentile, slo_report

PREFIX = "tandem_autoscaler_"
CAPACITY = "tandem_router_engine_capacity"
CONFIRMED = "tandem_router_engine_capacity_confirmed"
#: The gauges a timeline keeps: the autoscaler's, and a gateway's per-engine capacity.
PREFIXES = (PREFIX, CAPACITY, "tandem_router_engine_dispatch_limit")


@dataclass(frozen=True)
class Sample:
    """One gauge value: wall seconds since the run start, where it came from, name, labels, value."""

    t: float
    url: str
    name: str
    labels: Mapping[str, str]
    value: float


def parse_gauges(
    text: str, *, prefix: str | tuple[str, ...] = PREFIXES
) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every gauge sample whose name starts with `prefix` (one, or any of
    several; pure).

    Only the lines of wanted families are parsed (a gateway's page is mostly histograms the timeline
    does not keep, and parsing them every second cost the client CPU the run was measuring). Raises
    ValueError when a wanted line is not Prometheus exposition format.
    """
    prefixes = (prefix,) if isinstance(prefix, str) else prefix
    out = []
    for family in families(text, prefixes):
        if family.type != "gauge" or not family.name.startswith(prefix):
            continue
        for sample in family.samples:
            out.append((sample.name, dict(sample.labels), float(sample.value)))
    return out


@dataclass
class TimelineRecorder:
    """Scrapes `urls` every `interval_s` until cancelled; `samples` and `errors` grow as it goes."""

    urls: Sequence[str]
    client: httpx.AsyncClient
    interval_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    samples: list[Sample] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    first_errors: dict[str, str] = field(default_factory=dict)
    scrapes: int = 0

    async def run(self) -> None:
        t0 = self.clock()
        tick = 0
        while True:
            now = self.clock() - t0
            await asyncio.gather(*(self._scrape(url, now) for url in self.urls))
            self.scrapes += 1
            tick += 1
            await asyncio.sleep(max(0.0, tick * self.interval_s - (self.clock() - t0)))

    async def _scrape(self, url: str, now: float) -> None:
        try:
            response = await self.client.get(metrics_url(url), timeout=max(0.5, self.interval_s))
            response.raise_for_status()
            gauges = parse_gauges(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            self.errors[url] = self.errors.get(url, 0) + 1
            self.first_errors.setdefault(url, f"{type(exc).__name__}: {exc}")
            return
        self.samples.extend(Sample(now, url, name, labels, value) for name, labels, value in gauges)


def _series(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    grouped: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[list[float]]] = {}
    for s in samples:
        key = (s.url, s.name, tuple(sorted(s.labels.items())))
        grouped.setdefault(key, []).append([s.t, s.value])
    return [
        {"url": url, "name": name, "labels": dict(labels), "points": sorted(points)}
        for (url, name, labels), points in grouped.items()
    ]


def integral(points: Sequence[Sequence[float]]) -> float:
    """∫ of a step function that holds each [t, value] until the next point (docstring example: 40)."""
    ordered = sorted((p[0], p[1]) for p in points)
    return sum(v * (t2 - t1) for (t1, v), (t2, _) in itertools.pairwise(ordered))


def _pool_key(labels: Mapping[str, str]) -> str:
    parts = [labels.get("service", ""), labels.get("pool", "")]
    rest = [f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("service", "pool")]
    return "/".join(p for p in parts + rest if p) or "all"


def rolling_ttft(
    requests: Sequence[Timed], *, end_s: float, window_s: float, step_s: float, time_scale: float
) -> dict[str, list[Any]]:
    """p50/p90 TTFT (engine s) over a sliding window of first-token times (wall s), every `step_s`."""
    firsts = sorted(
        (r.token_times[0] / time_scale, r.ttft)
        for r in requests
        if r.ok and r.ttft is not None and r.token_times
    )
    out: dict[str, list[Any]] = {"t": [], "p50_s": [], "p90_s": [], "count": []}
    t = 0.0
    while t <= end_s + 1e-9:
        window = [ttft for at, ttft in firsts if t - window_s < at <= t]
        out["t"].append(round(t, 6))
        out["p50_s"].append(percentile(window, 50))
        out["p90_s"].append(percentile(window, 90))
        out["count"].append(len(window))
        t += step_s
    return out


def build_timeline(
    samples: Sequence[Sample],
    requests: Sequence[Timed],
    *,
    time_scale: float,
    slo: Slo,
    window_s: float = 10.0,
    step_s: float = 1.0,
) -> dict[str, Any]:
    """The timeline document (module docstring); times are wall seconds since the run start."""
    series = _series(samples)
    last_sample = max((s.t for s in samples), default=0.0)
    last_end = max((r.end / time_scale for r in requests if r.end is not None), default=0.0)
    replica_seconds: dict[str, float] = {}
    for s in series:
        if s["name"].removesuffix("_total").endswith("ready_replicas"):
            key = _pool_key(s["labels"])
            replica_seconds[key] = replica_seconds.get(key, 0.0) + integral(s["points"])
    return {
        "interval_s": step_s,
        "window_s": window_s,
        "duration_s": max(last_sample, last_end),
        "series": series,
        "rolling_ttft": rolling_ttft(
            requests,
            end_s=max(last_sample, last_end),
            window_s=window_s,
            step_s=step_s,
            time_scale=time_scale,
        ),
        "replica_seconds": replica_seconds,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, **slo_report(requests, slo)},
        "engine_capacity": engine_capacity(series),
    }


def engine_capacity(series: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per engine: the first and last `tandem_router_engine_capacity` and the first time its
    `_confirmed` gauge read 1 (module docstring); keyed by the `endpoint` label, with `@worker` when
    the gateway's workers report apart."""

    def key(labels: Mapping[str, str]) -> str:
        worker = labels.get("worker")
        return labels.get("endpoint", "?") + (f"@{worker}" if worker is not None else "")

    out: dict[str, dict[str, float | None]] = {}
    for s in series:
        if s["name"] == CAPACITY and s["points"]:
            entry = out.setdefault(key(s["labels"]), {"confirmed_at_s": None})
            entry["first"], entry["last"] = s["points"][0][1], s["points"][-1][1]
    for s in series:
        if s["name"] == CONFIRMED:
            at = next((t for t, v in s["points"] if v >= 1), None)
            out.setdefault(key(s["labels"]), {"first": None, "last": None})["confirmed_at_s"] = at
    return dict(sorted(out.items()))


def timeline_markdown(doc: Mapping[str, Any]) -> str:
    """Replica-seconds per pool next to SLO attainment."""
    slo = doc["slo"]
    lines = [
        "| pool | replica-seconds (ready) |",
        "| --- | ---: |",
        *[f"| {pool} | {value:.0f} |" for pool, value in sorted(doc["replica_seconds"].items())],
    ]
    attainment = "–" if slo["attainment"] is None else f"{slo['attainment'] * 100:.1f}%"
    lines += [
        "",
        f"SLO attainment (TTFT ≤ {slo['ttft_s'] * 1000:g} ms, TPOT ≤ {slo['tpot_s'] * 1000:g} ms): "
        f"{attainment} ({slo['met']} requests); goodput "
        f"{'–' if slo['goodput_rps'] is None else format(slo['goodput_rps'], '.2f')} req/s; "
        f"{len(doc['series'])} series over {doc['duration_s']:.0f} s.",
    ]
    capacity = doc.get("engine_capacity") or {}
    if capacity:
        lines += ["", "| engine | C at start | C at end | confirmed at (s) |", "| --- | ---: | ---: | ---: |"]
        for engine, c in capacity.items():
            at = c.get("confirmed_at_s")
            lines.append(
                f"| {engine} | {_number(c.get('first'))} | {_number(c.get('last'))} | "
                f"{'–' if at is None else format(at, '.1f')} |"
            )
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"
