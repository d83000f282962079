"""Starting a planned stack stage by stage, with progress a person can follow.

Stages: the KV pool, then every engine at once, then the gateway (it needs the engines' URLs). Each
child gets a `[n/total] name url starting ...` line when it is started and `[n/total] name ready in
12.3s` (seconds since its own start) when it answers its probe; while any of the stage is still
starting, `waiting for prefill-0 (15s) ...` every few seconds (`Supervisor.wait_all_ready`).
"""

from __future__ import annotations

from collections.abc import Callable

from tandem.local.autoscaler import write_initial_endpoints
from tandem.local.plan import LocalPlan, Role
from tandem.local.supervisor import Child, Progress, Supervisor


def start_stack(
    plan: LocalPlan,
    supervisor: Supervisor,
    *,
    timeout_for: Callable[[Role], float],
    say: Progress,
    on_started: Callable[[], object] = lambda: None,
) -> None:
    """Start every process of `plan` under `supervisor`, stage by stage, waiting for each stage.

    `timeout_for(role)` is the start-up limit (seconds) of a stage holding that role; `on_started` is
    called after each stage's processes are started (before waiting), e.g. to record their pids.
    Raises `ChildFailed` when a child exits or is not ready in time.
    """
    stages = [
        [p for p in plan.processes if p.role == "kvpool"],
        [p for p in plan.processes if p.role in ("prefill", "decode")],
        [p for p in plan.processes if p.role == "router"],
    ]
    numbers = {p.name: i for i, p in enumerate(plan.processes, start=1)}
    total = len(plan.processes)

    def label(child: Child) -> str:
        return f"[{numbers[child.plan.name]}/{total}] {child.plan.name:<10}"

    def ready(child: Child, took: float) -> None:
        say(f"{label(child)} ready in {took:.1f}s")

    for stage in [s for s in stages if s]:
        if stage[0].role == "router":  # engines are ready: list them for file discovery
            write_initial_endpoints(plan, supervisor.children)
        children = [supervisor.start(p) for p in stage]
        on_started()
        for child in children:
            say(f"{label(child)} {child.plan.url} starting ...")
        timeout = max(timeout_for(p.role) for p in stage)
        supervisor.wait_all_ready(children, timeout=timeout, on_ready=ready, say=say)
