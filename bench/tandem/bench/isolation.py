"""Tenant isolation: is a light tenant protected from a heavy tenant's flood? (pure)

`tandem bench --isolation` runs, for every target and repeat, the light tenant's requests **alone**
(the same requests, no heavy ones) on freshly started engines, then the whole workload (the
**flood**) on fresh engines again, through the same target. From each pair it reports (engine
seconds; TTFT over the light tenant's ok requests, as `tandem.bench.stats` defines it):

- **isolation ratio** = light TTFT p90 under the flood ÷ light TTFT p90 alone (and the same at
  p50). A gateway that isolates tenants keeps it near 1; one that serves in arrival order lets the
  light tenant wait behind the heavy backlog. Example: p90 60 ms alone, 90 ms under the flood → 1.5.
- **heavy throughput** over the window [0, W], W the heavy tenant's closed-loop end (else the
  workload's `duration`): heavy ok requests that ended within it ÷ W, and heavy output tokens that
  arrived within it ÷ W (each content chunk carries completion tokens / chunks, as in
  `tandem.bench.fairness`). Example: W = 10 s and 25 requests ended by 10 s → 2.5 req/s; a request of
  64 tokens streamed in 32 chunks, 20 of them by 10 s, counts 40 tokens.
- **429s** and **other errors** per tenant in the flood run: requests answered HTTP 429 (a rate
  limit or admission refused them), and requests sent that failed otherwise (another status, an
  error event, a timeout, cancelled at the run's deadline); heavy requests the closed loop never
  sent (it had ended) are neither, and are counted apart. And the light tenant's ok count, under the
  flood and alone.
- the flood run's **service gap while both were backlogged** (max − min of the tenants' VTC service
  within the interval both were waiting, `tandem.bench.fairness`) and each tenant's **share** of the
  service within it. Example: 9,000 and 3,000 units → gap 6,000, shares 0.75 and 0.25.

Over `--repeat` runs every number is summarised per target as its median, with the minimum and
maximum as the spread (`tandem.bench.aggregate.median_cell`: `1.4 (1.2–1.6)`); the ratio's median
is the median of the per-repeat ratios, each from a repeat's own pair of runs. Example: ratios 1.2,
1.4 and 3.0 → 1.4 (1.2–3.0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from tandem.bench.aggregate import median_cell, spread
from tandem.bench.stats import Timed, percentile
from tandem.bench.workloads import Workload, WorkloadError

ALONE, FLOOD = "alone", "flood"
TOO_MANY_REQUESTS = 429

Row = dict[str, Any]


@dataclass(frozen=True)
class IsolationSpec:
    """Who floods whom: the `heavy` and `light` tenants' names and the heavy load's window `window_s`
    (engine seconds from the run's start)."""

    heavy: str
    light: str
    window_s: float


def isolation_spec(workload: Workload, *, cut_s: float | None = None) -> IsolationSpec:
    """The spec of a workload that names a heavy and a light tenant (`flood`, `two-tenant`); the
    window is the heavy tenant's closed-loop end, else its `duration` parameter, at most `cut_s`
    (`--duration`). Raises WorkloadError for a workload without both tenants."""
    heavy, light = workload.params.get("heavy_tenant"), workload.params.get("light_tenant")
    if not isinstance(heavy, str) or not isinstance(light, str):
        raise WorkloadError(
            f"--isolation needs a workload with a heavy_tenant and a light_tenant (flood, two-tenant); "
            f"{workload.name} has none"
        )
    window = workload.closed_loop.get(heavy, workload.params.get("duration"))
    if not isinstance(window, int | float):
        raise WorkloadError(f"--isolation: workload {workload.name} has no duration")
    return IsolationSpec(heavy, light, float(window if cut_s is None else min(window, cut_s)))


def alone_workload(workload: Workload, spec: IsolationSpec) -> Workload:
    """The light tenant's requests only, unchanged (same offsets, prompts and client bounds)."""
    return replace(
        workload,
        requests=tuple(r for r in workload.requests if r.tenant == spec.light),
        closed_loop={t: u for t, u in workload.closed_loop.items() if t == spec.light},
    )


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator ÷ denominator; None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def status_count(requests: Sequence[Timed], *, tenant: str, status: int = TOO_MANY_REQUESTS) -> int:
    """Requests of `tenant` answered with HTTP `status`."""
    return sum(r.tenant == tenant and r.status == status for r in requests)


def other_errors(requests: Sequence[Timed], *, tenant: str) -> int:
    """Requests of `tenant` that were sent and failed with anything but HTTP 429."""
    return sum(
        r.tenant == tenant and r.start is not None and not r.ok and r.status != TOO_MANY_REQUESTS
        for r in requests
    )


def window_throughput(
    requests: Sequence[Timed], *, tenant: str, window_s: float
) -> tuple[float | None, float | None]:
    """`tenant`'s (ok requests ended within [0, window_s], output tokens that arrived within it),
    each ÷ window_s (module doc); (None, None) for an empty window."""
    if window_s <= 0:
        return None, None
    mine = [r for r in requests if r.tenant == tenant]
    ended = sum(r.ok and r.end is not None and r.end <= window_s for r in mine)
    tokens = sum(
        r.tokens_out / len(r.token_times) * sum(t <= window_s for t in r.token_times)
        for r in mine
        if r.token_times
    )
    return ended / window_s, tokens / window_s


def light_ttft(requests: Sequence[Timed], spec: IsolationSpec) -> tuple[float | None, float | None]:
    """(p50, p90) TTFT of the light tenant's ok requests (engine seconds)."""
    ttfts = [v for r in requests if r.tenant == spec.light and r.ok and (v := r.ttft) is not None]
    return percentile(ttfts, 50), percentile(ttfts, 90)


def isolation_row(
    *,
    label: str,
    repeat: int,
    flood: Sequence[Timed],
    alone: Sequence[Timed],
    spec: IsolationSpec,
    fairness: Mapping[str, Any],
    unsent: int = 0,
) -> Row:
    """One repeat of one target: the module doc's numbers from its flood and alone runs.

    `fairness` is the flood run's `tandem.bench.fairness.tenant_report` (its service gap, the
    both-backlogged time and each tenant's share within it are copied); `unsent` the heavy requests
    the closed loop never sent. An empty `alone` (a run that failed) leaves the ratios None.
    """
    alone_p50, alone_p90 = light_ttft(alone, spec)
    flood_p50, flood_p90 = light_ttft(flood, spec)
    heavy_rps, heavy_tps = window_throughput(flood, tenant=spec.heavy, window_s=spec.window_s)
    tenants = fairness.get("tenants") or {}
    return {
        "label": label,
        "repeat": repeat,
        "light_ttft_alone_p50_s": alone_p50,
        "light_ttft_flood_p50_s": flood_p50,
        "light_ttft_alone_p90_s": alone_p90,
        "light_ttft_flood_p90_s": flood_p90,
        "isolation_ratio_p90": ratio(flood_p90, alone_p90),
        "isolation_ratio_p50": ratio(flood_p50, alone_p50),
        "heavy_requests_per_s": heavy_rps,
        "heavy_output_tokens_per_s": heavy_tps,
        "heavy_sent": sum(r.tenant == spec.heavy and r.start is not None for r in flood),
        "heavy_unsent": unsent,
        "light_requests": sum(r.tenant == spec.light for r in flood),
        "light_ok": sum(r.tenant == spec.light and r.ok for r in flood),
        "light_alone_ok": sum(r.tenant == spec.light and r.ok for r in alone),
        "light_429": status_count(flood, tenant=spec.light),
        "light_errors": other_errors(flood, tenant=spec.light),
        "heavy_429": status_count(flood, tenant=spec.heavy),
        "heavy_errors": other_errors(flood, tenant=spec.heavy),
        "service_gap_backlogged": fairness.get("service_gap_backlogged"),
        "backlogged_s": fairness.get("backlogged_s"),
        "light_share_backlogged": (tenants.get(spec.light) or {}).get("share_backlogged"),
        "heavy_share_backlogged": (tenants.get(spec.heavy) or {}).get("share_backlogged"),
    }


@dataclass(frozen=True)
class Line:
    """A table row: the row's key, its label (`{light}`/`{heavy}` become the tenants' names), the
    factor for display and the format."""

    key: str
    label: str
    scale: float = 1.0
    fmt: str = ".0f"


LINES: tuple[Line, ...] = (
    Line("light_ttft_alone_p50_s", "{light} TTFT p50 alone (ms)", 1000),
    Line("light_ttft_flood_p50_s", "{light} TTFT p50 under flood (ms)", 1000),
    Line("light_ttft_alone_p90_s", "{light} TTFT p90 alone (ms)", 1000),
    Line("light_ttft_flood_p90_s", "{light} TTFT p90 under flood (ms)", 1000),
    Line("isolation_ratio_p90", "isolation ratio: {light} TTFT p90, flood ÷ alone", 1, ".2f"),
    Line("isolation_ratio_p50", "{light} TTFT p50, flood ÷ alone", 1, ".2f"),
    Line("heavy_requests_per_s", "{heavy} completed req/s", 1, ".2f"),
    Line("heavy_output_tokens_per_s", "{heavy} output tokens/s", 1, ".0f"),
    Line("light_ok", "{light} ok under flood"),
    Line("light_requests", "{light} requests"),
    Line("light_alone_ok", "{light} ok alone"),
    Line("light_429", "{light} 429s"),
    Line("light_errors", "{light} other errors"),
    Line("heavy_429", "{heavy} 429s"),
    Line("heavy_errors", "{heavy} other errors"),
    Line("heavy_unsent", "{heavy} not sent (loop ended)"),
    Line("service_gap_backlogged", "service gap while both backlogged (VTC units)"),
    Line("backlogged_s", "both backlogged (s)", 1, ".1f"),
    Line("light_share_backlogged", "{light} share while both backlogged", 1, ".2f"),
    Line("heavy_share_backlogged", "{heavy} share while both backlogged", 1, ".2f"),
)


def aggregate_rows(rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
    """label → row key → `spread` over that label's repeats (None values left out of n).

    Example: ratios 1.2, 1.4 and 3.0 over three repeats → median 1.4, min 1.2, max 3.0.
    """
    by_label: dict[str, list[Row]] = {}
    for row in rows:
        by_label.setdefault(str(row["label"]), []).append(row)
    return {
        label: {
            line.key: spread([float(v) for row in mine if (v := row.get(line.key)) is not None])
            for line in LINES
        }
        for label, mine in by_label.items()
    }


def isolation_table(agg: Mapping[str, Mapping[str, Any]], spec: IsolationSpec) -> str:
    """One row per `LINES` entry, one column per target: `median (min–max)` (scaled) or `–`."""
    labels = list(agg)
    lines = [
        "| metric (median (min–max) over repeats) | " + " | ".join(labels) + " |",
        "| --- | " + " | ".join("---:" for _ in labels) + " |",
    ]
    for line in LINES:
        cells = [median_cell(_scaled(agg[label][line.key], line.scale), line.fmt) for label in labels]
        lines.append(
            f"| {line.label.format(light=spec.light, heavy=spec.heavy)} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def _scaled(item: Mapping[str, Any], scale: float) -> dict[str, Any]:
    return {k: v * scale if k != "n" and v is not None else v for k, v in item.items()}


def isolation_document(spec: IsolationSpec, rows: Sequence[Row]) -> dict[str, Any]:
    """bench.json's `isolation`: the spec, one row per target and repeat, and their aggregate."""
    return {"spec": asdict(spec), "runs": list(rows), "aggregate": aggregate_rows(rows)}


def isolation_markdown(isolation: Mapping[str, Any]) -> list[str]:
    """bench.md's isolation section (heading, what was run, the table) from bench.json's `isolation`."""
    spec = IsolationSpec(**isolation["spec"])
    repeats = max((int(row["repeat"]) + 1 for row in isolation["runs"]), default=1)
    spread = f" Medians over {repeats} repeats, (min–max) beside them." if repeats > 1 else ""
    return [
        f"## Isolation under a flood: {spec.light} alone, then under {spec.heavy}'s flood", "",
        f"Per target and run: {spec.light}'s requests alone on fresh engines, then the whole workload on "
        f"fresh engines again. Isolation ratio = {spec.light} TTFT p90 under the flood ÷ alone (near 1: "
        f"isolated); {spec.heavy}'s completed requests over [0, {spec.window_s:g} s] ÷ {spec.window_s:g} s; "
        f"the service gap and shares are the flood run's, while both tenants were backlogged.{spread} "
        "The tables after it are the flood runs.", "",
        isolation_table(isolation["aggregate"], spec),
    ]  # fmt: skip
