"""One `tandem bench` invocation: run the workload (against an endpoint, or per harness target),
summarise, and write the results.

Outputs in `out_dir`: `bench.json` (the whole document, `tandem.bench.report.document`), `bench.md`
(the markdown table with its heading) and `requests-<label>.jsonl` (one driver record per line,
token arrival times included, for later plots).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tandem.bench.driver import DriverSettings
from tandem.bench.fairness import ServiceWeights
from tandem.bench.harness import HarnessError, PoolSettings, Tools, measure, run_target
from tandem.bench.records import DriveResult
from tandem.bench.report import RunData, document, markdown, summarize
from tandem.bench.targets import Target
from tandem.bench.workload_file import dump_jsonl
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


def run_endpoint(
    bench: Bench, *, url: str, model: str, engine_metrics: Sequence[str], progress: Progress
) -> list[RunData]:
    """Drive a running endpoint once; `engine_metrics` are the engines whose counters to diff."""
    settings = replace(bench.driver, base_url=url.rstrip("/"), model=model, label="endpoint")
    progress(f"[endpoint] running {len(bench.workload.requests)} requests against {settings.base_url}")
    result, before, after = asyncio.run(
        measure(bench.workload, settings, engines=list(engine_metrics), progress=progress)
    )
    return [RunData("endpoint", {"kind": "endpoint", "url": settings.base_url}, result, before, after)]


def run_harness(
    bench: Bench, *, targets: Sequence[Target], pool: PoolSettings, tools: Tools, progress: Progress
) -> list[RunData]:
    """One cold run per target on identical simulated pools (`tandem.bench.harness`).

    A target whose processes fail to start is reported as a run without requests (its note says
    why) and the next target still runs.
    """
    runs = []
    for number, target in enumerate(targets, start=1):
        what = "1 simulated engine, no router" if target.kind == "direct" else pool.describe()
        progress(f"[{target.label}] target {number}/{len(targets)}: starting {what}")
        try:
            run = run_target(
                target, workload=bench.workload, pool=pool, tools=tools, driver=bench.driver,
                state_dir=bench.out_dir / "runs", progress=progress,
            )  # fmt: skip
        except HarnessError as exc:
            progress(f"[{target.label}] failed: {exc}")
            run = RunData(target.label, target.describe(), DriveResult((), 0.0), {}, {}, notes=(str(exc),))
        runs.append(run)
    return runs


def machine_info() -> dict[str, Any]:
    """Where the numbers were taken: cores, CPU model, OS, Python."""
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "source": source_info(),
    }


def source_info() -> dict[str, Any]:
    """The git commit of the code that ran (gateway, engines and bench alike) and whether the work tree
    had changes; None values when this is not a git checkout."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    status = git("status", "--porcelain")
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def workload_info(workload: Workload, *, seed: int) -> dict[str, Any]:
    """The workload's identity for the report: name, parameters, seed, size and content hash."""
    return {
        "name": workload.name,
        "params": dict(workload.params),
        "seed": seed,
        "requests": len(workload.requests),
        "tenants": list(workload.tenants),
        "sha256": hashlib.sha256(dump_jsonl(workload).encode("utf-8")).hexdigest(),
    }


def _driver_settings(driver: DriverSettings) -> dict[str, Any]:
    """The driver's settings shared by every run (the URL and label differ per run)."""
    return {k: v for k, v in asdict(driver).items() if k not in ("base_url", "label")}


def finish(
    bench: Bench, runs: Sequence[RunData], *, settings: Mapping[str, Any], time_scale: float
) -> tuple[dict[str, Any], str]:
    """Summarise the runs, write bench.json, bench.md and the records; returns (document, markdown)."""
    summaries = [summarize(r, time_scale=time_scale, weights=bench.weights) for r in runs]
    doc = document(
        runs=summaries,
        workload=workload_info(bench.workload, seed=bench.seed),
        settings={**settings, "time_scale": time_scale, "driver": _driver_settings(bench.driver)},
        machine=machine_info(),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        command=bench.command,
    )
    text = markdown(doc)
    bench.out_dir.mkdir(parents=True, exist_ok=True)
    (bench.out_dir / "bench.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (bench.out_dir / "bench.md").write_text(text, encoding="utf-8")
    for run in runs:
        lines = "".join(json.dumps(r.to_json()) + "\n" for r in run.result.records)
        (bench.out_dir / f"requests-{run.label.replace(':', '-')}.jsonl").write_text(lines, encoding="utf-8")
    return doc, text
