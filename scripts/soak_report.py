"""The soak's settings, what it samples and tallies, and the summary with its verdict (no network,
no processes). `scripts/soak.py` drives the load and imports these."""

from __future__ import annotations

import json
import os
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Options:
    """Command-line options (see `parse_args`)."""

    streams: int
    duration: float
    warmup: float
    ramp: float
    engines: int
    time_scale: float
    engine_blocks: int | None
    min_tokens: int
    max_tokens: int
    tenants: int
    prefixes: int
    interval: float
    drain: float
    url: str | None
    router_pid: int | None
    router_args: list[str]
    out: Path
    max_rss_slope: float
    max_fd_growth: int
    seed: int
    load_start: list[float] = field(default_factory=lambda: list(os.getloadavg()))


@dataclass
class Sample:
    """One reading of the router process and of the load at `t` seconds since the load began."""

    t: float
    rss_mib: float
    fds: int
    cpu_s: float
    open_streams: int
    requests: int
    errors: int
    engines_cpu_s: float = 0.0


@dataclass
class Tally:
    """What the clients saw: finished requests, streamed tokens, errors by kind."""

    requests: int = 0
    ok: int = 0
    tokens: int = 0
    open_streams: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    durations: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)  # seconds from sending to the first token
    client_cpu_s: float = 0.0  # this process's CPU time during the load


# ----------------------------------------------------------------------------------------- analysis


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, in value units per minute; 0 for < 2 points.

    Example: (0, 100), (60, 101), (120, 102) → 1.0 per minute."""
    if len(points) < 2:
        return 0.0
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 60.0


def thirds(values: list[float]) -> tuple[float, float]:
    """Medians of the first and the last third of `values` (a drift measure robust to spikes)."""
    if not values:
        return (0.0, 0.0)
    k = max(1, len(values) // 3)
    return (statistics.median(values[:k]), statistics.median(values[-k:]))


def summarize(
    samples: list[Sample], idle: tuple[Sample | None, Sample | None], tally: Tally, options: Options
) -> dict[str, Any]:
    """The summary and verdict: no errors, RSS slope after warm-up within the limit, descriptor
    count after warm-up not drifting by more than the limit (medians of first and last third)."""
    steady = [s for s in samples if s.t >= options.warmup and s.t <= options.duration]
    sampled = bool(samples) and samples[0].rss_mib > 0
    rss = [s.rss_mib for s in steady]
    fds = [float(s.fds) for s in steady]
    rss_slope = slope_per_minute([(s.t, s.rss_mib) for s in steady])
    fd_first, fd_last = thirds(fds)
    request_rate = slope_per_minute([(s.t, float(s.requests)) for s in steady])  # requests per minute
    per_thousand = rss_slope * 1024 / request_rate * 1000 if request_rate > 0 else None
    checks = {"no errors": not tally.errors and tally.requests > 0}
    if sampled:
        checks["rss flat"] = rss_slope <= options.max_rss_slope
        checks["fds flat"] = fd_last - fd_first <= options.max_fd_growth
    before, after = idle
    cpu = samples[-1].cpu_s - samples[0].cpu_s if len(samples) > 1 else 0.0
    engines_cpu = samples[-1].engines_cpu_s - samples[0].engines_cpu_s if len(samples) > 1 else 0.0
    return {
        "verdict": "pass" if all(checks.values()) else "fail",
        "checks": checks,
        "requests": tally.requests,
        "ok": tally.ok,
        "tokens": tally.tokens,
        "errors": dict(tally.errors),
        "stream_seconds_p50": _quantile(tally.durations, 0.5),
        "stream_seconds_p99": _quantile(tally.durations, 0.99),
        "ttft_seconds_p50": _quantile(tally.ttfts, 0.5, digits=4),
        "ttft_seconds_p99": _quantile(tally.ttfts, 0.99, digits=4),
        "router": {
            "sampled": sampled,
            "rss_mib_idle_before": before.rss_mib if before else None,
            "rss_mib_after_warmup": rss[0] if rss else None,
            "rss_mib_peak": max(rss) if rss else None,
            "rss_mib_end": rss[-1] if rss else None,
            "rss_mib_idle_after": after.rss_mib if after else None,
            "rss_slope_mib_per_min": round(rss_slope, 3),
            "rss_kib_per_1000_requests": round(per_thousand, 1) if per_thousand is not None else None,
            "requests_per_min_after_warmup": round(request_rate, 1),
            "fds_idle_before": before.fds if before else None,
            "fds_after_warmup": int(fds[0]) if fds else None,
            "fds_peak": int(max(fds)) if fds else None,
            "fds_end": int(fds[-1]) if fds else None,
            "fds_idle_after": after.fds if after else None,
            "fds_drift_median_first_to_last_third": fd_last - fd_first,
            "cpu_seconds": round(cpu, 1),
            "cpu_seconds_per_1000_requests": round(cpu * 1000 / tally.requests, 2) if tally.requests else 0,
        },
        "engines_cpu_seconds": round(engines_cpu, 1),
        "client_cpu_seconds": round(tally.client_cpu_s, 1),
        "load_average": {"start": options.load_start, "end": list(os.getloadavg())},
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
    }


def _quantile(values: list[float], q: float, *, digits: int = 2) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], digits)


def _pair(first: Any, second: Any, third: Any = "") -> str:
    """`a / b`, `a / b / c`, or `a → b` when `third` is the arrow."""
    if third == "→":
        return f"{first} → {second}"
    return " / ".join(str(v) for v in (first, second, third) if v != "")


def markdown(summary: dict[str, Any]) -> str:
    """summary.md: the verdict and the numbers as a table."""
    r = summary["router"]
    o = summary["options"]
    la, p = summary["load_average"], _pair
    per_request = p(r["rss_kib_per_1000_requests"], r["requests_per_min_after_warmup"])
    cpu_client = summary["client_cpu_seconds"]
    rows = [
        ("verdict", summary["verdict"].upper()),
        ("checks", ", ".join(f"{k}: {'ok' if v else 'FAILED'}" for k, v in summary["checks"].items())),
        ("streams × duration", f"{o['streams']} × {o['duration']:.0f} s (warm-up {o['warmup']:.0f} s)"),
        ("requests (ok)", f"{summary['requests']} ({summary['ok']})"),
        ("tokens streamed", summary["tokens"]),
        ("errors", json.dumps(summary["errors"]) if summary["errors"] else "none"),
        ("stream duration p50 / p99 (s)", p(summary["stream_seconds_p50"], summary["stream_seconds_p99"])),
        ("time to first token p50 / p99 (s)", p(summary["ttft_seconds_p50"], summary["ttft_seconds_p99"])),
        ("RSS idle → after warm-up (MiB)", p(r["rss_mib_idle_before"], r["rss_mib_after_warmup"], "→")),
        ("RSS peak / end / idle (MiB)", p(r["rss_mib_peak"], r["rss_mib_end"], r["rss_mib_idle_after"])),
        ("router RSS slope after warm-up (MiB/min)", r["rss_slope_mib_per_min"]),
        ("… per 1,000 requests (KiB) / requests per min", per_request),
        ("router fds idle before → after warm-up", p(r["fds_idle_before"], r["fds_after_warmup"], "→")),
        ("router fds peak / end / idle after", p(r["fds_peak"], r["fds_end"], r["fds_idle_after"])),
        ("router fd drift (median first → last third)", r["fds_drift_median_first_to_last_third"]),
        ("router / engines / client CPU s", p(r["cpu_seconds"], summary["engines_cpu_seconds"], cpu_client)),
        ("router CPU s per 1,000 requests", r["cpu_seconds_per_1000_requests"]),
        ("host load average (1, 5, 15 min) start → end", p(la["start"], la["end"], "→")),
    ]  # fmt: skip
    lines = ["# Soak summary", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- the process
