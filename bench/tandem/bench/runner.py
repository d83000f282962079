"""One `tandem bench` invocation: run the workload (against an endpoint, or per harness target),
summarise, and write the results.

Outputs in `out_dir`: `bench.json` (the whole document, `tandem.bench.report.document`), `bench.md`
(the markdown table with its heading) and `requests-<label>.jsonl` (one driver record per line,
token arrival times included, for later plots). With `Bench.isolation` (`--isolation`), every target
and repeat runs twice, the light tenant alone and then the flood (`tandem.bench.isolation`):
`runs` in bench.json are the flood runs, `isolation` has the comparison and the alone runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tandem.bench import plots
from tandem.bench.driver import DriverSettings
from tandem.bench.fairness import ServiceWeights, service_curves
from tandem.bench.harness import Counters, HarnessError, PoolSettings, Tools, measure, run_target
from tandem.bench.isolation import (
    ALONE,
    FLOOD,
    IsolationSpec,
    alone_workload,
    isolation_document,
    isolation_row,
)
from tandem.bench.oracle import PoolCapacity, compare, oracle
from tandem.bench.oracle import markdown as oracle_markdown
from tandem.bench.overhead import SweepSettings, summarize_sweep, sweep_markdown
from tandem.bench.provenance import machine_info, workload_info
from tandem.bench.records import DriveResult
from tandem.bench.report import RunData, document, markdown, summarize
from tandem.bench.stats import Slo, timed
from tandem.bench.targets import Target
from tandem.bench.timeline import TimelineRecorder, build_timeline, timeline_markdown
from tandem.bench.workloads import Workload

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Bench:
    """What every run of one invocation shares: the workload, how to send it, how to count service."""

    workload: Workload
    seed: int
    driver: DriverSettings
    weights: ServiceWeights
    out_dir: Path
    command: tuple[str, ...]
    slo: Slo = field(default_factory=Slo)
    repeat: int = 1
    isolation: IsolationSpec | None = None

    def phases(self) -> list[tuple[str, Workload]]:
        """The runs per target and repeat: the workload; with isolation, the light tenant alone first."""
        if self.isolation is None:
            return [("", self.workload)]
        return [(ALONE, alone_workload(self.workload, self.isolation)), (FLOOD, self.workload)]


def run_endpoint(
    bench: Bench,
    *,
    url: str,
    model: str,
    engine_metrics: Sequence[str],
    timeline: Sequence[str] = (),
    timeline_interval_s: float = 1.0,
    progress: Progress,
) -> tuple[list[RunData], TimelineRecorder | None]:
    """Drive a running endpoint `bench.repeat` times; `engine_metrics` are the engines whose counters
    to diff; with `timeline` URLs, their autoscaler gauges are recorded during the (first) run."""
    settings = replace(bench.driver, base_url=url.rstrip("/"), model=model, label="endpoint")
    runs: list[RunData] = []
    recorder: TimelineRecorder | None = None
    for repeat in range(bench.repeat):
        progress(f"[endpoint] running {len(bench.workload.requests)} requests against {settings.base_url}")
        urls = timeline if repeat == 0 else ()
        result, before, after, recorded = asyncio.run(
            _measure_recording(
                bench.workload, settings, list(engine_metrics), urls, timeline_interval_s, progress
            )
        )
        recorder = recorder or recorded
        target = {"kind": "endpoint", "url": settings.base_url}
        runs.append(RunData("endpoint", target, result, before, after, repeat=repeat))
    return runs, recorder


async def _measure_recording(
    workload: Workload,
    settings: DriverSettings,
    engines: list[str],
    urls: Sequence[str],
    interval_s: float,
    progress: Progress,
) -> tuple[DriveResult, Counters, Counters, TimelineRecorder | None]:
    """`measure`, with a TimelineRecorder scraping `urls` for as long as the workload runs."""
    if not urls:
        return (*await measure(workload, settings, engines=engines, progress=progress), None)
    async with httpx.AsyncClient(trust_env=False) as client:
        recorder = TimelineRecorder(list(urls), client=client, interval_s=interval_s)
        task = asyncio.ensure_future(recorder.run())
        try:
            result, before, after = await measure(workload, settings, engines=engines, progress=progress)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return result, before, after, recorder


def write_timeline(
    bench: Bench,
    run: RunData,
    recorder: TimelineRecorder,
    *,
    time_scale: float,
    plot: bool,
    progress: Progress,
    capacities: Sequence[PoolCapacity] = (),
) -> str:
    """timeline.json and timeline.png of an endpoint run; returns the markdown summary. With
    `capacities` (`--oracle`), each pool's replica-seconds against the oracle's (`tandem.bench.oracle`)."""
    requests = timed(run.result.records, time_scale=time_scale)
    doc = build_timeline(recorder.samples, requests, time_scale=time_scale, slo=bench.slo)
    if capacities:
        arrivals = [r.arrival / time_scale for r in requests]
        runs = [oracle(arrivals, c, duration_s=doc["duration_s"]) for c in capacities]
        doc["oracle"] = compare(doc["replica_seconds"], runs, duration_s=doc["duration_s"])
    doc["scrapes"] = recorder.scrapes
    doc["scrape_errors"] = {
        url: {"count": n, "first": recorder.first_errors.get(url)} for url, n in recorder.errors.items()
    }
    bench.out_dir.mkdir(parents=True, exist_ok=True)
    (bench.out_dir / "timeline.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if plot and plots.available():
        plots.autoscaler_timeline(
            doc, bench.out_dir / "timeline.png", title=f"{bench.workload.name}: autoscaler timeline"
        )
    elif plot:
        progress("matplotlib is not installed (the bench extra): no timeline.png")
    for url, err in doc["scrape_errors"].items():
        progress(f"[timeline] {url}: {err['count']} failed scrapes (first: {err['first']})")
    text = timeline_markdown(doc)
    if capacities:
        text += '\n\nAgainst the oracle (`--oracle`; docs/autoscaler.md, "The oracle"):\n\n'
        text += oracle_markdown(doc["oracle"])
    return text


def run_harness(
    bench: Bench, *, targets: Sequence[Target], pool: PoolSettings, tools: Tools, progress: Progress
) -> list[RunData]:
    """`bench.repeat` cold runs per target on identical simulated pools (`tandem.bench.harness`),
    repeat after repeat, each running every target in turn (so a slow change in the machine's load
    falls on every target alike, not on the one that ran at that time); with isolation, each run is
    two cold runs, the light tenant alone and then the flood (`Bench.phases`).

    A target whose processes fail to start is reported as a run without requests (its note says
    why) and the next run still starts.
    """
    runs = []
    for repeat in range(bench.repeat):
        for number, target in enumerate(targets, start=1):
            what = "1 simulated engine, no router" if target.kind == "direct" else pool.describe()
            what += f", {target.replicas} gateway replicas" if target.replicas > 1 else ""
            for phase, workload in bench.phases():
                of = f", run {repeat + 1}/{bench.repeat}" if bench.repeat > 1 else ""
                of += f", {phase}" if phase else ""
                progress(f"[{target.label}] target {number}/{len(targets)}{of}: starting {what}")
                state = bench.out_dir / "runs" / (f"r{repeat}" if bench.repeat > 1 else "") / phase
                try:
                    run = run_target(
                        target, workload=workload, pool=pool, tools=tools, driver=bench.driver,
                        state_dir=state, progress=progress,
                    )  # fmt: skip
                except HarnessError as exc:
                    progress(f"[{target.label}] failed: {exc}")
                    run = RunData(
                        target.label, target.describe(), DriveResult((), 0.0), {}, {}, notes=(str(exc),)
                    )
                runs.append(
                    replace(run, repeat=repeat, phase=phase, notes=(*run.notes, *_dry(workload, run)))
                )
    return runs


def _dry(workload: Workload, run: RunData) -> tuple[str, ...]:
    """A note when a closed loop sent every request it had: it may have run dry before its end."""
    if not workload.closed_loop or not run.result.records or run.result.unissued:
        return ()
    tenants = ", ".join(workload.closed_loop)
    return (
        f"the closed loop of {tenants} sent every request it had: it may have run dry (raise heavy_requests)",
    )


def _driver_settings(driver: DriverSettings) -> dict[str, Any]:
    """The driver's settings shared by every run (the URLs and label differ per run)."""
    return {k: v for k, v in asdict(driver).items() if k not in ("base_url", "base_urls", "label")}


def finish(
    bench: Bench, runs: Sequence[RunData], *, settings: Mapping[str, Any], time_scale: float
) -> tuple[dict[str, Any], str]:
    """Summarise the runs, write bench.json, bench.md and the records; returns (document, markdown).

    With isolation, `runs` in the document are the flood runs and `isolation` holds the comparison
    with the alone runs (`_isolation`)."""
    main = [r for r in runs if r.phase != ALONE]
    summaries = [summarize(r, time_scale=time_scale, weights=bench.weights, slo=bench.slo) for r in main]
    doc = document(
        runs=summaries,
        workload=workload_info(bench.workload, seed=bench.seed),
        settings={**settings, "time_scale": time_scale, "driver": _driver_settings(bench.driver)},
        machine=machine_info(),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        command=bench.command,
    )
    if bench.isolation is not None:
        alone = [r for r in runs if r.phase == ALONE]
        doc["isolation"] = _isolation(
            bench.isolation, main=list(zip(main, summaries, strict=True)), alone=alone, time_scale=time_scale
        )
        doc["isolation"]["alone_runs"] = [
            summarize(r, time_scale=time_scale, weights=bench.weights, slo=bench.slo) for r in alone
        ]
    text = markdown(doc)
    bench.out_dir.mkdir(parents=True, exist_ok=True)
    (bench.out_dir / "bench.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (bench.out_dir / "bench.md").write_text(text, encoding="utf-8")
    for run in runs:
        lines = "".join(json.dumps(r.to_json()) + "\n" for r in run.result.records)
        (bench.out_dir / f"requests-{run.file_label}.jsonl").write_text(lines, encoding="utf-8")
    return doc, text


def _isolation(
    spec: IsolationSpec,
    *,
    main: Sequence[tuple[RunData, Mapping[str, Any]]],
    alone: Sequence[RunData],
    time_scale: float,
) -> dict[str, Any]:
    """The isolation rows: each flood run (with its summary) against the alone run of the same target
    and repeat."""
    by_key = {(r.label, r.repeat): r for r in alone}
    rows = []
    for run, summary in main:
        pair = by_key.get((run.label, run.repeat))
        rows.append(
            isolation_row(
                label=run.label, repeat=run.repeat, spec=spec, fairness=summary["fairness"],
                unsent=run.result.unissued, flood=timed(run.result.records, time_scale=time_scale),
                alone=timed(pair.result.records, time_scale=time_scale) if pair is not None else [],
            )
        )  # fmt: skip
    return isolation_document(spec, rows)


def write_plots(
    bench: Bench,
    runs: Sequence[RunData],
    *,
    time_scale: float,
    progress: Progress,
    isolation: Mapping[str, Any] | None = None,
) -> list[Path]:
    """`ttft-cdf.png` and `requests-timeline.png` from the first run of every target (engine seconds),
    and with two tenants or more `service-over-time.png` (`_service_plot`); isolation's alone runs
    are left out (they are in the table). `isolation` (bench.json's, from `finish`) adds
    `isolation.png` (`_isolation_plot`)."""
    if not plots.available():
        progress("matplotlib is not installed (the bench extra): no plots")
        return []
    first = [r for r in runs if r.repeat == 0 and r.result.records and r.phase != ALONE]
    views = {r.label: [t for t in timed(r.result.records, time_scale=time_scale) if t.ok] for r in first}
    views = {label: v for label, v in views.items() if v}
    if not views:
        return []
    title = f"{bench.workload.name}, time scale {time_scale:g}"
    cdf = bench.out_dir / "ttft-cdf.png"
    plots.ttft_cdf({k: [t.ttft for t in v if t.ttft is not None] for k, v in views.items()}, cdf, title=title)
    timeline = bench.out_dir / "requests-timeline.png"
    data = {
        label: {
            "arrival": [t.arrival for t in v if t.ttft is not None],
            "ttft": [t.ttft for t in v if t.ttft is not None],
            "start": [t.start for t in v if t.start is not None and t.end is not None],
            "end": [t.end for t in v if t.start is not None and t.end is not None],
        }
        for label, v in views.items()
    }
    plots.request_timeline(data, timeline, title=title)
    return [
        cdf, timeline, *_service_plot(bench, first, time_scale=time_scale, title=title),
        *_isolation_plot(bench, isolation, title=title),
    ]  # fmt: skip


def _service_plot(bench: Bench, first: Sequence[RunData], *, time_scale: float, title: str) -> list[Path]:
    """`service-over-time.png`: each tenant's cumulative service (`fairness.service_curves`), one
    panel per target; the heavy load's window end is marked with isolation. Nothing for one tenant."""
    panels = {
        r.label: service_curves(timed(r.result.records, time_scale=time_scale), bench.weights) for r in first
    }
    if not any(len(curves) > 1 for curves in panels.values()):
        return []
    path = bench.out_dir / "service-over-time.png"
    window = bench.isolation.window_s if bench.isolation is not None else None
    plots.service_over_time(panels, path, title=f"Cumulative service per tenant: {title}", window_s=window)
    return [path]


def _isolation_plot(bench: Bench, isolation: Mapping[str, Any] | None, *, title: str) -> list[Path]:
    """`isolation.png` from bench.json's `isolation`: per target, the light tenant's TTFT p90 alone
    and under the flood (medians over repeats, min–max whiskers) and the isolation ratio."""
    if bench.isolation is None or not isolation:
        return []
    keys = {
        "alone": "light_ttft_alone_p90_s",
        "flood": "light_ttft_flood_p90_s",
        "ratio": "isolation_ratio_p90",
    }
    bars = {label: {k: agg[key] for k, key in keys.items()} for label, agg in isolation["aggregate"].items()}
    path = bench.out_dir / "isolation.png"
    plots.isolation_bars(bars, path, title=f"Isolation under a flood: {title}", light=bench.isolation.light)
    return [path]


def write_overhead(
    bench: Bench, rows: Sequence[Mapping[str, Any]], *, sweep: SweepSettings, plot: bool, progress: Progress
) -> str:
    """overhead.json (every level row and the summary), overhead.md and overhead.png; returns the markdown."""
    summary = summarize_sweep(rows)
    doc = {
        "schema": "tandem-bench-overhead/1",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": list(bench.command),
        "machine": machine_info(),
        "sweep": asdict(sweep),
        "repeat": bench.repeat,
        "rows": list(rows),
        **summary,
    }
    text = (
        f"# tandem bench: router overhead\n\n- command: `{' '.join(bench.command)}`\n"
        f"- date: {doc['created']}; machine: {doc['machine']['nproc']} cores, {doc['machine']['cpu']}\n"
        f"- one simulated engine at time scale {sweep.engine_time_scale:g}; {sweep.prompt_tokens} prompt and "
        f"{sweep.output_tokens} output tokens per request, streamed; wall milliseconds; "
        f"{bench.repeat} repeat(s), mean ± sd\n\n" + sweep_markdown(summary) + "\n"
    )
    bench.out_dir.mkdir(parents=True, exist_ok=True)
    (bench.out_dir / "overhead.json").write_text(
        json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8"
    )
    (bench.out_dir / "overhead.md").write_text(text, encoding="utf-8")
    if plot and plots.available():
        keys = ("added_ttft_p50_ms", "added_ttft_p99_ms")
        points = [
            {"label": label, "concurrency": c, **{k: v[k]["mean"] for k in keys}}
            for label, by in summary["levels"].items() if label != "direct" for c, v in by.items()
        ]  # fmt: skip
        plots.overhead(points, bench.out_dir / "overhead.png", title="Router overhead over direct (wall ms)")
    elif plot:
        progress("matplotlib is not installed (the bench extra): no overhead.png")
    return text
