"""Starting, watching and stopping the local runtime's child processes.

Every child runs in its own session (process group), writes to its own log file, and is stopped with
SIGTERM to the whole group, then SIGKILL after a grace period, so nothing it spawned is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from tandem.local.plan import ProcessPlan

Progress = Callable[[str], None]
_LOG_TAIL_BYTES = 2000


class ChildFailed(RuntimeError):
    """A child exited or never became ready; the message names it and quotes the end of its log."""


@dataclass
class Child:
    plan: ProcessPlan
    process: subprocess.Popen[bytes]
    log_path: Path
    #: False for engines the autoscaler started: their exit is its business, not a runtime failure.
    watched: bool = True

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
    ) -> None:
        self._log_dir = log_dir
        self._clock = clock
        self._sleep = sleep
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
        child = Child(plan=plan, process=process, log_path=log_path, watched=watched)
        with self._lock:
            self.children.append(child)
        return child

    def wait_ready(self, child: Child, *, timeout: float) -> float:
        """Block until the child answers its probe; returns the seconds it took.

        Raises ChildFailed if it exits first or is not ready within `timeout` seconds.
        """
        started = self._clock()
        while True:
            code = child.process.poll()
            if code is not None:
                raise ChildFailed(
                    f"{child.plan.name} exited with code {code} while starting; "
                    f"its log ends with:\n{child.log_tail()}"
                )
            if _probe(child.plan):
                return self._clock() - started
            if self._clock() - started > timeout:
                raise ChildFailed(
                    f"{child.plan.name} was not ready after {timeout:.0f}s; "
                    f"its log ends with:\n{child.log_tail()}"
                )
            self._sleep(0.1)

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


def _probe(plan: ProcessPlan) -> bool:
    """One readiness check: Redis answers PING, an HTTP server answers GET /health with 200."""
    if plan.probe == "redis":
        client = redis.Redis(host="127.0.0.1", port=plan.port, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()
    try:
        return httpx.get(f"{plan.url}/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False
