"""`tandem up -f FILE`: run one InferenceService on this machine, no cluster and no GPU needed.

Starts the KV pool (Redis), the prefill and decode pools (simulated engines) and the gateway as child
processes, shows progress, prints the endpoint and one ready line, and on Ctrl-C or SIGTERM stops every
child it started. When a pool has `autoscaling.enabled`, the autoscaler runs in this process (a thread,
`tandem.local.autoscaler`), starts and drains engines, and serves its metrics on `--autoscaler-port`.
Exit codes: 0 after a requested stop, 1 when a child fails, 2 for a bad spec.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import click
import yaml

from tandem.cli.documents import load_one
from tandem.core.spec import InferenceService
from tandem.local.autoscaler import LocalAutoscaler, write_initial_endpoints
from tandem.local.binaries import find_redis_server
from tandem.local.plan import LOOPBACK, LocalPlan, PlanError, build_plan
from tandem.local.supervisor import ChildFailed, Supervisor
from tandem.local.vllm_engine import local_connector

STARTUP_TIMEOUT = {"kvpool": 30.0, "prefill": 120.0, "decode": 120.0, "router": 60.0}
#: Real vLLM engines take 35-90 s to answer /health (more on a busy machine or without --enforce-eager).
VLLM_STARTUP_TIMEOUT = 900.0


class _StopRequested(Exception):
    """Raised from the signal handler so start-up and the watch loop unwind the same way."""


def _free_ports() -> Iterator[int]:
    while True:
        with socket.socket() as sock:
            sock.bind((LOOPBACK, 0))
            yield int(sock.getsockname()[1])


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((LOOPBACK, port)) == 0


def _say(message: str) -> None:
    click.echo(message, err=True)


def _start(plan: LocalPlan, supervisor: Supervisor) -> None:
    """Start the children stage by stage (pool, engines, gateway), waiting for each stage's health."""
    stages = [
        [p for p in plan.processes if p.role == "kvpool"],
        [p for p in plan.processes if p.role in ("prefill", "decode")],
        [p for p in plan.processes if p.role == "router"],
    ]
    total = len(plan.processes)
    done = 0
    for stage in stages:
        if stage and stage[0].role == "router":  # engines are ready: list them for file discovery
            write_initial_endpoints(plan, supervisor.children)
        children = [supervisor.start(p) for p in stage]
        for child in children:
            done += 1
            _say(f"[{done}/{total}] {child.plan.name:<10} {child.plan.url} starting ...")
            took = supervisor.wait_ready(child, timeout=_startup_timeout(plan, child.plan.role))
            _say(f"[{done}/{total}] {child.plan.name:<10} ready in {took:.1f}s")


def _startup_timeout(plan: LocalPlan, role: str) -> float:
    if role in ("prefill", "decode") and any(
        "vllm.entrypoints.openai.api_server" in p.argv for p in plan.processes
    ):
        return VLLM_STARTUP_TIMEOUT
    return STARTUP_TIMEOUT[role]


def _with_engine(isvc: InferenceService, kind: str | None) -> InferenceService:
    """`isvc` with `spec.engine.kind` replaced by `--engine` (when given)."""
    if kind is None:
        return isvc
    engine = isvc.spec.engine.model_copy(update={"kind": kind})
    return isvc.model_copy(update={"spec": isvc.spec.model_copy(update={"engine": engine})})


def _watch(supervisor: Supervisor) -> None:
    while True:
        dead = supervisor.first_dead()
        if dead is not None:
            raise ChildFailed(
                f"{dead.plan.name} exited with code {dead.process.returncode}; "
                f"its log ends with:\n{dead.log_tail()}"
            )
        time.sleep(0.5)


def _start_autoscaler(
    isvc: InferenceService, plan: LocalPlan, supervisor: Supervisor, *, port: int
) -> LocalAutoscaler:
    if _port_in_use(port):
        raise ChildFailed(f"autoscaler port {port} on {LOOPBACK} is in use; pick another (--autoscaler-port)")
    listed = write_initial_endpoints(plan, supervisor.children)
    assert listed is not None  # plan.endpoint_file is set
    autoscaler = LocalAutoscaler(
        isvc=isvc, plan=plan, supervisor=supervisor, listed=listed, metrics_port=port, say=_say,
    )  # fmt: skip
    click.echo(f"autoscaler: {autoscaler.start()}")
    return autoscaler


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested(signal.Signals(signum).name)


@click.command()
@click.option(
    "-f",
    "--file",
    "path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="YAML file with one InferenceService.",
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
    help="Where logs and generated config go [default: ./.tandem/<name>].",
)
@click.option(
    "--autoscaler-port",
    default=9090,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Port of the autoscaler's /metrics on 127.0.0.1 (when a pool has autoscaling.enabled).",
)
def up(path: Path, port: int, engine: str | None, state_dir: Path | None, autoscaler_port: int) -> None:
    """Run an InferenceService locally: Redis KV pool, prefill and decode engines, gateway."""
    isvc = _with_engine(load_one(path), engine)
    state_dir = state_dir or Path(".tandem") / isvc.metadata.name
    if _port_in_use(port):
        raise click.ClickException(f"port {port} on {LOOPBACK} is in use; pick another with --port")
    try:
        plan = build_plan(
            isvc, ports=_free_ports(), router_port=port, python=sys.executable,
            redis_server=find_redis_server(), state_dir=state_dir.resolve(),
        )  # fmt: skip
    except PlanError as exc:
        click.echo(f"tandem: error: {exc}", err=True)
        raise SystemExit(2) from None
    if isvc.spec.engine.kind == "vllm":
        _, note = local_connector(isvc)
        if note is not None:
            _say(note)
    state_dir.mkdir(parents=True, exist_ok=True)
    config = plan.router_config.model_dump(by_alias=True, mode="json", exclude_none=True)
    plan.router_config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    supervisor = Supervisor(log_dir=state_dir.resolve() / "logs")
    _say(f"starting {isvc.metadata.name}: logs in {state_dir / 'logs'}")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    code = 0
    autoscaler: LocalAutoscaler | None = None
    try:
        _start(plan, supervisor)
        if plan.endpoint_file is not None:
            autoscaler = _start_autoscaler(isvc, plan, supervisor, port=autoscaler_port)
        click.echo(f"endpoint: {plan.endpoint}")
        click.echo(f"ready: model '{plan.model}' is served at {plan.endpoint} (Ctrl-C to stop)")
        _watch(supervisor)
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
        _say("stopped: every child process has exited")
    raise SystemExit(code)
