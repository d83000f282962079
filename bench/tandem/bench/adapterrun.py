"""The multi-adapter benchmark's runs (`tandem bench --workload multi-adapter --adapters-bench`): every
target in front of the same simulated LoRA engines, and the adapter catalog's cost in the gateway.

Method:
- the engines run with `--enable-lora --max-loras N` and the filesystem resolver (`PoolSettings.
  max_loras`, `adapters`: the harness writes a config-only adapter per name and gives Tandem's gateway
  the names as `adapterNames`); vllm-router 0.1.17 in `--worker-urls` mode forwards the body's
  `model` unchanged (no `--static-models`, no model check: an unknown name gets the engine's 404), so
  it needs nothing;
- per repeat, every target in turn (the order rotates each repeat), each on fresh engines: scrape the
  engines, drive the workload while sampling every engine's `/metrics` each `interval_s` (loads,
  waiting, running: `tandem.bench.adapterbench`), scrape again, and ask each engine's `/v1/models`
  which adapters it has loaded (the resolver lists an adapter once a request has loaded it);
- `catalog_cost`: Tandem's gateway with `catalog` declared adapter names against none, on base-model
  traffic at a high engine time scale (model time near zero): gateway CPU seconds per 1,000 requests
  and its resident memory (VmRSS of its process tree) after start-up and after the run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from tandem.bench import plots
from tandem.bench.adapterbench import (
    EngineSample,
    catalog_markdown,
    catalog_summary,
    load_series,
    markdown,
    parse_engine_sample,
    run_row,
    summarize,
    verdict,
)
from tandem.bench.adapterfloor import least_loads, least_loads_markdown
from tandem.bench.adapters import adapter_names
from tandem.bench.cpu import PROC, cpu_per_1000, read_table
from tandem.bench.driver import DriverSettings, drive
from tandem.bench.engines import metrics_url
from tandem.bench.harness import PoolSettings, Started, Tools, started
from tandem.bench.records import DriveResult
from tandem.bench.targets import Target
from tandem.bench.workloads import BenchRequest, Workload

Progress = Callable[[str], None]


async def sample_engines(
    client: httpx.AsyncClient, engines: Sequence[str], *, t: float
) -> dict[str, EngineSample]:
    """Every engine's sample now; an engine whose scrape fails is left out."""

    async def one(url: str) -> EngineSample | None:
        try:
            response = await client.get(metrics_url(url), timeout=5.0)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        return parse_engine_sample(response.text, t=t, engine=url)

    found = await asyncio.gather(*(one(u) for u in engines))
    return {s.engine: s for s in found if s is not None}


async def loaded_adapters(client: httpx.AsyncClient, engine: str, *, model: str) -> list[str]:
    """The adapters an engine lists in `/v1/models` (every entry but the served model); [] on error."""
    try:
        response = await client.get(f"{engine}/v1/models", timeout=5.0)
        response.raise_for_status()
        return sorted(m["id"] for m in response.json()["data"] if m["id"] != model)
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return []


@dataclass(frozen=True)
class Measured:
    result: DriveResult
    samples: list[EngineSample]
    before: dict[str, EngineSample]
    after: dict[str, EngineSample]
    adapters: dict[str, list[str]]
    cpu: dict[str, Any]


async def _measure(
    run: Started, workload: Workload, settings: DriverSettings, *, interval_s: float
) -> Measured:
    samples: list[EngineSample] = []
    async with httpx.AsyncClient(trust_env=False) as client:
        before = await sample_engines(client, run.engines, t=0.0)
        cpu_before = run.gateway_cpu_s()
        t0 = time.monotonic()

        async def sampler() -> None:
            tick = 0
            while True:
                now = time.monotonic() - t0
                samples.extend((await sample_engines(client, run.engines, t=now)).values())
                tick += 1
                await asyncio.sleep(max(0.0, tick * interval_s - (time.monotonic() - t0)))

        task = asyncio.create_task(sampler())
        try:
            result = await drive(workload, settings)
        finally:
            task.cancel()
        cpu_after = run.gateway_cpu_s()
        after = await sample_engines(client, run.engines, t=time.monotonic() - t0)
        adapters = {e: await loaded_adapters(client, e, model=run.model) for e in run.engines}
    sent = sum(r.start_s is not None for r in result.records)
    cpu = cpu_per_1000(cpu_before, cpu_after, requests=sent) if run.gateway_pids else {}
    return Measured(result, samples, before, after, adapters, cpu)


def run_adapters(
    targets: Sequence[Target],
    *,
    workload: Workload,
    window: tuple[float, float] | None,
    hot: str | None = None,
    pool: PoolSettings,
    tools: Tools,
    driver: DriverSettings,
    repeat: int,
    state_dir: Path,
    progress: Progress,
    interval_s: float = 1.0,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every target `repeat` times (module docstring): the rows and the sampled timelines; `hot`: the
    burst's adapter (`run_row`)."""
    rows: list[dict[str, Any]] = []
    timelines: list[dict[str, Any]] = []
    for r in range(repeat):
        order = list(targets[r % len(targets) :]) + list(targets[: r % len(targets)])
        for target in order:
            label = target.label
            with started(
                target, pool=pool, tools=tools, state_dir=state_dir / f"r{r}", progress=progress
            ) as run:
                settings = replace(driver, base_url=run.base_url, base_urls=run.base_urls, model=run.model,
                                   label=label)  # fmt: skip
                progress(f"[{label}] repeat {r + 1}/{repeat}: {len(workload.requests)} requests")
                m = asyncio.run(_measure(run, workload, settings, interval_s=interval_s))
                pools = run.engine_pools
            row = run_row(
                label, r, result=m.result, samples=m.samples, before=m.before, after=m.after, window=window,
                time_scale=pool.time_scale, adapters=m.adapters, hot=hot, pools=pools,
            )  # fmt: skip
            row["gateway_cpu"] = m.cpu
            rows.append(row)
            timelines.append({"label": label, "repeat": r, "engines": list(m.before),
                              "samples": [vars(s) for s in m.samples], "adapters": m.adapters})  # fmt: skip
            progress(f"[{label}] errors {row['errors']}, TTFT p90 {row['ttft_p90_ms'] or 0:.0f} ms, "
                     f"loads/1000 {row['loads_per_1000'] or 0:.0f}, "
                     f"tok/s {row['throughput_tok_s'] or 0:.0f}")  # fmt: skip
    return rows, timelines


def tree_rss_kib(root: int, *, proc: Path = PROC) -> int | None:
    """VmRSS (KiB) summed over `root` and its descendants; None when `root` is gone."""
    table = read_table(proc)
    if root not in table:
        return None
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _) in table.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    total = 0
    for pid in tree:
        try:
            text = (proc / str(pid) / "status").read_text(encoding="utf-8")
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in text.splitlines() if line.startswith("VmRSS:")), 0)
    return total


def base_workload(requests: int, *, concurrency: int) -> Workload:
    """`requests` short base-model completions, closed loop at `concurrency` (the catalog check)."""
    reqs = tuple(
        BenchRequest(0.0, "bench", 8, prompt=f"catalog check {i} " + "word " * 32) for i in range(requests)
    )
    return Workload("catalog-check", reqs, {"requests": requests}, concurrency)


def catalog_cost(
    catalog: int,
    *,
    pool: PoolSettings,
    tools: Tools,
    driver: DriverSettings,
    requests: int,
    repeat: int,
    state_dir: Path,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Tandem's gateway (policy `tandem`) with `catalog` declared adapters against 0, `repeat` times,
    alternating which goes first: CPU per 1,000 base-model requests and RSS (module docstring)."""
    work = base_workload(requests, concurrency=driver.max_concurrency)
    rows = []
    for r in range(repeat):
        for n in (0, catalog) if r % 2 == 0 else (catalog, 0):
            p = replace(pool, adapters=adapter_names(n) if n else ())
            target = Target("tandem", "tandem")
            with started(target, pool=p, tools=tools, state_dir=state_dir / f"catalog-{n}-r{r}",
                         progress=progress) as run:  # fmt: skip
                pid = run.gateway_pids[0]
                rss_idle = tree_rss_kib(pid)
                settings = replace(driver, base_url=run.base_url, base_urls=run.base_urls, model=run.model,
                                   label=f"catalog-{n}")  # fmt: skip
                cpu_before = run.gateway_cpu_s()
                result = asyncio.run(drive(work, settings))
                cpu_after = run.gateway_cpu_s()
                rss_after = tree_rss_kib(pid)
            sent = sum(x.start_s is not None for x in result.records)
            cpu = cpu_per_1000(cpu_before, cpu_after, requests=sent)
            row = {
                "adapters": n, "repeat": r, "requests": len(result.records),
                "errors": sum(not x.ok for x in result.records), "cpu_s_per_1000": cpu.get("cpu_s_per_1000"),
                "rss_idle_kib": rss_idle, "rss_after_kib": rss_after,
            }  # fmt: skip
            progress(f"[catalog {n}] repeat {r + 1}/{repeat}: CPU/1000 {row['cpu_s_per_1000'] or 0:.2f} s, "
                     f"RSS {rss_idle} → {rss_after} KiB, errors {row['errors']}")  # fmt: skip
            rows.append(row)
    return rows


def write_results(
    out_dir: Path,
    *,
    ours: str,
    doc: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    timelines: Sequence[dict[str, Any]],
    catalog_rows: Sequence[dict[str, Any]],
    window: tuple[float, float] | None,
    time_scale: float,
    title: str,
    plot: bool,
    sequence: Sequence[str] = (),
    slots: int | Sequence[int] | None = None,
    gpu_slots: int | Sequence[int] | None = None,
) -> str:
    """adapters.json, adapters.md, adapter-timelines.json and (with `plot` and matplotlib)
    adapter-loads.png (the first repeat of every target); returns the Markdown. The verdict compares
    the target `ours` with the others. `sequence`: the workload's adapters in arrival order and
    `slots` the engines' CPU-tier entries in all (per pool with P/D) and `gpu_slots` their GPU slots,
    for the floors no placement beats (`least_loads`)."""
    table = summarize(rows)
    checks = verdict(table, ours=ours)
    text = markdown(table, checks, title=title)
    bound = None
    if sequence and slots:
        peer = next((c["peer"] for c in checks if c["target"].startswith("adapter loads")), None)
        bound = least_loads(sequence, slots=slots, best_peer=peer, gpu_slots=gpu_slots)
        text += least_loads_markdown(bound)
    catalog = None
    if catalog_rows:
        catalog = catalog_summary(catalog_rows, catalog=max(r["adapters"] for r in catalog_rows))
        text += "\n" + catalog_markdown(catalog)
    out_dir.mkdir(parents=True, exist_ok=True)
    full = {
        **doc, "rows": list(rows), "summary": table, "verdict": checks, "catalog_rows": list(catalog_rows),
        "catalog": catalog, "least_loads": bound,
    }  # fmt: skip
    (out_dir / "adapters.json").write_text(json.dumps(full, indent=2, default=str) + "\n", encoding="utf-8")
    (out_dir / "adapter-timelines.json").write_text(json.dumps(list(timelines)) + "\n", encoding="utf-8")
    if plot and plots.available() and timelines:
        series = {t["label"]: load_series(t, time_scale=time_scale) for t in timelines if t["repeat"] == 0}
        plots.adapter_loads(series, out_dir / "adapter-loads.png", title=title, window=window)
        text += "\nPlot: adapter-loads.png (loads over time, first repeat of each target).\n"
    (out_dir / "adapters.md").write_text(text, encoding="utf-8")
    return text
