"""The harness: simulated engine pools that `tandem bench` owns, and one run per target in front of them.

For each target (a Tandem policy, a peer router, or `direct`) the harness
1. builds an InferenceService in memory (`tandem.bench.pool.bench_service`: `engine.kind: sim`, N
   decode engines, disaggregation off; with `pd`, prefill engines too and `mode: always`) and plans
   its processes with the local runtime (`tandem.local.plan.build_plan`: Redis KV pool, engines,
   gateway);
2. starts Redis and the engines and waits for their health, then the target's gateway (`tandem
   router` with `spec.router.policy` = the policy and a variant's own arguments after the
   `--router-arg`s, or vllm-router, or a `--peer-command`'s command
   line, or none for `direct`, which runs one engine) and waits for it to answer `GET /health`.
   A Tandem target with `replicas` N > 1 is N `tandem router` processes on N ports, the same config
   (its KV pool URL included, so they share their fair-queue counters through that Redis) and
   `--replicas N` before the `--router-arg`s (so an explicit `--replicas` there wins);
3. scrapes every engine's `/metrics` (and every Tandem replica's, `tandem.bench.gateways`), drives
   the workload through the gateway (over the replicas: request i to replica i mod N, as
   `DriverSettings.url_for` says), scrapes again, and reads the gateway's CPU time (the process
   trees of all its replicas, `tandem.bench.cpu`) just before and just after;
4. stops every child (process groups, SIGTERM then SIGKILL) whatever happened.

So every target sees the same engines (same profile, count, flags, time scale and seed) started
cold: the prefix caches and the KV pool are empty at the start of each run. Restarting is the
simplest honest reset; it costs a few seconds per target. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import yaml

from tandem.bench.adapters import write_adapter_folder
from tandem.bench.command_peer import Wiring, fill
from tandem.bench.counters import EngineCounters
from tandem.bench.cpu import cpu_per_1000, trees_cpu_seconds
from tandem.bench.driver import DriverSettings, drive
from tandem.bench.engines import scrape_all
from tandem.bench.gateways import replica_report, scrape_gateways
from tandem.bench.pool import PoolSettings as PoolSettings  # re-exported: imported from here
from tandem.bench.pool import Tools as Tools  # re-exported: imported from here
from tandem.bench.pool import bench_credentials, bench_service
from tandem.bench.records import DriveResult
from tandem.bench.report import RunData
from tandem.bench.targets import VLLM_ROUTER_INSTALL, Target, vllm_router_argv
from tandem.bench.workloads import Workload
from tandem.core.engineargs import without_flag
from tandem.local.plan import LocalPlan, ProcessPlan, adapter_folder, build_plan
from tandem.local.ports import free_ports
from tandem.local.supervisor import Child, ChildFailed, Supervisor

Progress = Callable[[str], None]
STARTUP_TIMEOUT_S = {"kvpool": 30.0, "prefill": 120.0, "decode": 120.0, "router": 60.0}


class HarnessError(RuntimeError):
    """The harness cannot run a target (a missing binary, a child that failed to start)."""


@dataclass
class Started:
    """A target's processes, running: the URLs to send to (one per gateway replica; the engine's for
    `direct`), the engines to scrape, the model name, the Tandem replicas whose `/metrics` to scrape
    (none for peers and `direct`), and notes about children that died (filled in when the context
    ends)."""

    base_urls: tuple[str, ...]
    engines: list[str]
    model: str
    children: list[Child]
    notes: list[str]
    tandem_gateways: tuple[str, ...] = ()
    #: Stops the gateway's processes and starts them again, fresh, in front of the same engines.
    restart_gateways: Callable[[], None] = lambda: None

    @property
    def base_url(self) -> str:
        """The first (usually the only) URL to send to."""
        return self.base_urls[0]

    @property
    def engine_pools(self) -> dict[str, str]:
        """Each engine's pool ("prefill" or "decode") by its URL."""
        return {c.plan.url: c.plan.role for c in self.children if c.plan.role in ("prefill", "decode")}

    @property
    def gateway_pids(self) -> tuple[int, ...]:
        """The pids of the gateway's processes (role "router"), one per replica; none for `direct`."""
        return tuple(c.process.pid for c in self.children if c.plan.role == "router")

    def gateway_cpu_s(self) -> float | None:
        """CPU seconds the gateway's process trees (every replica's) have used so far; None without a
        gateway, or when a replica is gone."""
        pids = self.gateway_pids
        return trees_cpu_seconds(pids) if pids else None


@contextlib.contextmanager
def started(
    target: Target, *, pool: PoolSettings, tools: Tools, state_dir: Path, progress: Progress
) -> Iterator[Started]:
    """Start the pool and the target's gateway (module doc, steps 1-2), and stop every child when the
    block ends, whatever happened (step 4)."""
    run_dir = state_dir / target.label.replace(":", "-")
    policy = target.policy if target.kind == "tandem" and target.policy else "round-robin"
    router_args = (*pool.router_args, *target.router_args) if target.kind == "tandem" else ()
    isvc = bench_service(
        pool, policy=policy, direct=target.kind == "direct", prefix_source=_prefix_source(router_args)
    )
    ports = free_ports()
    credentials = bench_credentials()
    plan = build_plan(
        isvc, ports=ports, router_port=next(ports), python=tools.python,
        redis_server=tools.redis_server, state_dir=run_dir.resolve(), credentials=credentials,
        catalog_adapters=pool.adapters,
    )  # fmt: skip
    adapter_dir = adapter_folder(isvc, run_dir.resolve())
    if adapter_dir is not None:
        write_adapter_folder(adapter_dir, pool.adapters, base_model=pool.model, rank=pool.adapter_rank)
    gateways = _gateways(
        target, plan=plan, tools=tools, ports=ports, router_args=pool.router_args,
        declare_capacity=pool.declare_capacity,
    )  # fmt: skip
    supervisor = Supervisor(log_dir=run_dir.resolve() / "logs")
    children: list[Child] = []
    try:
        try:
            _start(
                target, plan=plan, gateways=gateways, supervisor=supervisor, started=children,
                progress=progress,
            )  # fmt: skip
        except ChildFailed as exc:
            raise HarnessError(f"[{target.label}] {exc}") from None
        except OSError as exc:  # a program that cannot be executed (a --peer-command's, most likely)
            raise HarnessError(f"[{target.label}] cannot start a process: {exc}") from None
        engines = [p.url for p in plan.processes if p.role in ("prefill", "decode")]
        decode = [p.url for p in plan.processes if p.role == "decode"]
        urls = tuple(f"{base}/v1" for base in [g.url for g in gateways] or decode[:1])
        tandem = urls if target.kind == "tandem" else ()

        def restart_gateways() -> None:
            for child in [c for c in children if c.plan.role == "router"]:
                supervisor.stop(child)
                children.remove(child)
                child.log_path.replace(child.log_path.with_suffix(".warmup.log"))  # the next one's is fresh
            try:
                _start_stage(
                    target, list(gateways), supervisor=supervisor, started=children, progress=progress
                )
            except ChildFailed as exc:
                raise HarnessError(f"[{target.label}] {exc}") from None

        running = Started(urls, engines, plan.model, children, [], tandem, restart_gateways)
        yield running
        dead = supervisor.first_dead()
        if dead is not None:
            running.notes.append(
                f"{dead.plan.name} exited with code {dead.process.returncode} during the run"
            )
    finally:
        supervisor.stop_all()
        progress(f"[{target.label}] stopped {len(children)} processes")


def run_target(
    target: Target,
    *,
    workload: Workload,
    pool: PoolSettings,
    tools: Tools,
    driver: DriverSettings,
    state_dir: Path,
    progress: Progress,
) -> RunData:
    """Start the pool and the target's gateway, run the workload, stop everything (module doc)."""
    with started(target, pool=pool, tools=tools, state_dir=state_dir, progress=progress) as run:
        settings = replace(
            driver, base_url=run.base_url, base_urls=run.base_urls, model=run.model, label=target.label
        )
        if target.start != "cold":
            _warm_up(run, target, workload=workload, settings=settings, requests=pool.warmup_requests,
                     progress=progress)  # fmt: skip
        spread = f" (request i to replica i mod {len(run.base_urls)})" if len(run.base_urls) > 1 else ""
        against = " and ".join(run.base_urls) + spread
        progress(f"[{target.label}] running {len(workload.requests)} requests against {against}")
        measured = asyncio.run(_measure_run(run, workload, settings, progress=progress))
    children = [_child_info(c) for c in run.children]
    sent = sum(r.start_s is not None for r in measured.result.records)
    gateway = (
        cpu_per_1000(measured.cpu_before, measured.cpu_after, requests=sent) if run.gateway_pids else None
    )
    return RunData(
        target.label, target.describe(), measured.result, measured.before, measured.after, children,
        tuple(run.notes), gateway=gateway, replicas=measured.replicas,
    )  # fmt: skip


def _warm_up(
    run: Started,
    target: Target,
    *,
    workload: Workload,
    settings: DriverSettings,
    requests: int,
    progress: Progress,
) -> None:
    """The warm-up of a `restarted` or `warm` start: the workload's first `requests` requests through
    the gateway, at their own times, unrecorded; then, for `restarted`, a fresh gateway."""
    warm = replace(workload, requests=workload.requests[:requests])
    progress(f"[{target.label}] warm-up: {len(warm.requests)} requests through the gateway")
    result = asyncio.run(drive(warm, settings, progress=progress))
    failed = sum(not r.ok for r in result.records)
    if failed:
        run.notes.append(f"warm-up: {failed} of {len(warm.requests)} requests failed")
    if target.start == "restarted":
        progress(f"[{target.label}] restarting the gateway in front of the warm engines")
        run.restart_gateways()


@dataclass(frozen=True)
class _Measured:
    """What `_measure_run` read: the driver's result, the engines' counters before and after, the
    gateway's CPU seconds before and after, and the Tandem replicas' `replica_report`."""

    result: DriveResult
    before: Counters
    after: Counters
    cpu_before: float | None
    cpu_after: float | None
    replicas: list[dict[str, Any]]


async def _measure_run(
    run: Started, workload: Workload, settings: DriverSettings, *, progress: Progress
) -> _Measured:
    """Scrape the Tandem replicas, read the gateway's CPU, `measure`, read the CPU again, scrape the
    replicas again: the CPU window holds the workload and the engines' scrapes, not the replicas'."""
    async with httpx.AsyncClient(trust_env=False) as client:
        first = await scrape_gateways(client, run.tandem_gateways)
        cpu_before = run.gateway_cpu_s()
        result, before, after = await measure(workload, settings, engines=run.engines, progress=progress)
        cpu_after = run.gateway_cpu_s()
        last = await scrape_gateways(client, run.tandem_gateways)
    replicas = replica_report(run.tandem_gateways, first, last)
    return _Measured(result, before, after, cpu_before, cpu_after, replicas)


def _prefix_source(router_args: Sequence[str]) -> str:
    """`precise` when the gateway's flags ask for it (`--prefix-source precise`): its engines then
    publish KV events; else `approximate`."""
    args = list(router_args)
    for index, arg in enumerate(args):
        following = args[index + 1 : index + 2]
        if arg == "--prefix-source=precise" or (arg == "--prefix-source" and following == ["precise"]):
            return "precise"
    return "approximate"


def _gateways(
    target: Target,
    *,
    plan: LocalPlan,
    tools: Tools,
    ports: Iterator[int],
    router_args: tuple[str, ...],
    declare_capacity: bool = False,
) -> list[ProcessPlan]:
    """The target's gateway processes: none for `direct`, `target.replicas` for Tandem's gateway
    (`tandem_replicas`, which writes its config file, without the engines' `--max-num-seqs` unless
    `declare_capacity`), one for a peer. `ports` gives the ports beyond the plan's router port (a
    peer's metrics port, more replicas)."""
    router = next(p for p in plan.processes if p.role == "router")
    if target.kind == "direct":
        return []
    if target.kind == "tandem":
        plan.router_config_path.parent.mkdir(parents=True, exist_ok=True)
        config = plan.router_config.model_dump(by_alias=True, mode="json", exclude_none=True)
        if not declare_capacity:
            engine = config["spec"]["engine"]
            engine["args"] = without_flag(engine.get("args", []), "--max-num-seqs")
        plan.router_config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        extra = (*router_args, *target.router_args)
        more = [next(ports) for _ in range(target.replicas - 1)]
        return tandem_replicas(router, ports=(router.port, *more), extra_args=extra)
    metrics_port = next(ports)
    decode = tuple(p.url for p in plan.processes if p.role == "decode")
    prefill = tuple(p.url for p in plan.processes if p.role == "prefill")
    if target.kind == "command" and target.peer is not None:
        wiring = Wiring(port=router.port, metrics_port=metrics_port, model=plan.model, decode=decode,
                        prefill=prefill)  # fmt: skip
        argv = fill(target.peer.argv, wiring)
        # Loopback without a proxy, whatever the environment says (the engines are on 127.0.0.1).
        env = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        return [
            ProcessPlan(name=f"peer-{target.label}", role="router", argv=argv, port=router.port, probe="http",
                        env=env)
        ]  # fmt: skip
    if tools.vllm_router is None:
        raise HarnessError(f"--peer {target.label} needs the vllm-router binary: {VLLM_ROUTER_INSTALL}")
    argv = vllm_router_argv(
        tools.vllm_router, port=router.port, metrics_port=metrics_port, policy=str(target.policy),
        decode=decode, prefill=prefill,
    )  # fmt: skip
    return [ProcessPlan(name="vllm-router", role="router", argv=argv, port=router.port, probe="http")]


def tandem_replicas(
    router: ProcessPlan, *, ports: Sequence[int], extra_args: Sequence[str] = ()
) -> list[ProcessPlan]:
    """Tandem's gateway as `len(ports)` replicas of the planned `router` process (pure): the same argv
    with its `--port` set to each port, then `--replicas N` when N > 1 (each takes 1/N of every engine's
    capacity), then `extra_args` (the `--router-arg`s and a variant's own, so they win). One replica is
    the planned process with `extra_args`, named `router`; N are `router-0` ... `router-{N-1}`.

    Example: ports (8080, 8081) → `... --port 8080 --replicas 2` and `... --port 8081 --replicas 2`.
    """
    argv = list(router.argv)
    if "--port" not in argv[:-1]:
        raise HarnessError(f"the planned gateway's command line has no --port: {' '.join(argv)}")
    at = argv.index("--port") + 1
    count = len(ports)
    replicas = []
    for index, port in enumerate(ports):
        argv[at] = str(port)
        flags = ("--replicas", str(count)) if count > 1 else ()
        name = router.name if count == 1 else f"{router.name}-{index}"
        replicas.append(dataclasses.replace(router, name=name, argv=(*argv, *flags, *extra_args), port=port))
    return replicas


def _start(
    target: Target,
    *,
    plan: LocalPlan,
    gateways: Sequence[ProcessPlan],
    supervisor: Supervisor,
    started: list[Child],
    progress: Progress,
) -> None:
    """Start Redis, then every engine at once, then the gateway's replicas at once, waiting for each
    stage's health."""
    stages = [
        [p for p in plan.processes if p.role == "kvpool"],
        [p for p in plan.processes if p.role in ("prefill", "decode")],
        list(gateways),
    ]
    for stage in stages:
        _start_stage(target, stage, supervisor=supervisor, started=started, progress=progress)


def _start_stage(
    target: Target,
    stage: Sequence[ProcessPlan],
    *,
    supervisor: Supervisor,
    started: list[Child],
    progress: Progress,
) -> None:
    """Start `stage`'s processes at once and wait for each one's health."""
    children = [supervisor.start(p) for p in stage]
    started.extend(children)
    for child in children:
        took = supervisor.wait_ready(child, timeout=STARTUP_TIMEOUT_S[child.plan.role])
        progress(f"[{target.label}] {child.plan.name:<11} {child.plan.url} ready in {took:.1f}s")


Counters = dict[str, EngineCounters | str]


async def measure(
    workload: Workload, settings: DriverSettings, *, engines: list[str], progress: Progress
) -> tuple[DriveResult, Counters, Counters]:
    """Scrape the engines, drive the workload, scrape again."""
    async with httpx.AsyncClient(trust_env=False) as client:
        before = await scrape_all(client, engines)
        result = await drive(workload, settings, progress=progress)
        after = await scrape_all(client, engines)
    return result, before, after


def _child_info(child: Child) -> dict[str, Any]:
    return {
        "name": child.plan.name,
        "role": child.plan.role,
        "url": child.plan.url,
        "pid": child.process.pid,
        "returncode": child.process.returncode,
        "log": str(child.log_path),
        "argv": list(child.plan.argv),
    }
