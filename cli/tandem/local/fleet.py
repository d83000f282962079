"""Pure planning of several InferenceServices behind one local gateway (`tandem up -f a.yaml -f b.yaml`).

Each service is planned as `build_plan` plans it alone (its own Redis, its own engines, in a state
folder of its own, `<state dir>/<service>/`), all with one run's credentials, and without its own
gateway: one gateway serves them all, reading a gateway file (`tandem.core.gateway.GatewayFile`,
`<state dir>/gateway.yaml`) that holds each service's router config and the gateway's spec (an
`InferenceGateway` document's, when one is given; else the defaults: no aliases, no auth). The
processes are named `<service>-<name>` (`qwen-decode-0`).

Since every service of a run shares the run's credentials, the gateway reads each service's pool
key, Redis password and engine key from the single-service variables (the gateway file's entries
name no variables of their own). Not planned yet: autoscaled pools (the local autoscaler follows
one service), which are refused.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from tandem.core.gateway import GatewayFile, GatewayService, InferenceGatewaySpec
from tandem.core.spec import InferenceService
from tandem.local.plan import LocalCredentials, LocalPlan, PlanError, build_plan
from tandem.local.state import Served

GATEWAY_FILE = "gateway.yaml"


def build_fleet_plan(
    services: Sequence[InferenceService],
    *,
    gateway: str,
    spec: InferenceGatewaySpec | None,
    ports: Iterator[int],
    router_port: int,
    python: str,
    redis_server: str | None,
    state_dir: Path,
    credentials: LocalCredentials,
    follow_catalogs: Collection[str] = (),
) -> tuple[LocalPlan, GatewayFile]:
    """The processes that run `services` here behind one gateway named `gateway` (module docstring),
    and the gateway's file. `follow_catalogs`: the services whose local catalog `tandem up` follows
    (`build_plan`'s `follow_catalog`). Raises
    `PlanError` for what cannot run so, `ValueError` (pydantic's) for names that cannot be served
    together."""
    names = [s.metadata.name for s in services]
    if len(set(names)) != len(names):
        raise PlanError(f"two InferenceServices are named {next(n for n in names if names.count(n) > 1)!r}")
    plans = []
    for isvc in services:
        scaling = isvc.spec.prefill.autoscaling.enabled or isvc.spec.decode.autoscaling.enabled
        if scaling:
            raise PlanError(
                f"{isvc.metadata.name}: autoscaling with several services behind one gateway is not "
                "supported by tandem up yet; set autoscaling.enabled: false, or run it alone"
            )
        plans.append(
            build_plan(
                isvc,
                ports=ports,
                router_port=router_port,
                python=python,
                redis_server=redis_server,
                state_dir=state_dir / isvc.metadata.name,
                credentials=credentials,
                follow_catalog=isvc.metadata.name in follow_catalogs,
            )
        )
    processes = []
    for isvc, plan in zip(services, plans, strict=True):
        folder = state_dir / isvc.metadata.name
        for process in plan.processes:
            if process.role != "router":
                named = f"{isvc.metadata.name}-{process.name}"
                processes.append(replace(process, name=named, dirs=(*process.dirs, folder)))
    file = GatewayFile(
        gateway=gateway,
        spec=spec or InferenceGatewaySpec(),
        services=[
            GatewayService(name=s.metadata.name, config=p.router_config)
            for s, p in zip(services, plans, strict=True)
        ],
    )
    path = state_dir / GATEWAY_FILE
    [router] = [p for p in plans[0].processes if p.role == "router"]
    argv = list(router.argv)
    argv[argv.index("--config") + 1] = str(path)
    processes.append(replace(router, argv=tuple(argv)))
    fleet = LocalPlan(
        processes=tuple(processes),
        router_config=plans[0].router_config,
        router_config_path=path,
        endpoint=plans[0].endpoint,
        model=plans[0].model,  # the example request's
    )
    return fleet, file


def served_table(file: GatewayFile) -> list[Served]:
    """Every name the gateway of `file` serves, in `/v1/models` order: each service's model, then each
    alias with its split in percent (`chat` → `qwen 80%, qwen-next 20%`)."""
    out = [Served(name=s.config.spec.model.public_name, serves=f"service {s.name}") for s in file.services]
    for alias in file.spec.aliases:
        total = sum(t.weight for t in alias.targets)
        split = ", ".join(f"{t.service} {100 * t.weight / total:.4g}%" for t in alias.targets if t.weight)
        out.append(Served(name=alias.name, serves=f"alias: {split}"))
    return out
