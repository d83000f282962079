"""What a running `tandem up` leaves in its state directory for `tandem status` to read.

`<state dir>/state.json` holds the stack's name, model, endpoint, the pid of `tandem up`, every name
the gateway serves (one model, or each service's model and each alias of a gateway in front of
several) and every component with its URL, health URL and metrics URL. `tandem up` writes it as
children start (phase `starting`), again once the stack is ready (phase `ready`) and whenever the
autoscaler starts or stops an engine, and removes it after stopping every child. Writes are atomic
(a temporary file renamed over the old one), so a reader never sees half a file. A file whose pid no
longer runs is left over from a `tandem up` that was killed: `alive` tells the two apart.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from tandem.core.files import replace_text
from tandem.local.plan import LOOPBACK, LocalPlan, ProcessPlan
from tandem.local.supervisor import Child

STATE_FILE = "state.json"
Phase = Literal["starting", "ready"]
_ROLE_ORDER = {"kvpool": 0, "prefill": 1, "decode": 2, "router": 3, "autoscaler": 4}


class StateError(RuntimeError):
    """The state file is missing or unreadable (the message says which and where)."""


class Component(BaseModel):
    """One process of the stack. `health` is a full URL: `redis://...` means PING, else GET it."""

    model_config = ConfigDict(frozen=True)

    name: str
    role: str
    url: str
    pid: int | None
    health: str
    metrics: str | None


class Served(BaseModel):
    """One name clients may send in `model`, and what it reaches: a service, or an alias's split."""

    model_config = ConfigDict(frozen=True)

    name: str
    serves: str


class StackState(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    model: str
    endpoint: str
    pid: int
    phase: Phase
    state_dir: str
    components: tuple[Component, ...]
    #: Every served name (empty in a state file written before names were recorded).
    models: tuple[Served, ...] = ()


def stack_state(
    plan: LocalPlan,
    children: Sequence[Child],
    *,
    name: str,
    pid: int,
    phase: Phase,
    state_dir: Path,
    autoscaler_port: int | None = None,
    served: Sequence[Served] = (),
) -> StackState:
    """The stack as it stands: while starting, every planned process (pid None until it is started);
    once ready, the children the supervisor runs now (autoscaled engines come and go)."""
    pids = {c.plan.name: c.process.pid for c in children}
    processes = [c.plan for c in children]
    if phase == "starting":
        started = set(pids)
        processes += [p for p in plan.processes if p.name not in started]
    components = [_component(p, pids.get(p.name)) for p in processes]
    if autoscaler_port is not None:
        url = f"http://{LOOPBACK}:{autoscaler_port}"
        # The autoscaler's server answers /metrics (any path), there is no separate health route.
        components.append(
            Component(name="autoscaler", role="autoscaler", url=url, pid=pid,
                      health=f"{url}/metrics", metrics=f"{url}/metrics")
        )  # fmt: skip
    return StackState(
        name=name,
        model=plan.model,
        endpoint=plan.endpoint,
        pid=pid,
        phase=phase,
        state_dir=str(state_dir),
        components=tuple(sorted(components, key=_order)),
        models=tuple(served) or (Served(name=plan.model, serves=name),),
    )


def write_state(path: Path, state: StackState) -> None:
    """Replace `path` with `state` atomically."""
    replace_text(path, state.model_dump_json(indent=2) + "\n")


def read_state(path: Path) -> StackState:
    """The state in `path`; StateError when it is missing or not a state file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StateError(f"no {path}") from None
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return StackState.model_validate_json(text)
    except ValidationError as exc:
        raise StateError(f"{path} is not a tandem up state file ({exc.error_count()} errors)") from None


def remove_state(path: Path, *, pid: int) -> None:
    """Remove `path` if it is still the state of process `pid` (never another run's file)."""
    with contextlib.suppress(StateError):
        if read_state(path).pid == pid:
            path.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    """True while process `pid` exists (a pid reused after a crash reads as alive: rare, harmless)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _component(plan: ProcessPlan, pid: int | None) -> Component:
    if plan.probe == "redis":
        return Component(name=plan.name, role=plan.role, url=plan.url, pid=pid, health=plan.url, metrics=None)
    return Component(
        name=plan.name, role=plan.role, url=plan.url, pid=pid,
        health=f"{plan.url}/health", metrics=f"{plan.url}/metrics",
    )  # fmt: skip


def _order(component: Component) -> tuple[int, int, str]:
    number = re.search(r"(\d+)$", component.name)
    return (_ROLE_ORDER.get(component.role, 9), int(number.group(1)) if number else 0, component.name)
