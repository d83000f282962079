"""`tandem up`'s start-up progress: which engines it still waits for, and how long each took.

Real: the stack's plan (`build_plan` on a small spec), the `Supervisor` starting each child as a real
process (`sleep`, standing in for Redis, the engines and the gateway) and `start_stack`. Faked: the
clock (it moves only when the supervisor sleeps) and readiness (a child is ready once the fake clock
is a set number of seconds past its start), so a 37-second prefill engine takes no real time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cli.stacks import small_plan

from tandem.local.plan import ProcessPlan
from tandem.local.startup import start_stack
from tandem.local.supervisor import ChildFailed, Supervisor


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now = round(self.now + seconds, 6)  # 370 sleeps of 0.1 s are 37 s, not 36.99999


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def supervisor(tmp_path: Path, fake_time: FakeTime) -> Iterator[Supervisor]:
    """Children become ready this many fake seconds after their start: prefill is slow (real vLLM)."""
    ready_after = {"redis": 0.0, "prefill-0": 37.0, "decode-0": 2.0, "router": 1.0}

    def probe(plan: ProcessPlan) -> bool:
        child = next(c for c in built.children if c.plan.name == plan.name)
        return fake_time.now - child.started_at >= ready_after[plan.name]

    built = Supervisor(log_dir=tmp_path / "logs", clock=fake_time.clock, sleep=fake_time.sleep, probe=probe)
    try:
        yield built
    finally:
        built.stop_all(grace=5)


def test_a_slow_engine_is_named_every_five_seconds_until_it_is_ready(
    tmp_path: Path, supervisor: Supervisor
) -> None:
    lines: list[str] = []
    start_stack(small_plan(tmp_path), supervisor, timeout_for=lambda role: 120.0, say=lines.append)
    waiting = [line for line in lines if line.startswith("waiting for")]
    assert waiting == [f"waiting for prefill-0 ({s}s) ..." for s in (5, 10, 15, 20, 25, 30, 35)]
    engines = lines[lines.index("[2/4] prefill-0  http://127.0.0.1:9001 starting ...") :]
    assert engines[:2] == [
        "[2/4] prefill-0  http://127.0.0.1:9001 starting ...",
        "[3/4] decode-0   http://127.0.0.1:9002 starting ...",
    ]
    assert engines[2] == "[3/4] decode-0   ready in 2.0s"
    assert engines[3:10] == waiting
    assert engines[10] == "[2/4] prefill-0  ready in 37.0s"
    assert lines[-1] == "[4/4] router     ready in 1.0s"


def test_engines_started_together_are_waited_for_together(tmp_path: Path, supervisor: Supervisor) -> None:
    """Each `ready in` counts from that child's own start, not from when the previous one was ready."""
    lines: list[str] = []
    start_stack(small_plan(tmp_path), supervisor, timeout_for=lambda role: 120.0, say=lines.append)
    assert "[3/4] decode-0   ready in 2.0s" in lines
    assert lines.index("[3/4] decode-0   ready in 2.0s") < lines.index("[2/4] prefill-0  ready in 37.0s")


def test_a_stage_not_ready_in_time_names_the_engine_still_starting(
    tmp_path: Path, supervisor: Supervisor
) -> None:
    lines: list[str] = []
    with pytest.raises(ChildFailed, match=r"^prefill-0 was not ready after 20s"):
        start_stack(small_plan(tmp_path), supervisor, timeout_for=lambda role: 20.0, say=lines.append)
    assert lines[-1] == "waiting for prefill-0 (20s) ..."
