"""`tandem router --workers N`'s supervisor (`tandem.cli.router_workers.Supervisor`): a worker that dies
is started again after its back-off, which doubles while it keeps dying; a configuration error stops the
run. Faked: the worker processes (`_start` records the index and gives a process that is alive until
the test kills it) and the clock; the watch loop's decisions are the real code's."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tandem.cli.router_workers import EXIT_BAD_CONFIG, FIRST_RESTART_S, MAX_RESTART_S, Supervisor


@dataclass
class FakeProcess:
    alive: bool = True
    exitcode: int | None = None

    def is_alive(self) -> bool:
        return self.alive

    def die(self, code: int) -> None:
        self.alive, self.exitcode = False, code


class Watched:
    """A supervisor of `count` fake workers on a clock the test moves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, count: int = 2) -> None:
        self.now = 100.0
        self.starts: list[tuple[int, float]] = []
        self.processes: dict[int, FakeProcess] = {}
        self.supervisor = Supervisor(None, count=count, clock=lambda: self.now)  # type: ignore[arg-type]
        monkeypatch.setattr(self.supervisor, "_start", self._start)
        for index in range(count):
            self._start(index)

    def _start(self, index: int) -> None:
        self.starts.append((index, self.now))
        self.processes[index] = FakeProcess()
        self.supervisor._workers[index] = self.processes[index]  # type: ignore[assignment]
        self.supervisor._started_at[index] = self.now

    def run_until(self, until: float, *, step: float = 0.2) -> int | None:
        """The watch loop every `step` seconds up to `until`; the first exit code it returns."""
        while self.now < until - 1e-9:
            self.now = round(self.now + step, 6)
            code = self.supervisor._watch()
            if code is not None:
                return code
        return None


def test_a_dead_worker_is_started_again_after_its_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    watched = Watched(monkeypatch)
    watched.processes[0].die(3)  # uvicorn's start-up failure
    assert watched.run_until(100.0 + FIRST_RESTART_S + 0.2) is None
    assert [i for i, _ in watched.starts] == [0, 1, 0]  # worker 0 once more, worker 1 untouched
    restarted_at = watched.starts[-1][1]
    assert 100.0 + FIRST_RESTART_S <= restarted_at <= 100.0 + FIRST_RESTART_S + 0.2 + 1e-6


def test_a_worker_that_keeps_dying_waits_twice_as_long_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    watched = Watched(monkeypatch, count=1)
    deaths, restarts = [], []
    for _ in range(3):
        watched.processes[0].die(1)
        deaths.append(watched.now)
        before = len(watched.starts)
        watched.run_until(watched.now + 10.0)
        assert len(watched.starts) == before + 1, "the dead worker was not started again"
        restarts.append(watched.starts[-1][1])
    waits = [round(r - d, 1) for d, r in zip(deaths, restarts, strict=True)]
    assert waits == [1.2, 2.2, 4.2]  # 1, 2 and 4 s from the first watch that saw it dead, 0.2 s after


def test_a_worker_that_served_long_enough_starts_its_back_off_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    watched = Watched(monkeypatch, count=1)
    watched.processes[0].die(1)
    watched.run_until(watched.now + 3.0)  # restarted after 1 s
    watched.run_until(watched.now + MAX_RESTART_S + 1.0)  # then serves a while
    watched.processes[0].die(1)
    died = watched.now
    watched.run_until(watched.now + 3.0)
    assert round(watched.starts[-1][1] - died, 1) == 1.2


def test_a_configuration_error_stops_the_run_with_its_code(monkeypatch: pytest.MonkeyPatch) -> None:
    watched = Watched(monkeypatch)
    watched.processes[1].die(EXIT_BAD_CONFIG)
    assert watched.run_until(101.0) == EXIT_BAD_CONFIG
    assert [i for i, _ in watched.starts] == [0, 1]
