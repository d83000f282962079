"""`tandem status`: what a local `tandem up` runs, where, and whether each part answers.

Reads `<state dir>/state.json` (written by `tandem up`, `tandem.local.state`), prints every name the
gateway serves (each service's model and each alias, with its split, when one gateway serves several
services), and probes every
component on 127.0.0.1: Redis with PING, engines and the gateway with GET /health, the autoscaler
with GET /metrics. Prints one row per component (pid, URL, health, metrics endpoint), or JSON.
Exit codes: 0 when the stack is ready and every component answers; 1 when nothing runs, it is still
starting, or a component is down (one line on stderr says which); 2 when the state directory is
ambiguous (several stacks run here: pick one with -f or --state-dir).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from tandem.cli.documents import load_one
from tandem.cli.exits import fail
from tandem.local.health import Health, check
from tandem.local.state import STATE_FILE, Component, StackState, StateError, alive, read_state

Check = Callable[[str], Health]
#: Where `tandem up` keeps its state unless `--state-dir` says otherwise: `.tandem/<name>`.
DEFAULT_ROOT = Path(".tandem")


def status_rows(state: StackState, probe: Check = check) -> list[tuple[Component, Health | None]]:
    """Every component with the outcome of its health check (None: not started yet, not probed)."""
    return [(c, probe(c.health) if c.pid is not None else None) for c in state.components]


def render_header(state: StackState) -> list[str]:
    """The first lines: the stack and, behind a gateway of several services, every name it serves."""
    if len(state.models) <= 1:
        return [f"{state.name}: {state.phase}, model '{state.model}' at {state.endpoint}"]
    lines = [f"{state.name}: {state.phase}, {len(state.models)} models at {state.endpoint}"]
    width = max(len(m.name) for m in state.models)
    lines += [f"  {m.name.ljust(width)}  {m.serves}" for m in state.models]
    return lines


def render_table(rows: Sequence[tuple[Component, Health | None]]) -> list[str]:
    """The rows as aligned text lines, a header first."""
    table = [("component", "pid", "url", "health", "metrics")]
    for component, health in rows:
        table.append(
            (
                component.name,
                str(component.pid) if component.pid is not None else "-",
                component.url,
                _health_text(component, health),
                component.metrics or f"tandem kvpool stats --url {component.url}",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]


def problems(state: StackState, rows: Sequence[tuple[Component, Health | None]]) -> str | None:
    """One line saying what is wrong, or None when the stack is ready and every component is up."""
    waiting = [c.name for c, h in rows if h is None or not h.ok]
    if state.phase == "starting":
        return f"{state.name} is still starting (not ready yet: {', '.join(waiting) or 'the gateway'})"
    if waiting:
        return f"{state.name}: down: {', '.join(waiting)} (logs in {Path(state.state_dir) / 'logs'})"
    return None


def _health_text(component: Component, health: Health | None) -> str:
    if health is None:
        return "not started"
    how = "PING" if component.health.startswith("redis://") else f"GET {_path(component)}"
    outcome = "ok" if health.ok else "down"
    return f"{outcome} ({how})" if health.detail in ("PING", "200") else f"{outcome} ({how}: {health.detail})"


def _path(component: Component) -> str:
    return component.health.removeprefix(component.url) or "/"


def _find_state(path: Path | None, state_dir: Path | None) -> Path:
    """The state file to read: from --state-dir, from -f (`.tandem/<name>`), or the one stack here."""
    if state_dir is not None:
        return state_dir / STATE_FILE
    if path is not None:
        return DEFAULT_ROOT / load_one(path).metadata.name / STATE_FILE
    found = sorted(DEFAULT_ROOT.glob(f"*/{STATE_FILE}"))
    running = [p for p in found if _pid_of(p) is not None]
    if len(running) > 1:
        names = ", ".join(p.parent.name for p in running)
        fail(f"several stacks run here ({names}); pick one with -f FILE or --state-dir", code=2)
    if running or found:
        return (running or found)[0]
    fail(
        f"nothing is running here: no {DEFAULT_ROOT}/*/{STATE_FILE} "
        "(start a stack with `tandem up -f FILE`, or pass --state-dir)"
    )


def _pid_of(path: Path) -> int | None:
    try:
        pid = read_state(path).pid
    except StateError:
        return None
    return pid if alive(pid) else None


@click.command()
@click.option("-f", "--file", "path", type=click.Path(path_type=Path, dir_okay=False),
              help="The InferenceService `tandem up -f` runs (its state is in .tandem/<name>).")  # fmt: skip
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False),
              help="The --state-dir given to `tandem up`.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the state and each check as JSON.")
def status(path: Path | None, state_dir: Path | None, as_json: bool) -> None:
    """Show each component of a local `tandem up`: its URL, pid, health and metrics endpoint."""
    state_path = _find_state(path, state_dir)
    try:
        state = read_state(state_path)
    except StateError as exc:
        fail(f"nothing is running from {state_path.parent}: {exc} (start it with `tandem up`)")
    if not alive(state.pid):
        fail(f"{state.name} is not running: tandem up (pid {state.pid}) has exited; {state_path} is stale")
    rows = status_rows(state)
    if as_json:
        checks = [{"component": c.name, "ok": h.ok if h else None, "detail": h.detail if h else None}
                  for c, h in rows]  # fmt: skip
        click.echo(json.dumps({**state.model_dump(mode="json"), "checks": checks}, indent=2))
    else:
        for line in render_header(state):
            click.echo(line)
        for line in render_table(rows):
            click.echo(line)
    problem = problems(state, rows)
    if problem is not None:
        fail(problem)
