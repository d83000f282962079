"""Run-to-run spread: several runs of one target (`--repeat N`) summarised as mean ± standard deviation
(pure).

Each key metric (`METRICS`) is read from every run's summary; its mean, sample standard deviation
(n − 1 in the denominator; 0 for one run), minimum and maximum go to `bench.json`'s `aggregate`, and
the markdown table shows `mean ± sd`. Example: TTFT p50 of three runs 30, 34 and 38 ms → `34 ± 4`.
A run where a metric is undefined (no successful request) is left out of that metric's n. The
median is kept too, for tables that show `median (min–max)` (`median_cell`: `34 (30–38)`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Metric:
    """A number read from a run summary, its table label, and the factor and format for display."""

    key: str
    label: str
    read: Callable[[Mapping[str, Any]], float | None]
    scale: float = 1.0
    fmt: str = ".0f"


def _path(*keys: str) -> Callable[[Mapping[str, Any]], float | None]:
    def read(summary: Mapping[str, Any]) -> float | None:
        value: Any = summary
        for key in keys:
            if not isinstance(value, Mapping) or value.get(key) is None:
                return None
            value = value[key]
        return float(value) if isinstance(value, int | float) else None

    return read


METRICS: tuple[Metric, ...] = (
    Metric("ok", "requests ok", _path("requests", "ok")),
    Metric("ttft_p50", "TTFT p50 (ms)", _path("latency", "ttft_s", "p50"), 1000),
    Metric("ttft_p90", "TTFT p90 (ms)", _path("latency", "ttft_s", "p90"), 1000),
    Metric("ttft_p99", "TTFT p99 (ms)", _path("latency", "ttft_s", "p99"), 1000),
    Metric("tpot_p50", "TPOT p50 (ms)", _path("latency", "tpot_s", "p50"), 1000, ".1f"),
    Metric("tpot_p99", "TPOT p99 (ms)", _path("latency", "tpot_s", "p99"), 1000, ".1f"),
    Metric("e2e_p50", "E2E p50 (s)", _path("latency", "e2e_s", "p50"), 1, ".2f"),
    Metric("e2e_p99", "E2E p99 (s)", _path("latency", "e2e_s", "p99"), 1, ".2f"),
    Metric("rps", "throughput (req/s)", _path("throughput", "requests_per_s"), 1, ".2f"),
    Metric("out_tps", "output tokens/s", _path("throughput", "output_tokens_per_s")),
    Metric("attainment", "SLO attainment (%)", _path("slo", "attainment"), 100, ".1f"),
    Metric("goodput", "goodput (req/s)", _path("slo", "goodput_rps"), 1, ".2f"),
    Metric("hit_rate", "prefix cache hit rate (%)", _path("engines", "overall", "prefix_hit_rate"), 100,
           ".1f"),
    Metric("kv_pool_hit_rate", "KV pool hit rate (%)", _path("engines", "overall", "external_hit_rate"), 100,
           ".1f"),
    Metric("engine_ttft", "engine TTFT mean (ms)", _path("engines", "overall", "engine_ttft_mean_s"), 1000),
    Metric("imbalance", "load imbalance (max/mean)", _path("load", "imbalance"), 1, ".2f"),
    Metric("pair_gap", "max service gap, any two backlogged", _path("fairness", "max_pair_gap")),
    Metric("gateway_cpu_per_1000", "gateway CPU s per 1,000 requests", _path("gateway", "cpu_s_per_1000"), 1,
           ".2f"),
)  # fmt: skip


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """`{n, mean, sd, median, min, max}`; sd is the sample standard deviation (0 for a single value),
    the median of an even count the mean of the middle two."""
    if not values:
        return {"n": 0, "mean": None, "sd": None, "median": None, "min": None, "max": None}
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {
        "n": len(values), "mean": mean, "sd": sd, "median": statistics.median(values), "min": min(values),
        "max": max(values),
    }  # fmt: skip


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """label → metric key → spread of the metric over that label's runs (in run order)."""
    by_label: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        by_label.setdefault(str(run["label"]), []).append(run)
    return {
        label: {
            m.key: spread([v * m.scale for s in summaries if (v := m.read(s)) is not None]) for m in METRICS
        }
        for label, summaries in by_label.items()
    }


def spread_cell(item: Mapping[str, Any], fmt: str) -> str:
    """`mean ± sd` of a `spread` (just the mean for one value; `–` for none). Example: `34 ± 4`."""
    if item["mean"] is None:
        return "–"
    text = format(item["mean"], fmt)
    return text if item["n"] < 2 else f"{text} ± {format(item['sd'], fmt)}"


def median_cell(item: Mapping[str, Any], fmt: str) -> str:
    """`median (min–max)` of a `spread` (just the value for one; `–` for none). Example: `34 (30–38)`."""
    if item["median"] is None:
        return "–"
    text = format(item["median"], fmt)
    return text if item["n"] < 2 else f"{text} ({format(item['min'], fmt)}–{format(item['max'], fmt)})"


def spread_table(agg: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per metric (rows undefined in every column are dropped), one column per target."""
    labels = list(agg)
    lines = [
        "| metric (mean ± sd) | " + " | ".join(labels) + " |",
        "| --- | " + " | ".join("---:" for _ in labels) + " |",
    ]
    for m in METRICS:
        cells = [spread_cell(agg[label][m.key], m.fmt) for label in labels]
        if any(c != "–" for c in cells):
            lines.append(f"| {m.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
