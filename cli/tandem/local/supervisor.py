"""Starting, watching and stopping the local runtime's child processes.

Every child runs in its own session (process group), writes to its own log file, and is stopped with
SIGTERM to the whole group, then SIGKILL after a grace period, so nothing it spawned is left behind.
Start-up is waited for a stage at a time (`wait_all_ready`): every child of the stage is polled
together, each is reported as it becomes ready, and the ones still starting are named every few
seconds, so a slow engine (real vLLM takes a minute) is never waited for in silence.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tandem.local.health import check
from tandem.local.plan import ProcessPlan

Progress = Callable[[str], None]
Probe = Callable[[ProcessPlan], bool]
_LOG_TAIL_BYTES = 2000
#: Seconds between two `waiting for ...` lines while a stage starts.
WAITING_EVERY_S = 5.0
_POLL_S = 0.1


class ChildFailed(RuntimeError):
    """A child exited or never became ready; the message names it and quotes the end of its log."""


@dataclass
class Child:
    plan: ProcessPlan
    process: subprocess.Popen[bytes]
    log_path: Path
    #: False for engines the autoscaler started: their exit is its business, not a runtime failure.
    watched: bool = True
    #: The supervisor's clock when the process was started (seconds).
    started_at: float = 0.0

    def log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()[-_LOG_TAIL_BYTES:]
        except OSError:
            return ""
        return data.decode("utf-8", errors="replace").strip()


class Supervisor:
    """Owns the children of one `tandem up`; `stop_all` is safe to call more than once.

    Thread-safe: the autoscaler starts and stops engines from its own thread while the main thread
    watches for dead children, so the list of children is only touched under a lock.
    """

    def __init__(
        self,
        *,
        log_dir: Path,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        probe: Probe | None = None,
    ) -> None:
        self._log_dir = log_dir
        self._clock = clock
        self._sleep = sleep
        self._probe = probe or probe_ready
        self._lock = threading.Lock()
        self.children: list[Child] = []

    def start(self, plan: ProcessPlan, *, watched: bool = True) -> Child:
        """Start one child with its output in `<log_dir>/<name>.log`; `first_dead` reports it only
        when `watched`."""
        self._log_dir.mkdir(parents=True, exist_ok=True)
        for folder in plan.dirs:
            folder.mkdir(parents=True, exist_ok=True)
        log_path = self._log_dir / f"{plan.name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                plan.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **plan.env},
                start_new_session=True,
            )
        child = Child(
            plan=plan, process=process, log_path=log_path, watched=watched, started_at=self._clock()
        )
        with self._lock:
            self.children.append(child)
        return child

    def wait_ready(self, child: Child, *, timeout: float) -> float:
        """Block until the child answers its probe; returns the seconds since it was started.

        Raises ChildFailed if it exits first or is not ready within `timeout` seconds.
        """
        took: list[float] = []
        self.wait_all_ready(
            [child], timeout=timeout, on_ready=lambda _, seconds: took.append(seconds), say=lambda _: None
        )
        return took[0]

    def wait_all_ready(
        self,
        children: Sequence[Child],
        *,
        timeout: float,
        on_ready: Callable[[Child, float], None],
        say: Progress,
        every: float = WAITING_EVERY_S,
    ) -> None:
        """Poll every child until each answers its probe, calling `on_ready(child, seconds since it
        started)` once per child as it becomes ready, and `say("waiting for prefill-0 (12s) ...")`
        every `every` seconds while some are not.

        Raises ChildFailed when one exits first, or when some are not ready `timeout` seconds after
        this call (the message names the first of them and quotes its log).
        """
        began = self._clock()
        pending = list(children)
        next_note = began + every
        while True:
            for child in list(pending):
                _raise_if_exited(child)
                if self._probe(child.plan):
                    pending.remove(child)
                    on_ready(child, self._clock() - child.started_at)
            if not pending:
                return
            now = self._clock()
            if now - began > timeout:
                first = pending[0]
                raise ChildFailed(
                    f"{first.plan.name} was not ready after {timeout:.0f}s; "
                    f"its log ends with:\n{first.log_tail()}"
                )
            if now >= next_note:
                say(_waiting_line(pending, now=now))
                while next_note <= now:  # on the 5 s grid, however long a probe took
                    next_note += every
            self._sleep(_POLL_S)

    def first_dead(self) -> Child | None:
        """A watched child that has exited, if any."""
        with self._lock:
            children = [c for c in self.children if c.watched]
        return next((c for c in children if c.process.poll() is not None), None)

    def stop(self, child: Child, *, grace: float = 10.0) -> int:
        """Stop one child (no longer watched from here on): SIGTERM to its group, SIGKILL after
        `grace` seconds; returns its exit code."""
        with self._lock:
            if child in self.children:
                self.children.remove(child)
        _signal_group(child.process, signal.SIGTERM)
        try:
            code = child.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(child.process, signal.SIGKILL)
            code = child.process.wait()
        _signal_group(child.process, signal.SIGKILL)
        return code

    def stop_all(self, *, grace: float = 10.0) -> None:
        """SIGTERM every child's process group (last started first), then SIGKILL what remains."""
        with self._lock:
            children = list(self.children)
        for child in reversed(children):
            _signal_group(child.process, signal.SIGTERM)
        deadline = self._clock() + grace
        for child in reversed(children):
            remaining = max(0.0, deadline - self._clock())
            try:
                child.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                _signal_group(child.process, signal.SIGKILL)
                child.process.wait()
            # The leader may be gone while others in its group live on (e.g. forked workers).
            _signal_group(child.process, signal.SIGKILL)
        with self._lock:
            self.children.clear()


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def probe_ready(plan: ProcessPlan) -> bool:
    """One readiness check: Redis answers PING, an HTTP server answers GET /health with 200."""
    url = plan.url if plan.probe == "redis" else f"{plan.url}/health"
    return check(url).ok


def _raise_if_exited(child: Child) -> None:
    code = child.process.poll()
    if code is not None:
        raise ChildFailed(
            f"{child.plan.name} exited with code {code} while starting; "
            f"its log ends with:\n{child.log_tail()}"
        )


def _waiting_line(pending: Sequence[Child], *, now: float) -> str:
    """`waiting for prefill-0 (12s) ...`; children started together share one count of seconds."""
    by_seconds: dict[int, list[str]] = {}
    for child in pending:
        by_seconds.setdefault(round(now - child.started_at), []).append(child.plan.name)
    parts = [f"{', '.join(names)} ({seconds}s)" for seconds, names in by_seconds.items()]
    return f"waiting for {', '.join(parts)} ..."
