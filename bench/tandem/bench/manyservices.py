"""Many services behind one gateway against each behind its own: what one gateway for N models costs.

Method (`tandem bench --many-services 10 --engines 2 --requests 2000 --repeat 3`):
- N InferenceServices `svc-0` … `svc-{N-1}` (served names `model-0` …), each with `engines` simulated
  decode engines, disaggregation off, policy `tandem`, at a high engine time scale (default 1000, as
  the overhead sweep's: model time near zero, so what remains is HTTP, streaming and the gateway's own
  work; `--time-scale` sets it);
- one workload for every configuration: `requests` streamed completions, request i for model i mod N,
  each prompt one of `groups` shared prefixes of its model (`prefix_tokens` long) and a distinct
  suffix, `output_tokens` out; closed loop, `concurrency` in flight;
- three configurations, in this order each repeat (`own` and `shared` swap places every other repeat),
  each on fresh engines and a fresh KV pool (cold caches):
  - `direct`: no gateway; request i goes to its model's engines in turn;
  - `own`: N gateways, one per service (`tandem.local.plan.build_plan`), request i to its model's;
  - `shared`: one gateway in front of all N (`tandem.local.fleet.build_fleet_plan`, the file
    `tandem up -f a -f b` writes), routed by the body's `model`;
- per configuration: gateway CPU per 1,000 requests (every gateway's process tree, `tandem.bench.cpu`,
  read just before and after the run: `own` sums N trees, so N gateways' idle work counts as it would
  in a cluster), client TTFT p50 and p90 (wall), **added TTFT p50** = its p50 − `direct`'s p50 in the
  same repeat, and each model's prefix-cache hit rate (`vllm:prefix_cache_hits_total` ÷
  `_queries_total` over that model's engines);
- after each gateway configuration's run, before its processes stop, the C = 1 probe
  (`tandem.bench.wireprobe`, `probe_pairs` pairs): raw-socket requests alternating between `model-0`'s
  first engine and the gateway serving it, so the added TTFT is the gateway's own, free of the host's
  load;
- the verdict: `shared ÷ own` for CPU per 1,000 and for added TTFT p50 (loaded, and at C = 1; target
  ≤ 1.1), and the largest per-model difference of hit rate, in percentage points (target ≤ 2).

Every process listens on 127.0.0.1 and is stopped when its configuration ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tandem.bench.aggregate import spread, spread_cell
from tandem.bench.counters import EngineCounters
from tandem.bench.cpu import cpu_per_1000, trees_cpu_seconds
from tandem.bench.driver import DriverSettings, drive
from tandem.bench.engines import scrape_all
from tandem.bench.harness import STARTUP_TIMEOUT_S, HarnessError, Tools
from tandem.bench.records import DriveResult
from tandem.bench.stats import percentile
from tandem.bench.text import words
from tandem.bench.wireprobe import probe
from tandem.bench.workloads import BenchRequest, Workload
from tandem.core.gateway import GatewayFile
from tandem.core.spec import InferenceService
from tandem.core.specrules import parse_inference_service
from tandem.local.fleet import build_fleet_plan
from tandem.local.plan import LocalCredentials, LocalPlan, ProcessPlan, build_plan
from tandem.local.ports import free_ports
from tandem.local.supervisor import Child, ChildFailed, Supervisor

Progress = Callable[[str], None]
CONFIGS = ("direct", "own", "shared")


@dataclass(frozen=True)
class ManySettings:
    services: int = 10
    engines: int = 2
    requests: int = 2000
    concurrency: int = 32
    groups: int = 4
    prefix_tokens: int = 256
    suffix_tokens: int = 16
    output_tokens: int = 16
    time_scale: float = 1000.0
    profile: str = "qwen2.5-7b-h100"
    seed: int = 0
    repeat: int = 1
    request_timeout_s: float = 60.0
    #: Request pairs of the C = 1 probe after each gateway configuration's run (0: none).
    probe_pairs: int = 200


def service_name(i: int) -> str:
    return f"svc-{i}"


def model_name(i: int) -> str:
    return f"model-{i}"


def services(s: ManySettings) -> list[InferenceService]:
    """The N services (pure): sim engines, P/D off, Tandem's policy, no declared capacity."""
    return [
        parse_inference_service(
            {
                "apiVersion": "tandem.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": service_name(i)},
                "spec": {
                    "model": {"name": "qwen", "servedName": model_name(i)},
                    "engine": {
                        "kind": "sim",
                        "sim": {"profile": s.profile, "timeScale": s.time_scale},
                        "args": ["--seed", str(s.seed + i)],
                    },
                    "prefill": {"replicas": 0},
                    "decode": {"replicas": s.engines},
                    "disaggregation": {"mode": "off"},
                    "router": {"policy": "tandem"},
                },
            }
        )
        for i in range(s.services)
    ]


def workload(s: ManySettings) -> Workload:
    """The requests every configuration sends (pure, deterministic in `s.seed`): request i is for
    model i mod N, with one of its model's `groups` prefixes; closed loop (every offset 0)."""
    rng = random.Random(f"tandem-bench:{s.seed}:many-services")
    prefixes = [[words(rng, s.prefix_tokens) for _ in range(s.groups)] for _ in range(s.services)]
    requests = []
    for i in range(s.requests):
        m, g = i % s.services, rng.randrange(s.groups)
        prompt = prefixes[m][g] + words(rng, s.suffix_tokens)
        request = BenchRequest(0.0, "bench", s.output_tokens, prompt, group=f"{model_name(m)}/{g}",
                               model=model_name(m))  # fmt: skip
        requests.append(request)
    params = {k: v for k, v in vars(s).items() if k not in ("repeat", "request_timeout_s")}
    return Workload(name="many-services", params=params, requests=tuple(requests), concurrency=s.concurrency)


def request_urls(requests: Sequence[BenchRequest], urls: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Where each request goes (pure): its model's URLs in turn (`urls`: model → base URLs).

    >>> request_urls([BenchRequest(0, "t", 1, "a", model="m")] * 3, {"m": ["u0", "u1"]})
    ('u0', 'u1', 'u0')"""
    turns: dict[str, int] = {}
    out = []
    for r in requests:
        model = r.model or ""
        targets = urls[model]
        turn = turns.get(model, 0)
        turns[model] = turn + 1
        out.append(targets[turn % len(targets)])
    return tuple(out)


@dataclass
class _Stack:
    """One configuration's running processes: the URL of each request, the gateways' pids, each
    model's engines."""

    urls: tuple[str, ...]
    gateway_pids: tuple[int, ...]
    engines: dict[str, list[str]]
    #: Each model's base URL to send to (a gateway's, or for `direct` its first engine's), `/v1` on.
    targets: dict[str, list[str]]


def _plans(svcs: Sequence[InferenceService], s: ManySettings, *, config: str, tools: Tools, run_dir: Path
           ) -> tuple[list[ProcessPlan], dict[str, list[str]], dict[str, list[str]]]:  # fmt: skip
    """Every process of a configuration, each model's engine URLs, each model's base URLs to send to;
    writes the gateways' config files."""
    ports = free_ports()
    for isvc in svcs:
        (run_dir / isvc.metadata.name).mkdir(parents=True, exist_ok=True)
    credentials = LocalCredentials(redis_password=secrets.token_urlsafe(32), engine_api_key=None)

    def plan_of(isvc: InferenceService) -> LocalPlan:
        return build_plan(
            isvc, ports=ports, router_port=next(ports), python=tools.python,
            redis_server=tools.redis_server, state_dir=(run_dir / isvc.metadata.name).resolve(),
            credentials=credentials,
        )  # fmt: skip

    plans = [plan_of(isvc) for isvc in svcs]
    engines = {
        model_name(i): [p.url for p in plan.processes if p.role == "decode"] for i, plan in enumerate(plans)
    }
    processes = [p for plan in plans for p in plan.processes if p.role != "router"]
    if config == "direct":
        return processes, engines, {m: [f"{u}/v1" for u in urls] for m, urls in engines.items()}
    if config == "own":
        routers = []
        for plan in plans:
            _write(plan.router_config_path, plan.router_config.model_dump(by_alias=True, mode="json",
                                                                        exclude_none=True))  # fmt: skip
            routers += [p for p in plan.processes if p.role == "router"]
        targets = {model_name(i): [f"{r.url}/v1"] for i, r in enumerate(routers)}
        return processes + routers, engines, targets
    fleet, file = build_fleet_plan(
        svcs, gateway="bench", spec=None, ports=ports, router_port=next(ports), python=tools.python,
        redis_server=tools.redis_server, state_dir=run_dir.resolve(), credentials=credentials,
    )  # fmt: skip
    _write(fleet.router_config_path, _dump(file))
    # The fleet's engines are the same processes on other ports: send to its, scrape its.
    engines = {
        model_name(i): [
            p.url for p in fleet.processes if p.role == "decode" and p.name.startswith(f"{service_name(i)}-")
        ]
        for i in range(len(svcs))
    }
    [router] = [p for p in fleet.processes if p.role == "router"]
    return list(fleet.processes), engines, {model_name(i): [f"{router.url}/v1"] for i in range(len(svcs))}


def _dump(file: GatewayFile) -> dict[str, Any]:
    return file.model_dump(by_alias=True, mode="json", exclude_none=True)


def _write(path: Path, content: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(content), sort_keys=False), encoding="utf-8")


@contextlib.contextmanager
def _running(config: str, s: ManySettings, *, work: Workload, tools: Tools, run_dir: Path,
             progress: Progress) -> Iterator[_Stack]:  # fmt: skip
    """Start a configuration (Redis, then the engines, then the gateways, each stage at once and waited
    for), and stop every process when the block ends."""
    processes, engines, targets = _plans(services(s), s, config=config, tools=tools, run_dir=run_dir)
    supervisor = Supervisor(log_dir=run_dir.resolve() / "logs")
    children: list[Child] = []
    try:
        for roles in (("kvpool",), ("decode",), ("router",)):
            stage = [supervisor.start(p) for p in processes if p.role in roles]
            children += stage
            for child in stage:
                supervisor.wait_ready(child, timeout=STARTUP_TIMEOUT_S[child.plan.role])
        progress(f"[{config}] {len(children)} processes ready")
        pids = tuple(c.process.pid for c in children if c.plan.role == "router")
        yield _Stack(request_urls(work.requests, targets), pids, engines, targets)
    except ChildFailed as exc:
        raise HarnessError(f"[many-services {config}] {exc}") from None
    finally:
        supervisor.stop_all()


async def _measure(stack: _Stack, work: Workload, settings: DriverSettings
                   ) -> tuple[DriveResult, dict[str, Any], dict[str, EngineCounters]]:  # fmt: skip
    """Drive the workload; the gateways' CPU over it and each model's engine counters' deltas."""
    every = [u for urls in stack.engines.values() for u in urls]
    async with httpx.AsyncClient(trust_env=False) as client:
        before = await scrape_all(client, every)
        cpu_before = trees_cpu_seconds(stack.gateway_pids) if stack.gateway_pids else None
        result = await drive(work, settings)
        cpu_after = trees_cpu_seconds(stack.gateway_pids) if stack.gateway_pids else None
        after = await scrape_all(client, every)
    sent = sum(r.start_s is not None for r in result.records)
    cpu = cpu_per_1000(cpu_before, cpu_after, requests=sent) if stack.gateway_pids else {}
    deltas: dict[str, EngineCounters] = {}
    for model, urls in stack.engines.items():
        total = EngineCounters()
        for url in urls:
            a, b = after.get(url), before.get(url)
            if isinstance(a, EngineCounters) and isinstance(b, EngineCounters):
                total = total + (a - b)
        deltas[model] = total
    return result, cpu, deltas


def _probe(stack: _Stack, s: ManySettings) -> dict[str, object]:
    """The C = 1 probe (`tandem.bench.wireprobe`): pairs alternating between `model-0`'s first engine and
    the gateway that serves it, so the added TTFT is the gateway's alone, free of the host's load."""
    model = model_name(0)
    engine, gateway = f"{stack.engines[model][0]}/v1", stack.targets[model][0]
    result = probe(engine, gateway, model=model, pairs=s.probe_pairs, prompt_tokens=64, output_tokens=16,
                   seed=s.seed)  # fmt: skip
    return result.row(model, 0)


def run_row(config: str, repeat: int, result: DriveResult, cpu: Mapping[str, Any],
            deltas: Mapping[str, EngineCounters]) -> dict[str, Any]:  # fmt: skip
    """One configuration's figures in one repeat (pure)."""
    ttfts = [
        (r.first_token_s - r.start_s) * 1000
        for r in result.records
        if r.ok and r.first_token_s is not None and r.start_s is not None
    ]
    hit = {m: d.rates()["prefix_hit_rate"] for m, d in sorted(deltas.items())}
    return {
        "config": config,
        "repeat": repeat,
        "requests": len(result.records),
        "errors": sum(not r.ok for r in result.records),
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p90_ms": percentile(ttfts, 90),
        "cpu_s_per_1000": cpu.get("cpu_s_per_1000"),
        "hit_rate": hit,
        "engine_requests": {m: d.requests for m, d in sorted(deltas.items())},
    }


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per configuration mean ± sd over repeats, added TTFT over `direct` per repeat, and the verdict
    ratios shared ÷ own (pure)."""
    by = {c: [r for r in rows if r["config"] == c] for c in CONFIGS}
    direct_p50 = {r["repeat"]: r["ttft_p50_ms"] for r in by["direct"]}

    def added(r: Mapping[str, Any]) -> float | None:
        base = direct_p50.get(r["repeat"])
        return None if base is None or r["ttft_p50_ms"] is None else r["ttft_p50_ms"] - base

    table: dict[str, Any] = {}
    for config, runs in by.items():
        if not runs:
            continue
        models = sorted({m for r in runs for m in r["hit_rate"]})
        table[config] = {
            "errors": sum(r["errors"] for r in runs),
            "requests": sum(r["requests"] for r in runs),
            "ttft_p50_ms": _spread([r["ttft_p50_ms"] for r in runs]),
            "ttft_p90_ms": _spread([r["ttft_p90_ms"] for r in runs]),
            "added_ttft_p50_ms": _spread([added(r) for r in runs]),
            "cpu_s_per_1000": _spread([r["cpu_s_per_1000"] for r in runs]),
            "probe_added_ttft_p50_ms": _spread(
                [r["probe"]["added_ttft_p50_ms"] for r in runs if r.get("probe")]
            ),
            "hit_rate": {m: _spread([r["hit_rate"].get(m) for r in runs]) for m in models},
        }
    verdict: dict[str, Any] = {}
    own, shared = table.get("own"), table.get("shared")
    if own and shared:
        verdict["cpu_ratio"] = _ratio(shared["cpu_s_per_1000"]["mean"], own["cpu_s_per_1000"]["mean"])
        verdict["added_ttft_ratio"] = _ratio(
            shared["added_ttft_p50_ms"]["mean"], own["added_ttft_p50_ms"]["mean"]
        )
        # Medians over the repeats: one disturbed repeat on a shared host moves a mean, not a median.
        verdict["cpu_ratio_median"] = _ratio(
            shared["cpu_s_per_1000"]["median"], own["cpu_s_per_1000"]["median"]
        )
        verdict["added_ttft_ratio_median"] = _ratio(
            shared["added_ttft_p50_ms"]["median"], own["added_ttft_p50_ms"]["median"]
        )
        verdict["probe_added_ratio"] = _ratio(
            shared["probe_added_ttft_p50_ms"]["median"], own["probe_added_ttft_p50_ms"]["median"]
        )
        gaps = [
            abs(shared["hit_rate"][m]["mean"] - own["hit_rate"][m]["mean"]) * 100
            for m in own["hit_rate"]
            if m in shared["hit_rate"]
            and shared["hit_rate"][m]["mean"] is not None
            and own["hit_rate"][m]["mean"] is not None
        ]
        verdict["hit_rate_gap_points"] = max(gaps) if gaps else None
    return {"configs": table, "verdict": verdict}


def _spread(values: Sequence[float | None]) -> dict[str, Any]:
    return spread([v for v in values if v is not None])


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def markdown(summary: Mapping[str, Any], s: ManySettings) -> str:
    """The report's table and verdict (pure)."""

    lines = [
        f"# Many services: {s.services} services × {s.engines} simulated engines, one gateway or one each",
        "",
        f"{s.requests} streamed completions per run, closed loop at {s.concurrency}, {s.groups} shared "
        f"prefixes of {s.prefix_tokens} tokens per model, time scale {s.time_scale:g}, "
        f"{s.repeat} repeat(s).",
        "",
        "| configuration | errors | TTFT p50 ms | TTFT p90 ms | added TTFT p50 ms | gateway CPU s / 1,000 "
        "| prefix hit rate (models' mean) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for config, row in summary["configs"].items():
        rates = [v["mean"] for v in row["hit_rate"].values() if v["mean"] is not None]
        mean_rate = f"{100 * sum(rates) / len(rates):.1f}%" if rates else "–"
        added = spread_cell(row["added_ttft_p50_ms"], ".2f") if config != "direct" else "0"
        cpu = spread_cell(row["cpu_s_per_1000"], ".2f") if config != "direct" else "–"
        lines.append(
            f"| {config} | {row['errors']} | {spread_cell(row['ttft_p50_ms'], '.2f')} "
            f"| {spread_cell(row['ttft_p90_ms'], '.2f')} | {added} | {cpu} | {mean_rate} |"
        )
    v = summary["verdict"]
    if v:

        def num(x: float | None, fmt: str) -> str:
            return "–" if x is None else f"{x:{fmt}}"

        lines += [
            "",
            f"- gateway CPU per 1,000, shared ÷ own: **{num(v['cpu_ratio'], '.2f')}×** (means; medians "
            f"{num(v['cpu_ratio_median'], '.2f')}×; target ≤ 1.1)",
            f"- added TTFT p50, shared ÷ own: **{num(v['added_ttft_ratio'], '.2f')}×** (means; medians "
            f"{num(v['added_ttft_ratio_median'], '.2f')}×; target ≤ 1.1)",
            f"- added TTFT p50 at C = 1 (raw-socket probe, engine and gateway alternating), shared ÷ own: "
            f"**{num(v['probe_added_ratio'], '.2f')}×** (medians; "
            f"shared {spread_cell(summary['configs']['shared']['probe_added_ttft_p50_ms'], '.2f')} ms, "
            f"own {spread_cell(summary['configs']['own']['probe_added_ttft_p50_ms'], '.2f')} ms)",
            f"- largest per-model hit-rate gap: **{num(v['hit_rate_gap_points'], '.2f')} points** "
            "(target ≤ 2)",
        ]
    return "\n".join(lines) + "\n"


def run_many_services(s: ManySettings, *, tools: Tools, out_dir: Path, progress: Progress
                      ) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Every configuration, `s.repeat` times (module docstring); the rows and their summary."""
    work = workload(s)
    rows: list[dict[str, Any]] = []
    for repeat in range(s.repeat):
        order = ("direct", "own", "shared") if repeat % 2 == 0 else ("direct", "shared", "own")
        for config in order:
            run_dir = out_dir / "runs" / f"{config}-{repeat}"
            with _running(config, s, work=work, tools=tools, run_dir=run_dir, progress=progress) as stack:
                settings = DriverSettings(
                    base_url=stack.urls[0], model="", label=f"{config}-{repeat}",
                    max_concurrency=s.concurrency, request_timeout_s=s.request_timeout_s,
                    request_urls=stack.urls,
                )  # fmt: skip
                progress(f"[{config}] repeat {repeat + 1}/{s.repeat}: {len(work.requests)} requests")
                result, cpu, deltas = asyncio.run(_measure(stack, work, settings))
                probed = _probe(stack, s) if config != "direct" and s.probe_pairs else None
            row = run_row(config, repeat, result, cpu, deltas)
            row["probe"] = probed
            progress(
                f"[{config}] errors {row['errors']}, TTFT p50 {row['ttft_p50_ms'] or 0:.2f} ms, "
                f"CPU/1000 {row['cpu_s_per_1000'] or 0:.2f} s"
            )
            rows.append(row)
    return rows, summarize(rows)
