"""PNG plots of benchmark results (matplotlib, Agg backend: no display needed).

matplotlib is in the `bench` extra; without it `available()` is False and `tandem bench` writes no
plots (and says so). Every function takes plain data (engine seconds) and a path, and writes one PNG:

- `ttft_cdf`: the empirical CDF of TTFT per target (x in ms, log scale when it spans > 20×);
- `request_timeline`: per target, each request's TTFT against its arrival time, and requests in
  flight over time (a step line), so bursts, ramps and queueing show;
- `overhead`: added TTFT (p50 and p99) over direct per router, against concurrency (log x, symlog y);
- `autoscaler_timeline`: ready (solid) and desired (dashed) replicas per pool, the run's rolling
  TTFT p90 against the SLO, and KV utilisation, on one time axis;
- `service_over_time`: each tenant's cumulative service (VTC units) against time, one panel per
  target, so a tenant starved for a while shows as a flat stretch;
- `isolation_bars`: per target, the light tenant's TTFT p90 alone and under the flood (bars, the
  range over repeats as error bars), with the isolation ratio written above;
- `adapter_loads`: per target, adapter loads since the run's start (summed over the engines) against
  time, and the busiest engine's requests (waiting + running) against time, the burst shaded.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Series = Mapping[str, Sequence[float]]


def available() -> bool:
    """Whether matplotlib is installed."""
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _legend(ax: Any) -> None:
    """A legend only when something is labelled (matplotlib warns otherwise)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def ttft_cdf(ttfts_s: Series, path: Path, *, title: str) -> None:
    """One CDF line per target from its TTFTs (seconds)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lowest, highest = float("inf"), 0.0
    for label, values in ttfts_s.items():
        ms = sorted(v * 1000 for v in values)
        if not ms:
            continue
        lowest, highest = min(lowest, ms[0]), max(highest, ms[-1])
        ax.step(ms, [(i + 1) / len(ms) for i in range(len(ms))], where="post", label=label)
    if highest > 0 and lowest > 0 and highest / lowest > 20:
        ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def in_flight(starts: Sequence[float], ends: Sequence[float]) -> tuple[list[float], list[int]]:
    """A step function of requests in flight: times and counts after each start (+1) and end (−1).

    Example: starts [0, 1], ends [2, 3] → times [0, 1, 2, 3], counts [1, 2, 1, 0].
    """
    events = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends])
    times, counts, now = [], [], 0
    for t, step in events:
        now += step
        times.append(t)
        counts.append(now)
    return times, counts


def request_timeline(runs: Mapping[str, Mapping[str, Sequence[float]]], path: Path, *, title: str) -> None:
    """Per target: `arrival` and `ttft` (paired, seconds) as dots; `start`/`end` as in-flight steps."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for label, data in runs.items():
        top.plot(data["arrival"], [v * 1000 for v in data["ttft"]], ".", markersize=3, label=label)
        times, counts = in_flight(data["start"], data["end"])
        bottom.step(times, counts, where="post", label=label)
    top.set_ylabel("TTFT (ms)")
    top.set_yscale("log")
    top.set_title(title)
    _legend(top)
    bottom.set_ylabel("requests in flight")
    bottom.set_xlabel("time since start (s)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def overhead(rows: Sequence[Mapping[str, Any]], path: Path, *, title: str) -> None:
    """Rows `{label, concurrency, added_ttft_p50_ms, added_ttft_p99_ms}` → two lines per router."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = list(dict.fromkeys(str(r["label"]) for r in rows))
    for label in labels:
        mine = sorted((r for r in rows if r["label"] == label), key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in mine]
        for key, style in (("added_ttft_p50_ms", "-o"), ("added_ttft_p99_ms", "--x")):
            ys = [r[key] for r in mine]
            ax.plot(xs, ys, style, label=f"{label} {key.split('_')[2]}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=10)  # linear within ±10 ms, logarithmic beyond
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("added TTFT over direct (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def autoscaler_timeline(timeline: Mapping[str, Any], path: Path, *, title: str) -> None:
    """Replicas per pool, rolling TTFT p90 and KV utilisation over time (`tandem.bench.timeline`);
    with a gateway's capacity gauges recorded, a fourth panel: each engine's capacity C."""
    plt = _pyplot()
    with_capacity = any(s["name"] == "tandem_router_engine_capacity" for s in timeline["series"])
    rows = 4 if with_capacity else 3
    fig, axes = plt.subplots(rows, 1, figsize=(8, 2.5 * rows), sharex=True)
    reps, ttft, kv = axes[0], axes[1], axes[2]
    for series in timeline["series"]:
        name, labels = series["name"], series["labels"]
        xs = [p[0] for p in series["points"]]
        ys = [p[1] for p in series["points"]]
        tag = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        if name == "tandem_router_engine_capacity":
            axes[3].step(xs, ys, where="post", label=labels.get("endpoint", tag))
        elif name.startswith("tandem_router_engine"):
            continue
        elif name.endswith("ready_replicas"):
            reps.step(xs, ys, where="post", label=f"ready {tag}")
        elif name.endswith("desired_replicas"):
            reps.step(xs, ys, where="post", linestyle="--", label=f"desired {tag}")
        elif "kv_utilization" in name:
            kv.plot(xs, ys, label=tag)
        elif "ttft" in name:
            ttft.plot(xs, [y * 1000 for y in ys], linestyle=":", label=f"autoscaler {tag}")
    rolling = timeline.get("rolling_ttft", {})
    p90 = [float("nan") if v is None else v * 1000 for v in rolling.get("p90_s", [])]
    ttft.plot(rolling.get("t", []), p90, label="client TTFT p90 (rolling)")
    slo = timeline.get("slo", {}).get("ttft_s")
    if slo:
        ttft.axhline(slo * 1000, color="red", linewidth=0.8, label="TTFT SLO")
    reps.set_ylabel("replicas")
    ttft.set_ylabel("TTFT (ms)")
    kv.set_ylabel("KV utilisation")
    if with_capacity:
        axes[3].set_ylabel("engine capacity C")
        axes[3].set_yscale("log", base=2)
    axes[-1].set_xlabel("time since start (s)")
    reps.set_title(title)
    for ax in axes:
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: Points per tenant curve in `service_over_time`; longer curves are thinned (every k-th point).
CURVE_POINTS = 4000


def service_over_time(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    path: Path,
    *,
    title: str,
    window_s: float | None = None,
) -> None:
    """One panel per target (stacked, shared axes): per tenant, `(times, cumulative service)` as a
    step line; `window_s` (the heavy load's end) as a vertical line when given."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels) + 0.6), sharex=True, sharey=True,
                             squeeze=False)  # fmt: skip
    for ax, (label, curves) in zip(axes[:, 0], panels.items(), strict=True):
        for tenant, (times, totals) in curves.items():
            step = max(1, len(times) // CURVE_POINTS)
            xs, ys = list(times[::step]), list(totals[::step])
            if times and xs[-1] != times[-1]:
                xs.append(times[-1])
                ys.append(totals[-1])
            ax.step(xs, ys, where="post", label=tenant)
        if window_s is not None:
            ax.axvline(window_s, color="grey", linewidth=0.8, linestyle="--")
        ax.set_title(label, fontsize=9)
        ax.set_ylabel("service (VTC units)")
        ax.grid(alpha=0.3)
        _legend(ax)
    axes[0, 0].figure.suptitle(title, fontsize=10)
    axes[-1, 0].set_xlabel("time since start (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def isolation_bars(bars: Mapping[str, Mapping[str, Any]], path: Path, *, title: str, light: str) -> None:
    """Two bars per target: `alone` and `flood`, each a `spread` in seconds (median bar, min–max
    whiskers; a missing median draws no bar), and `ratio` (a `spread` too) as text above them."""
    plt = _pyplot()
    labels = list(bars)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(labels) + 2), 4.2))
    width = 0.38
    for offset, (key, name) in ((-width / 2, ("alone", "alone")), (width / 2, ("flood", "under flood"))):
        xs, heights, low, high = [], [], [], []
        for i, label in enumerate(labels):
            item = bars[label][key]
            if item.get("median") is None:
                continue
            ms = item["median"] * 1000
            xs.append(i + offset)
            heights.append(ms)
            low.append(ms - item["min"] * 1000)
            high.append(item["max"] * 1000 - ms)
        ax.bar(xs, heights, width, yerr=[low, high], capsize=3, label=f"{light} TTFT p90 {name}")
    for i, label in enumerate(labels):
        item, ratio = bars[label]["flood"], bars[label]["ratio"]
        if ratio.get("median") is not None and item.get("max") is not None:
            ax.annotate(f"× {ratio['median']:.1f}", (i + width / 2, item["max"] * 1000), ha="center",
                        va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")  # fmt: skip
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("TTFT p90 (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    _legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def adapter_loads(
    series: Mapping[str, Mapping[str, Sequence[float]]],
    path: Path,
    *,
    title: str,
    window: tuple[float, float] | None,
) -> None:
    """`series`: label → `{"t", "loads", "busiest"}` (engine seconds, loads since the start, the
    busiest engine's requests), as `tandem.bench.adapterbench.load_series` builds them."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for label, s in series.items():
        top.plot(s["t"], s["loads"], label=label)
        bottom.plot(s["t"], s["busiest"], label=label)
    for ax in (top, bottom):
        if window is not None:
            ax.axvspan(*window, color="orange", alpha=0.15, label="hot-adapter burst" if ax is top else None)
        ax.grid(alpha=0.3)
    top.set_ylabel("adapter loads (all engines)")
    bottom.set_ylabel("requests on the busiest engine")
    bottom.set_xlabel("time since start (s)")
    top.set_title(title)
    _legend(top)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
