"""The multi-adapter benchmark's figures (pure): engine samples, one run's row, the summary over
repeats, the verdict against issue 39's targets, and the report's Markdown.

The run itself (`tandem.bench.adapterrun`) samples every engine's `/metrics` each second during the
run; `parse_engine_sample` keeps what this benchmark reads:
- `tandem_sim_lora_loads_total{source}` summed over `disk` (read from disk into the CPU tier) and
  `cpu` (copied from the CPU tier into a GPU slot): an **adapter load** is either; both are also
  reported apart;
- `vllm:num_requests_waiting` and `vllm:num_requests_running` (the engine's queue and batch);
- `vllm:request_success_total` (finished requests: where the router sent them), without
  `finished_reason="abort"`: a request the gateway took back from an engine's queue (its recall)
  is aborted there and finishes on another engine, and counts once, where it finished.

Definitions (times in engine seconds: wall × the engines' time scale):
- TTFT p90/p99 over the requests that succeeded; errors are requests that did not;
- **burst TTFT p99**: over the hot adapter's requests that arrived in the burst window (the burst's
  own requests, the target); **burst window TTFT p99**: over every request that arrived in it, the
  other adapters' too (how the rest of the traffic fared meanwhile; reported, not a target);
- **loads per 1,000 requests** = (loads after − loads before, summed over the engines) × 1000 ÷
  requests sent;
- **throughput** = output tokens of the successful requests ÷ (last end − first start);
- **burst imbalance** = over the samples inside the burst window, each engine's peak
  `num_requests_waiting`; imbalance = the largest peak ÷ the mean of the peaks of its pool (1 = even;
  None when no engine queued anything, which meets "no engine above 2× the mean"); with prefill and
  decode pools, the larger of the two pools' figures. The same for requests on the engine (waiting +
  running), reported beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.bench.aggregate import spread, spread_cell
from tandem.bench.counters import families
from tandem.bench.records import DriveResult
from tandem.bench.stats import percentile

LOADS = "tandem_sim_lora_loads"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
FINISHED = "vllm:request_success_total"

#: issue 39 item 7's targets: ratios to the best peer, and the burst's queue bound.
TARGETS = {"ttft_p90": 0.5, "loads_per_1000": 0.3, "throughput": 1.0, "burst_ttft_p99": 0.7, "queue": 2.0}


@dataclass(frozen=True)
class EngineSample:
    """One engine's figures at wall second `t` of the run."""

    t: float
    engine: str
    disk_loads: float = 0.0
    cpu_loads: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    finished: float = 0.0

    @property
    def loads(self) -> float:
        return self.disk_loads + self.cpu_loads


#: The families `parse_engine_sample` reads; only their lines are parsed.
SAMPLED = (LOADS, WAITING, RUNNING, FINISHED.removesuffix("_total"))


def parse_engine_sample(text: str, *, t: float, engine: str) -> EngineSample:
    """The loads, waiting and running of one engine's `/metrics` text (summed over label sets).

    Only the lines of the families it reads are parsed (`counters.families`): the sampler runs every
    second on the event loop that drives the load."""
    values = {"disk": 0.0, "cpu": 0.0, WAITING: 0.0, RUNNING: 0.0, FINISHED: 0.0}
    for family in families(text, SAMPLED):
        for sample in family.samples:
            if sample.name == f"{LOADS}_total":
                source = sample.labels.get("source", "")
                if source in ("disk", "cpu"):
                    values[source] += sample.value
            elif sample.name == FINISHED and sample.labels.get("finished_reason") == "abort":
                continue
            elif sample.name in (WAITING, RUNNING, FINISHED):
                values[sample.name] += sample.value
    return EngineSample(
        t, engine, values["disk"], values["cpu"], values[WAITING], values[RUNNING], values[FINISHED]
    )


def _ttfts_ms(result: DriveResult, time_scale: float) -> list[float]:
    return [
        (r.first_token_s - r.start_s) * 1000 * time_scale
        for r in result.records
        if r.ok and r.first_token_s is not None and r.start_s is not None
    ]


def throughput(result: DriveResult, time_scale: float) -> float | None:
    """Output tokens per engine second of the successful requests (module docstring)."""
    ok = [r for r in result.records if r.ok and r.start_s is not None and r.end_s is not None]
    if not ok:
        return None
    span = (max(r.end_s or 0.0 for r in ok) - min(r.start_s or 0.0 for r in ok)) * time_scale
    tokens = sum(r.completion_tokens or r.max_tokens for r in ok)
    return tokens / span if span > 0 else None


def imbalance(peaks: Mapping[str, float], pools: Mapping[str, str] | None = None) -> float | None:
    """Largest peak ÷ mean peak within each pool (`pools`: engine → its pool; none: one pool), the
    worst pool's; None when every peak is 0. Examples: {a: 6, b: 2, c: 2, d: 2} → 2.0; {p0: 0, p1: 0,
    d0: 3, d1: 1} with p* prefill and d* decode → 1.5 (as one pool: 3.0)."""
    groups: dict[str, dict[str, float]] = {}
    for engine, peak in peaks.items():
        groups.setdefault((pools or {}).get(engine, ""), {})[engine] = peak
    figures = [
        max(group.values()) / (sum(group.values()) / len(group))
        for group in groups.values()
        if max(group.values()) > 0
    ]
    return max(figures) if figures else None


def burst_peaks(
    samples: Sequence[EngineSample], window: tuple[float, float] | None, *, time_scale: float, running: bool
) -> dict[str, float]:
    """Each engine's peak waiting (with `running`: waiting + running) over the samples whose engine
    time lies in the burst `window` (engine seconds); {} without a window."""
    if window is None:
        return {}
    start, end = window
    peaks: dict[str, float] = {}
    for s in samples:
        value = s.waiting + (s.running if running else 0.0)
        peaks.setdefault(s.engine, 0.0)
        if start <= s.t * time_scale < end:
            peaks[s.engine] = max(peaks[s.engine], value)
    return peaks


def loads_by_engine(
    before: Mapping[str, EngineSample], after: Mapping[str, EngineSample]
) -> dict[str, float]:
    """Loads during the run per engine (after − before)."""
    return {e: after[e].loads - before[e].loads for e in after if e in before}


def run_row(
    label: str,
    repeat: int,
    *,
    result: DriveResult,
    samples: Sequence[EngineSample],
    before: Mapping[str, EngineSample],
    after: Mapping[str, EngineSample],
    window: tuple[float, float] | None,
    time_scale: float,
    adapters: Mapping[str, Sequence[str]] | None = None,
    hot: str | None = None,
    pools: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One target's figures in one repeat (module docstring); `adapters`: each engine's loaded adapters
    after the run (its `/v1/models`), for the placement figures; `hot`: the burst's adapter (its
    requests' `group`); None: every request in the window counts as the burst's; `pools`: each
    engine's pool, for the imbalance (none: one pool)."""
    sent = sum(r.start_s is not None for r in result.records)
    per_engine = loads_by_engine(before, after)
    disk = sum(after[e].disk_loads - before[e].disk_loads for e in per_engine)
    loads = sum(per_engine.values())
    during = [
        r for r in result.records if window is not None and window[0] <= r.arrival_s * time_scale < window[1]
    ]
    burst = [r for r in during if hot is None or r.group == hot]
    ttfts = _ttfts_ms(result, time_scale)
    burst_ttfts = _ttfts_ms(DriveResult(tuple(burst), result.wall_s), time_scale)
    during_ttfts = _ttfts_ms(DriveResult(tuple(during), result.wall_s), time_scale)
    waiting = burst_peaks(samples, window, time_scale=time_scale, running=False)
    on_engine = burst_peaks(samples, window, time_scale=time_scale, running=True)
    return {
        "label": label,
        "repeat": repeat,
        "requests": len(result.records),
        "errors": sum(not r.ok for r in result.records),
        "ttft_p90_ms": percentile(ttfts, 90),
        "ttft_p99_ms": percentile(ttfts, 99),
        "burst_ttft_p99_ms": percentile(burst_ttfts, 99),
        "burst_requests": len(burst),
        "window_ttft_p99_ms": percentile(during_ttfts, 99),
        "loads": loads,
        "disk_loads": disk,
        "loads_per_1000": loads * 1000 / sent if sent else None,
        "disk_loads_per_1000": disk * 1000 / sent if sent else None,
        "throughput_tok_s": throughput(result, time_scale),
        "loads_by_engine": per_engine,
        "burst_waiting_peaks": waiting,
        "burst_queue_imbalance": imbalance(waiting, pools),
        "burst_on_engine_peaks": on_engine,
        "burst_on_engine_imbalance": imbalance(on_engine, pools),
        "requests_by_engine": {e: after[e].finished - before[e].finished for e in per_engine},
        **placement(adapters or {}),
    }


def placement(adapters: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Where the adapters ended up: per engine how many it loaded, how many distinct adapters were
    loaded anywhere, how many on more than one engine and on every engine. Example: {e0: [a, b],
    e1: [b]} → per engine {e0: 2, e1: 1}, distinct 2, on several 1 (b), on all 1."""
    counts: dict[str, int] = {}
    for names in adapters.values():
        for name in set(names):
            counts[name] = counts.get(name, 0) + 1
    return {
        "adapters_per_engine": {e: len(set(names)) for e, names in adapters.items()},
        "adapters_distinct": len(counts),
        "adapters_on_several_engines": sum(c > 1 for c in counts.values()),
        "adapters_on_every_engine": sum(c == len(adapters) for c in counts.values()) if adapters else 0,
    }


FIELDS = ("ttft_p90_ms", "ttft_p99_ms", "burst_ttft_p99_ms", "window_ttft_p99_ms", "loads_per_1000",
          "disk_loads_per_1000", "throughput_tok_s", "burst_queue_imbalance",
          "burst_on_engine_imbalance")  # fmt: skip


#: The placement figures, summarised beside FIELDS.
PLACEMENT = ("adapters_distinct", "adapters_on_several_engines", "adapters_on_every_engine")


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per target (in first-seen order): errors, requests, and each figure's spread over repeats."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    table: dict[str, dict[str, Any]] = {}
    for label in labels:
        runs = [r for r in rows if r["label"] == label]
        table[label] = {
            "errors": sum(r["errors"] for r in runs),
            "requests": sum(r["requests"] for r in runs),
        }
        for name in (*FIELDS, *PLACEMENT):
            table[label][name] = spread([r[name] for r in runs if r.get(name) is not None])
        first = runs[0]
        table[label]["first_repeat"] = {
            k: [round(v) for v in first.get(k, {}).values()]
            for k in ("requests_by_engine", "loads_by_engine")
        }
    return table


def verdict(table: Mapping[str, Mapping[str, Any]], *, ours: str) -> list[dict[str, Any]]:
    """Each target of issue 39 item 7: our mean, the best peer's mean, the ratio, the bound, met.
    The best peer is the lowest mean (TTFT, loads) or highest (throughput) among the other labels."""
    mine = table.get(ours)
    peers = {k: v for k, v in table.items() if k != ours}
    if mine is None or not peers:
        return []
    checks = []
    for name, field, key, lower in (
        ("TTFT p90", "ttft_p90_ms", "ttft_p90", True),
        ("adapter loads per 1,000 requests", "loads_per_1000", "loads_per_1000", True),
        ("throughput", "throughput_tok_s", "throughput", False),
        ("burst: TTFT p99 of the burst's requests", "burst_ttft_p99_ms", "burst_ttft_p99", True),
        ("burst window: TTFT p99 of every request in it (not a target)", "window_ttft_p99_ms", None, True),
    ):
        means = {k: v[field]["mean"] for k, v in peers.items() if v.get(field, {}).get("mean") is not None}
        value = mine.get(field, {}).get("mean")
        if not means or value is None:
            continue
        best = (min if lower else max)(means, key=lambda k: means[k])
        ratio = value / means[best] if means[best] else None
        if key is None:  # reported beside the targets
            checks.append({"target": name, "ours": value, "best_peer": best, "peer": means[best],
                           "ratio": ratio, "bound": "–", "met": None})  # fmt: skip
            continue
        met = ratio is not None and (ratio <= TARGETS[key] if lower else ratio >= TARGETS[key])
        checks.append({"target": name, "ours": value, "best_peer": best, "peer": means[best], "ratio": ratio,
                       "bound": f"{'≤' if lower else '≥'} {TARGETS[key]}×", "met": met})  # fmt: skip
    worst = mine["burst_queue_imbalance"]["max"]
    checks.append({"target": "burst: largest engine queue ÷ pool mean (worst repeat)", "ours": worst,
                   "best_peer": None, "peer": None, "ratio": worst, "bound": f"≤ {TARGETS['queue']}",
                   "met": worst is None or worst <= TARGETS["queue"]})  # fmt: skip
    checks.append({"target": "errors", "ours": mine["errors"], "best_peer": None, "peer": None, "ratio": None,
                   "bound": "0", "met": mine["errors"] == 0})  # fmt: skip
    return checks


def _met(met: bool | None) -> str:
    return "–" if met is None else "yes" if met else "**no**"


def num(value: Any, fmt: str) -> str:
    """`value` formatted by `fmt` for a report's cell, "–" when unknown."""
    return "–" if value is None else format(value, fmt)


def markdown(
    table: Mapping[str, Mapping[str, Any]], checks: Sequence[Mapping[str, Any]], *, title: str
) -> str:
    """The report: one row per target (mean ± sd over repeats), then the verdict."""
    lines = [
        f"# {title}", "",
        "| target | requests | errors | TTFT p90 ms | TTFT p99 ms | burst TTFT p99 ms "
        "| burst window TTFT p99 ms | loads / 1,000 | disk loads / 1,000 | throughput tok/s "
        "| burst queue max ÷ mean | burst on-engine max ÷ mean |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]  # fmt: skip
    for label, row in table.items():
        cells = [spread_cell(row[f], ".1f" if "imbalance" not in f else ".2f") for f in FIELDS]
        lines.append(f"| {label} | {row['requests']} | {row['errors']} | " + " | ".join(cells) + " |")
    lines += [
        "", "Placement (adapters: each engine's `/v1/models` after the run; per engine: the first repeat):",
        "",
        "| target | adapters loaded | on > 1 engine | on every engine | requests per engine "
        "| loads per engine |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]  # fmt: skip
    for label, row in table.items():
        first = row.get("first_repeat", {})
        placed = " | ".join(spread_cell(row[f], ".0f") for f in PLACEMENT)
        lines.append(f"| {label} | {placed} | {first.get('requests_by_engine', [])} "
                     f"| {first.get('loads_by_engine', [])} |")  # fmt: skip
    if checks:
        lines += [
            "",
            "| target | ours | best peer | ratio | bound | met |",
            "| --- | ---: | --- | ---: | --- | --- |",
        ]
        for c in checks:
            peer = "–" if c["best_peer"] is None else f"{c['best_peer']} ({num(c['peer'], '.1f')})"
            lines.append(f"| {c['target']} | {num(c['ours'], '.2f')} | {peer} | {num(c['ratio'], '.2f')} "
                         f"| {c['bound']} | {_met(c['met'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def catalog_summary(rows: Sequence[Mapping[str, Any]], *, catalog: int) -> dict[str, Any]:
    """The catalog check's verdict: gateway CPU per 1,000 with `catalog` adapters ÷ without (means
    and medians over repeats; target ≤ 1.1), and RSS growth per adapter in KiB (means; target < 100),
    idle after start-up and after the run. Example: RSS 80,000 KiB without and 85,000 with 500 →
    10 KiB per adapter."""
    by = {n: [r for r in rows if r["adapters"] == n] for n in (0, catalog)}

    def s(n: int, key: str) -> dict[str, Any]:
        return spread([r[key] for r in by[n] if r[key] is not None])

    out: dict[str, Any] = {"catalog": catalog}
    for key in ("cpu_s_per_1000", "rss_idle_kib", "rss_after_kib"):
        out[key] = {"none": s(0, key), "catalog": s(catalog, key)}
    cpu = out["cpu_s_per_1000"]
    for stat in ("mean", "median"):
        a, b = cpu["catalog"][stat], cpu["none"][stat]
        out[f"cpu_ratio_{stat}"] = a / b if a is not None and b else None
    for key in ("rss_idle_kib", "rss_after_kib"):
        a, b = out[key]["catalog"]["mean"], out[key]["none"]["mean"]
        out[f"{key}_per_adapter"] = (a - b) / catalog if a is not None and b is not None and catalog else None
    out["errors"] = sum(r["errors"] for r in rows)
    return out


def catalog_markdown(summary: Mapping[str, Any]) -> str:
    """The catalog check's table and verdict."""
    n = summary["catalog"]
    cpu, idle, after = summary["cpu_s_per_1000"], summary["rss_idle_kib"], summary["rss_after_kib"]
    ratio, per = summary["cpu_ratio_mean"], summary["rss_after_kib_per_adapter"]
    lines = [
        f"## Adapter catalog: {n} declared adapters against none", "",
        "| adapters | gateway CPU s / 1,000 | RSS after start-up KiB | RSS after the run KiB |",
        "| ---: | ---: | ---: | ---: |",
        f"| 0 | {spread_cell(cpu['none'], '.3f')} | {spread_cell(idle['none'], '.0f')} "
        f"| {spread_cell(after['none'], '.0f')} |",
        f"| {n} | {spread_cell(cpu['catalog'], '.3f')} | {spread_cell(idle['catalog'], '.0f')} "
        f"| {spread_cell(after['catalog'], '.0f')} |",
        "",
        f"- CPU per 1,000, {n} ÷ 0: **{num(ratio, '.2f')}×** "
        f"(medians {num(summary['cpu_ratio_median'], '.2f')}×; "
        f"target ≤ 1.1: {'met' if ratio is not None and ratio <= 1.1 else '**not met**'})",
        f"- RSS growth per adapter: **{num(per, '.1f')} KiB** after the run, "
        f"{num(summary['rss_idle_kib_per_adapter'], '.1f')} KiB after start-up (target < 100: "
        f"{'met' if per is not None and per < 100 else '**not met**'}); errors {summary['errors']}",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def load_series(timeline: Mapping[str, Any], *, time_scale: float) -> dict[str, list[float]]:
    """One run's plot series from its samples: at each sampling time (engine seconds), the loads
    since the first sample summed over the engines, and the largest waiting + running of any engine."""
    by_t: dict[float, list[Mapping[str, Any]]] = {}
    for s in timeline["samples"]:
        by_t.setdefault(s["t"], []).append(s)
    first: dict[str, float] = {}
    t_out: list[float] = []
    loads: list[float] = []
    busiest: list[float] = []
    for t in sorted(by_t):
        for s in by_t[t]:
            first.setdefault(s["engine"], s["disk_loads"] + s["cpu_loads"])
        t_out.append(t * time_scale)
        loads.append(sum(s["disk_loads"] + s["cpu_loads"] - first[s["engine"]] for s in by_t[t]))
        busiest.append(max(s["waiting"] + s["running"] for s in by_t[t]))
    return {"t": t_out, "loads": loads, "busiest": busiest}
