"""`tandem bench`'s separate modes, each with its own runs and report instead of a workload's table:
the router-overhead sweep (`--overhead-sweep`), many services behind one gateway (`--many-services`),
the multi-adapter benchmark (`--adapters-bench`) and the capacity profile (`--capacity-profile`). The
command (`tandem.cli.bench`) checks the flags and hands each mode its harness setup to call."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import click

from tandem.bench import capacity as capacity_profile
from tandem.bench.adapterrun import catalog_cost, run_adapters, write_results
from tandem.bench.adapters import MultiAdapterParams, adapter_names, burst_index, burst_window
from tandem.bench.harness import HarnessError, PoolSettings, Tools
from tandem.bench.manyservices import ManySettings, markdown, run_many_services
from tandem.bench.overhead import SweepSettings, parse_levels, run_sweep
from tandem.bench.runner import (
    Bench,
    write_overhead,
)
from tandem.bench.targets import (
    Target,
)
from tandem.cli.exits import fail
from tandem.local.binaries import find_redis_server

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
#: Targets, binaries and the pool from the flags (`tandem.cli.bench._harness_setup`), called when needed.
HarnessSetup = Callable[[], "tuple[list[Target], Tools, PoolSettings]"]


def stop(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """End `tandem bench` with `message` on stderr and `code` (2: bad flags)."""
    fail(message, code=code)


def say(message: str) -> None:
    """Progress on stderr (stdout carries the report)."""
    click.echo(message, err=True)


def command_line() -> tuple[str, ...]:
    """The command as run, for the results' provenance."""
    args = sys.argv[sys.argv.index("bench") + 1 :] if "bench" in sys.argv else []
    return ("tandem", "bench", *args)


def overhead(setup: Bench, o: dict[str, Any], harness: HarnessSetup) -> None:
    """The router-overhead sweep (`tandem.bench.overhead`): overhead.json, overhead.md, overhead.png."""
    try:
        levels = parse_levels(o["overhead_sweep"])
    except ValueError as exc:
        stop(str(exc))
    targets, tools, pool = harness()
    sweep = SweepSettings(
        levels=levels, requests_per_level=o["sweep_requests"], engine_time_scale=o["sweep_time_scale"],
        request_timeout_s=min(60.0, o["request_timeout"]), probe_pairs=o["sweep_probe_pairs"],
    )  # fmt: skip
    rows = run_sweep(
        targets, pool=pool, tools=tools, sweep=sweep, repeat=setup.repeat, state_dir=setup.out_dir / "runs",
        progress=say,
    )  # fmt: skip
    text = write_overhead(setup, rows, sweep=sweep, plot=not o["no_plots"], progress=say)
    click.echo(text)
    say(f"results in {setup.out_dir}/ (overhead.json, overhead.md, overhead.png)")
    if not any(r["ok"] for r in rows if r["label"] != "direct"):
        stop("overhead sweep: no request through a router succeeded", EXIT_FAILED)


def many_services(o: dict[str, Any]) -> None:
    """N services behind one gateway against one gateway each (`tandem.bench.manyservices`):
    many-services.json and many-services.md."""
    if o["policy"] or o["variant"] or o["peer"] or o["peer_command"] or o["direct"] or o["url"]:
        stop("--many-services runs its own configurations (direct, own, shared): give no --url, "
              "--policy, --variant, --peer, --peer-command or --direct")  # fmt: skip
    settings = ManySettings(
        services=o["many_services"], engines=o["engines"], requests=o["requests"] or 2000,
        concurrency=o["max_concurrency"] or 32, time_scale=o["sweep_time_scale"], profile=o["profile"],
        seed=o["seed"], repeat=o["repeat"], request_timeout_s=min(60.0, o["request_timeout"]),
        probe_pairs=o["sweep_probe_pairs"],
    )  # fmt: skip
    out = o["out"] or Path("bench-results") / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    tools = Tools(python=sys.executable, redis_server=find_redis_server(), vllm_router=None)
    try:
        rows, summary = run_many_services(settings, tools=tools, out_dir=out, progress=say)
    except KeyboardInterrupt:
        stop("interrupted; every child process has been stopped", EXIT_INTERRUPTED)
    except HarnessError as exc:
        stop(str(exc), EXIT_FAILED)
    text = markdown(summary, settings)
    doc = {"command": list(command_line()), "settings": asdict(settings), "rows": rows, "summary": summary}
    (out / "many-services.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (out / "many-services.md").write_text(text, encoding="utf-8")
    click.echo(text)
    say(f"results in {out}/ (many-services.json, many-services.md)")
    if all(r["errors"] == r["requests"] for r in rows if r["config"] != "direct"):
        stop("many services: no request through a gateway succeeded", EXIT_FAILED)


def adapters(setup: Bench, o: dict[str, Any], harness: HarnessSetup) -> None:
    """The multi-adapter benchmark (`tandem.bench.adapterrun`): adapters.json/md, adapter-loads.png."""
    if setup.workload.name != "multi-adapter":
        stop("--adapters-bench needs --workload multi-adapter")
    cpu_loras = o["max_cpu_loras"] or o["max_loras"]  # vLLM's --max-cpu-loras defaults to --max-loras
    if cpu_loras < o["max_loras"]:
        stop(f"--max-cpu-loras ({cpu_loras}) must be >= --max-loras ({o['max_loras']})")
    targets, tools, pool = harness()
    params = MultiAdapterParams.model_validate(setup.workload.params)
    pool = replace(pool, max_loras=o["max_loras"], max_cpu_loras=o["max_cpu_loras"],
                   adapters=adapter_names(params.adapters))  # fmt: skip
    window = burst_window(params)
    runs = setup.out_dir / "runs"
    rows, timelines = run_adapters(
        targets, workload=setup.workload, window=window, hot=pool.adapters[burst_index(params)],
        pool=pool, tools=tools, driver=setup.driver,
        repeat=setup.repeat, state_dir=runs, progress=say,
    )  # fmt: skip
    catalog: list[dict[str, Any]] = []
    if o["adapter_catalog"]:
        catalog = catalog_cost(
            o["adapter_catalog"], pool=replace(pool, time_scale=o["sweep_time_scale"]), tools=tools,
            driver=replace(setup.driver, max_concurrency=16, tenant_concurrency={}),
            requests=o["catalog_requests"], repeat=setup.repeat, state_dir=runs, progress=say,
        )  # fmt: skip
    title = (f"Multi-adapter: {params.adapters} adapters (Zipf {params.zipf_s}), {pool.engines} engines, "
             f"max_loras {o['max_loras']}, max_cpu_loras {cpu_loras}")  # fmt: skip
    doc = {
        "command": list(setup.command), "workload": setup.workload.name,
        "params": dict(setup.workload.params), "pool": asdict(pool) | {"adapters": len(pool.adapters)},
        "repeat": setup.repeat,
    }  # fmt: skip
    ours = next((t.label for t in targets if t.kind == "tandem"), targets[0].label)
    engines_per_pool = (pool.prefill_engines, pool.engines) if pool.pd else (pool.engines,)
    text = write_results(
        setup.out_dir, ours=ours, doc=doc, rows=rows, timelines=timelines, catalog_rows=catalog,
        window=window, time_scale=pool.time_scale, title=title, plot=not o["no_plots"],
        sequence=[r.model for r in setup.workload.requests if r.model is not None],
        slots=[n * cpu_loras for n in engines_per_pool],
        gpu_slots=[n * o["max_loras"] for n in engines_per_pool],
    )  # fmt: skip
    click.echo(text)
    say(f"results in {setup.out_dir}/ (adapters.json, adapters.md, adapter-loads.png)")
    if all(r["errors"] == r["requests"] for r in rows):
        stop("adapters: no request succeeded", EXIT_FAILED)


def capacity(setup: Bench, o: dict[str, Any], harness: HarnessSetup) -> None:
    """The capacity profile (`tandem.bench.capacity`): capacity.json and capacity.md per target."""
    targets, tools, pool = harness()
    rates = capacity_profile.parse_rates(o["capacity_profile"])
    rows = []
    for target in targets:
        rows += capacity_profile.run_profile(
            target, workload=setup.workload, rates=rates, seconds=o["capacity_seconds"], pool=pool,
            tools=tools, driver=setup.driver, slo=setup.slo, state_dir=setup.out_dir / "runs" / target.label,
            seed=setup.seed, progress=say,
        )  # fmt: skip
    threshold = capacity_profile.DEFAULT_THRESHOLD
    table = capacity_profile.profile_markdown(rows, threshold=threshold, pools=("prefill", "decode"))
    text = "# Capacity profile\n\n" + table
    doc = {
        "command": list(setup.command), "workload": setup.workload.name,
        "params": dict(setup.workload.params),
        "slo": {"ttft_s": setup.slo.ttft_s, "tpot_s": setup.slo.tpot_s}, "threshold": threshold,
        "time_scale": o["time_scale"], "seconds": o["capacity_seconds"], "rows": rows,
        "capacity": {
            label: capacity_profile.capacity([r for r in rows if r["label"] == label], threshold=threshold)
            for label in dict.fromkeys(r["label"] for r in rows)
        },
    }  # fmt: skip
    setup.out_dir.mkdir(parents=True, exist_ok=True)
    (setup.out_dir / "capacity.json").write_text(json.dumps(doc, indent=2, default=str), encoding="utf-8")
    (setup.out_dir / "capacity.md").write_text(text, encoding="utf-8")
    click.echo(text)
    say(f"results in {setup.out_dir}/ (capacity.json, capacity.md)")
    if not any(r["ok"] for r in rows):
        stop("capacity profile: no request succeeded at any rate", EXIT_FAILED)
