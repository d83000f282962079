"""`tandem up -f FILE`: run one InferenceService on this machine, no cluster and no GPU needed.

With several services (`-f a.yaml -f b.yaml`, or one file of several documents, optionally with an
InferenceGateway: its aliases, tenants and limits), every service's pools run behind one gateway on
`--port`, routed by the body's `model` (`tandem.local.fleet`; docs/router.md, "Many models behind one
gateway").

Starts the KV pool (Redis), the prefill and decode pools (simulated engines) and the gateway as child
processes, shows progress (which engines it still waits for), prints a table of every component (URL,
health, metrics), a request to try, the endpoint and one ready line, and on Ctrl-C or SIGTERM stops
every child it started. `<state dir>/state.json` records the running stack for `tandem status`. When a
pool has `autoscaling.enabled`, the autoscaler runs in this process (a thread,
`tandem.local.autoscaler`), starts and drains engines, and serves its metrics on `--autoscaler-port`.
Exit codes: 0 after a requested stop, 1 when a child fails or the port or state directory is taken,
2 for a bad spec or one that cannot run here (a simulated engine's flag `tandem sim` lacks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

import click
import yaml

from tandem.cli.documents import load_one, read_documents
from tandem.cli.exits import fail
from tandem.cli.sim import sim as sim_command
from tandem.cli.status import render_table, status_rows
from tandem.cli.upadapters import CATALOG_EVERY_S, Followed, follow, followers, follows, link_adapters
from tandem.core.gateway import (
    GATEWAY_KIND,
    GatewayFile,
    InferenceGateway,
    InferenceGatewaySpec,
    parse_document,
)
from tandem.core.spec import InferenceService
from tandem.core.specrules import SpecInvalid
from tandem.core.tracing import TracingSpec
from tandem.kvpool.engine_config import POOL_KEY_ENV
from tandem.local.autoscaler import LocalAutoscaler, write_initial_endpoints
from tandem.local.binaries import find_redis_server
from tandem.local.fleet import build_fleet_plan, served_table
from tandem.local.plan import (
    CACHE_KEY_ENV,
    GATEWAY_ENGINE_KEY_ENV,
    LOOPBACK,
    LocalCredentials,
    LocalPlan,
    PlanError,
    Role,
    build_plan,
    local_preflight,
)
from tandem.local.ports import free_ports
from tandem.local.scrape import write_prometheus_config
from tandem.local.startup import start_stack
from tandem.local.state import (
    STATE_FILE,
    Phase,
    Served,
    StackState,
    StateError,
    alive,
    read_state,
    remove_state,
    stack_state,
    write_state,
)
from tandem.local.supervisor import ChildFailed, Supervisor

STARTUP_TIMEOUT = {"kvpool": 30.0, "prefill": 120.0, "decode": 120.0, "router": 60.0}
#: Real vLLM engines take 35-90 s to answer /health (more on a busy machine or without --enforce-eager).
VLLM_STARTUP_TIMEOUT = 900.0


class _StopRequested(Exception):
    """Raised from the signal handler so start-up and the watch loop unwind the same way."""


SIM_FLAGS = frozenset(opt for param in sim_command.params for opt in (*param.opts, *param.secondary_opts))


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((LOOPBACK, port)) == 0


def _say(message: str) -> None:
    click.echo(message, err=True)


class _Recorder:
    """Keeps `<state dir>/state.json` in step with the stack, for `tandem status`."""

    def __init__(
        self,
        isvc: InferenceService,
        plan: LocalPlan,
        supervisor: Supervisor,
        state_dir: Path,
        *,
        name: str | None = None,
    ):
        self._name = name or isvc.metadata.name
        self._plan = plan
        self._supervisor = supervisor
        self._state_dir = state_dir
        self.path = state_dir / STATE_FILE
        self.phase: Phase = "starting"
        self.autoscaler_port: int | None = None
        #: Every name the gateway serves (`served_table`); empty: the one service's model.
        self.served: tuple[Served, ...] = ()

    def save(self) -> StackState:
        state = stack_state(
            self._plan, list(self._supervisor.children), name=self._name, pid=os.getpid(),
            phase=self.phase, state_dir=self._state_dir, autoscaler_port=self.autoscaler_port,
            served=self.served,
        )  # fmt: skip
        write_state(self.path, state)
        return state

    def save_quietly(self) -> None:
        """`save` from the autoscaler's thread: a failed write must not stop its round."""
        with contextlib.suppress(OSError):
            self.save()

    def remove(self) -> None:
        remove_state(self.path, pid=os.getpid())


def _refuse_second_run(state_dir: Path) -> None:
    """One `tandem up` per state directory: a second would share its logs, config and Redis dir."""
    with contextlib.suppress(StateError):
        running = read_state(state_dir / STATE_FILE)
        if running.pid != os.getpid() and alive(running.pid):
            fail(
                f"{running.name} already runs from {state_dir} (tandem up pid {running.pid}, "
                f"{running.endpoint}); stop it first, or pass another --state-dir",
                code=1,
            )


def startup_timeout(isvc: InferenceService, role: Role) -> float:
    """Seconds a process of `role` may take to become ready: a vLLM engine's (loading a model, compiling)
    for both pools when the engine is vLLM, whether `tandem up` starts it or the autoscaler does."""
    if role in ("prefill", "decode") and isvc.spec.engine.kind == "vllm":
        return VLLM_STARTUP_TIMEOUT
    return STARTUP_TIMEOUT[role]


def _with_engine(isvc: InferenceService, kind: str | None) -> InferenceService:
    """`isvc` with `spec.engine.kind` replaced by `--engine` (when given)."""
    if kind is None:
        return isvc
    engine = isvc.spec.engine.model_copy(update={"kind": kind})
    return isvc.model_copy(update={"spec": isvc.spec.model_copy(update={"engine": engine})})


def _watch(supervisor: Supervisor, followers: Sequence[Followed] = ()) -> None:
    """Until a child dies: its failure raised; meanwhile the local catalogs followed."""
    next_pass = time.monotonic() + CATALOG_EVERY_S
    while True:
        dead = supervisor.first_dead()
        if dead is not None:
            raise ChildFailed(
                f"{dead.plan.name} exited with code {dead.process.returncode}; "
                f"its log ends with:\n{dead.log_tail()}"
            )
        if followers and time.monotonic() >= next_pass:
            next_pass = time.monotonic() + CATALOG_EVERY_S
            for service, follower in followers:
                follow(service, follower)
        time.sleep(0.5)


def _start_autoscaler(
    isvc: InferenceService, plan: LocalPlan, supervisor: Supervisor, recorder: _Recorder, *, port: int
) -> LocalAutoscaler:
    if _port_in_use(port):
        raise ChildFailed(f"autoscaler port {port} on {LOOPBACK} is in use; pick another (--autoscaler-port)")
    listed = write_initial_endpoints(plan, supervisor.children)
    assert listed is not None  # plan.endpoint_file is set

    def say(message: str) -> None:  # every message follows an engine started, ready or stopped
        _say(message)
        recorder.save_quietly()

    autoscaler = LocalAutoscaler(
        isvc=isvc, plan=plan, supervisor=supervisor, listed=listed, metrics_port=port, say=say,
        startup_timeout_s=lambda pool: startup_timeout(isvc, pool),  # vLLM: 900 s, as at launch
    )  # fmt: skip
    click.echo(f"autoscaler: {autoscaler.start()}")
    recorder.autoscaler_port = port
    return autoscaler


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested(signal.Signals(signum).name)


def _summary(isvc: InferenceService, state: StackState, *, status_command: str) -> list[str]:
    """What a person needs once the stack is ready: every component, how to look again, a request."""
    body = {"model": state.model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}
    lines = [
        *render_table(status_rows(state)),
        f"status again: {status_command}",
        f"try it: curl -s {state.endpoint}/chat/completions -H 'content-type: application/json' "
        f"-d '{json.dumps(body)}'",
    ]
    if isvc.spec.engine.kind == "sim":
        lines.append(
            f"(simulated engines compute no model: answers are random words, timed like "
            f"{isvc.spec.engine.sim.profile}; see docs/sim.md)"
        )
    return lines


def _status_command(isvc: InferenceService, state_dir: Path) -> str:
    if state_dir == Path(".tandem") / isvc.metadata.name:
        return "tandem status"
    return f"tandem status --state-dir {state_dir}"


def _run(
    isvc: InferenceService,
    plan: LocalPlan,
    *,
    state_dir: Path,
    autoscaler_port: int,
    fleet: GatewayFile | None = None,
    followers: Sequence[Followed] = (),
) -> int:
    """Start the stack, watch it until a signal or a failure, stop it; returns the exit code.
    `fleet`: several services behind one gateway (`isvc` is the first); `followers`: the local
    catalogs followed while it runs."""
    supervisor = Supervisor(log_dir=state_dir.resolve() / "logs")
    recorder = _Recorder(isvc, plan, supervisor, state_dir.resolve(), name=fleet.gateway if fleet else None)
    if fleet is not None:
        recorder.served = tuple(served_table(fleet))
    _say(f"starting {fleet.gateway if fleet else isvc.metadata.name}: logs in {state_dir / 'logs'}")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    code = 0
    autoscaler: LocalAutoscaler | None = None
    try:
        recorder.save()
        start_stack(
            plan, supervisor, timeout_for=lambda role: startup_timeout(isvc, role), say=_say,
            on_started=recorder.save,
        )  # fmt: skip
        if plan.endpoint_file is not None:
            autoscaler = _start_autoscaler(isvc, plan, supervisor, recorder, port=autoscaler_port)
        recorder.phase = "ready"
        for line in _summary(isvc, recorder.save(), status_command=_status_command(isvc, state_dir)):
            click.echo(line)
        click.echo(f"endpoint: {plan.endpoint}")
        click.echo(f"ready: {_served(plan, fleet)} at {plan.endpoint} (Ctrl-C to stop)")
        _watch(supervisor, followers)
    except _StopRequested as stop:
        _say(f"{stop}: stopping")
    except ChildFailed as exc:
        click.echo(f"tandem: error: {exc}", err=True)
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if autoscaler is not None:
            autoscaler.stop()
        supervisor.stop_all()
        recorder.remove()
        _say("stopped: every child process has exited")
    return code


def _served(plan: LocalPlan, fleet: GatewayFile | None) -> str:
    """What the ready line says is served: the model, or every model and alias of the gateway."""
    if fleet is None:
        return f"model '{plan.model}' is served"
    models = ", ".join(f"'{s.config.spec.model.public_name}'" for s in fleet.services)
    aliases = ", ".join(f"'{a.name}'" for a in fleet.spec.aliases)
    return f"models {models}" + (f" and aliases {aliases}" if aliases else "") + " are served"


def _credentials(environ: Mapping[str, str]) -> LocalCredentials:
    """This run's Redis password, engine key and cache keys, drawn at random; the engine key, the pool
    key and the salt key are the environment's `TANDEM_ENGINE_API_KEY`, `TANDEM_KV_POOL_KEY` and
    `TANDEM_CACHE_KEY` when set (to call the engines directly or compute the pool's keys: tests,
    debugging)."""
    drawn = LocalCredentials.generate()
    given = {
        "engine_api_key": environ.get(GATEWAY_ENGINE_KEY_ENV),
        "pool_key": environ.get(POOL_KEY_ENV),
        "cache_key": environ.get(CACHE_KEY_ENV),
    }
    return dataclasses.replace(drawn, **{name: value for name, value in given.items() if value})


@click.command()
@click.option(
    "-f",
    "--file",
    "paths",
    required=True,
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="YAML file with one InferenceService; several files (or documents), and optionally one "
    "InferenceGateway: every service behind one gateway.",
)
@click.option(
    "--port",
    default=8080,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Port of the OpenAI endpoint on 127.0.0.1.",
)
@click.option(
    "--engine",
    type=click.Choice(["sim", "vllm"]),
    help="Override spec.engine.kind: sim (Tandem's simulator) or vllm (real vLLM; run from .venv-vllm).",
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where logs, generated config and state.json (read by `tandem status`) go "
    "[default: ./.tandem/<name>].",
)
@click.option(
    "--autoscaler-port",
    default=9090,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Port of the autoscaler's /metrics on 127.0.0.1 (when a pool has autoscaling.enabled).",
)
@click.option(
    "--trace",
    is_flag=True,
    help="Trace every request (the gateway and simulated engines write spans to <state dir>/traces; "
    "`tandem trace REQUEST_ID` prints one), unless the spec's tracing says otherwise.",
)
def up(
    paths: tuple[Path, ...],
    port: int,
    engine: str | None,
    state_dir: Path | None,
    autoscaler_port: int,
    trace: bool,
) -> None:
    """Run an InferenceService locally: Redis KV pool, prefill and decode engines, gateway."""
    documents = [doc for path in paths for doc in read_documents(path)]
    if len(documents) > 1 or documents[0].get("kind") == GATEWAY_KIND:
        _up_fleet(
            paths, port=port, engine=engine, state_dir=state_dir, autoscaler_port=autoscaler_port, trace=trace
        )
        return
    isvc = _with_engine(load_one(paths[0]), engine)
    state_dir = state_dir or Path(".tandem") / isvc.metadata.name
    if trace:
        isvc = with_trace_file(isvc, state_dir)
    _refuse_second_run(state_dir)
    if _port_in_use(port):
        fail(f"port {port} on {LOOPBACK} is in use; pick another with --port", code=1)
    try:
        plan = build_plan(
            isvc, ports=free_ports(), router_port=port, python=sys.executable,
            redis_server=find_redis_server(), state_dir=state_dir.resolve(),
            credentials=_credentials(os.environ), follow_catalog=follows(isvc, paths[0].parent),
        )  # fmt: skip
        notes = local_preflight(isvc, sim_flags=SIM_FLAGS)
    except PlanError as exc:
        fail(str(exc), code=2)
    for note in notes:
        _say(note)
    state_dir.mkdir(parents=True, exist_ok=True)
    link_adapters(isvc, base=paths[0].parent, state_dir=state_dir)
    followed = followers([(isvc, paths[0].parent)], state_dir=state_dir, fleet=False)
    config = plan.router_config.model_dump(by_alias=True, mode="json", exclude_none=True)
    plan.router_config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    write_prometheus_config(state_dir / "prometheus.yml", plan, autoscaler_port=autoscaler_port)
    raise SystemExit(
        _run(isvc, plan, state_dir=state_dir, autoscaler_port=autoscaler_port, followers=followed)
    )


def _up_fleet(
    paths: tuple[Path, ...],
    *,
    port: int,
    engine: str | None,
    state_dir: Path | None,
    autoscaler_port: int,
    trace: bool = False,
) -> None:
    """`up` for several services behind one gateway (module docstring)."""
    services, gateway, bases = _load_fleet(paths)
    services = [_with_engine(s, engine) for s in services]
    name = gateway.metadata.name if gateway is not None else "gateway"
    state_dir = state_dir or Path(".tandem") / name
    gateway_spec = gateway.spec if gateway is not None else None
    if trace:
        services = [with_trace_file(s, state_dir) for s in services]
        gateway_spec = gateway_spec or InferenceGatewaySpec()
        if gateway_spec.tracing is None:
            gateway_spec = gateway_spec.model_copy(update={"tracing": trace_file_spec(state_dir)})
    _refuse_second_run(state_dir)
    if _port_in_use(port):
        fail(f"port {port} on {LOOPBACK} is in use; pick another with --port", code=1)
    try:
        plan, file = build_fleet_plan(
            services, gateway=name, spec=gateway_spec, ports=free_ports(),
            router_port=port, python=sys.executable, redis_server=find_redis_server(),
            state_dir=state_dir.resolve(), credentials=_credentials(os.environ),
            follow_catalogs={s.metadata.name for s in services if follows(s, bases[s.metadata.name])},
        )  # fmt: skip
        notes = [note for isvc in services for note in local_preflight(isvc, sim_flags=SIM_FLAGS)]
    except (PlanError, ValueError) as exc:
        fail(str(exc).replace("\n", " "), code=2)
    for note in notes:
        _say(note)
    state_dir.mkdir(parents=True, exist_ok=True)
    for isvc in services:
        link_adapters(isvc, base=bases[isvc.metadata.name], state_dir=state_dir / isvc.metadata.name)
    followed = followers([(s, bases[s.metadata.name]) for s in services], state_dir=state_dir, fleet=True)
    content = file.model_dump(by_alias=True, mode="json", exclude_none=True)
    plan.router_config_path.write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
    raise SystemExit(
        _run(
            services[0],
            plan,
            state_dir=state_dir,
            autoscaler_port=autoscaler_port,
            fleet=file,
            followers=followed,
        )
    )


def trace_file_spec(state_dir: Path) -> TracingSpec:
    """`--trace`: every request traced, spans in `<state dir>/traces` (`tandem trace` reads them)."""
    return TracingSpec(endpoint=f"file://{(state_dir / 'traces').resolve()}", sampling_ratio=1.0)


def with_trace_file(isvc: InferenceService, state_dir: Path) -> InferenceService:
    """`isvc` traced to `<state dir>/traces` (`trace_file_spec`), unless its spec says where already."""
    if isvc.spec.tracing is not None:
        return isvc
    spec = isvc.spec.model_copy(update={"tracing": trace_file_spec(state_dir)})
    return isvc.model_copy(update={"spec": spec})


def _load_fleet(
    paths: tuple[Path, ...],
) -> tuple[list[InferenceService], InferenceGateway | None, dict[str, Path]]:
    """Every InferenceService and the one InferenceGateway (if any) in `paths`, and each service's
    file's folder (where its local adapter paths start); exits 2 naming the file and the field of the
    first invalid document."""
    services: list[InferenceService] = []
    gateways: list[InferenceGateway] = []
    bases: dict[str, Path] = {}
    for path in paths:
        for doc in read_documents(path):
            try:
                parsed = parse_document(doc)
            except SpecInvalid as exc:
                fail(f"{path} is not a valid {doc.get('kind', 'InferenceService')}: {exc.errors[0]}", code=2)
            if isinstance(parsed, InferenceGateway):
                gateways.append(parsed)
            else:
                services.append(parsed)
                bases.setdefault(parsed.metadata.name, path.parent)
    if len(gateways) > 1:
        fail("at most one InferenceGateway may be given", code=2)
    if not services:
        fail("no InferenceService given: the gateway would serve nothing", code=2)
    if not gateways:
        return services, None, bases
    gateway = gateways[0]
    for isvc in services:
        labels = (isvc.metadata.model_extra or {}).get("labels") or {}
        if not gateway.spec.selector.matches(labels):
            fail(
                f"InferenceService {isvc.metadata.name} is not selected by InferenceGateway "
                f"{gateway.metadata.name} (spec.selector.matchLabels); label it, or run it alone",
                code=2,
            )
    return services, gateway, bases
