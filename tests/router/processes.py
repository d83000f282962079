"""Engines and routers as real child processes, for the fault tests (kill -9, restart on a port).

`sim_processes(...)` runs `python -m tandem.cli sim` children (started together, since each takes
seconds to import) and `router_process(...)` runs `python -m tandem.cli router`, each on a free (or
given) 127.0.0.1 port; both wait until `/health` answers 200 and stop their children at the end
(SIGTERM, then SIGKILL). `Child.kill()` ends one abruptly, as a crashed pod or an OOM kill would.
Their logs go to files in the test's temporary directory.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from tests.servers import LOOPBACK, free_port, wait_healthy

MODEL = "qwen"
MODEL_NAME = "Qwen/Qwen2.5-7B-Instruct"


@dataclass
class Child:
    url: str
    process: subprocess.Popen[str]
    log: Path

    @property
    def name(self) -> str:
        """`host:port`, as the router names endpoints."""
        return self.url.removeprefix("http://")

    def kill(self) -> None:
        """SIGKILL, and reap it: no graceful shutdown, connections break mid-response."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def _children(commands: list[tuple[list[str], int, Path]], *, wait: bool = True) -> Iterator[list[Child]]:
    children: list[Child] = []
    try:
        for argv, port, log in commands:
            with log.open("w") as out:
                process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True)
            children.append(Child(url=f"http://{LOOPBACK}:{port}", process=process, log=log))
        for child in children:
            if wait:
                wait_healthy(child.url, child.process)
        yield children
    finally:
        for child in children:
            child.stop()


def sim_argv(port: int, *args: str, time_scale: float) -> list[str]:
    argv = [sys.executable, "-m", "tandem.cli", "sim", "--port", str(port), "--model", MODEL_NAME]
    return [*argv, "--served-model-name", MODEL, "--time-scale", str(time_scale), "--seed", "1", *args]


@contextlib.contextmanager
def sim_processes(
    tmp_path: Path, names: list[str], *args: str, time_scale: float = 1.0
) -> Iterator[list[Child]]:
    """One simulated engine serving `qwen` per name; `args` are more `tandem sim` flags."""
    commands = []
    for name in names:
        port = free_port()
        commands.append((sim_argv(port, *args, time_scale=time_scale), port, tmp_path / f"{name}.log"))
    with _children(commands) as children:
        yield children


@contextlib.contextmanager
def router_process(
    tmp_path: Path, config: Path, *args: str, port: int | None = None, wait: bool = True
) -> Iterator[Child]:
    """`tandem router --config CONFIG` on `port` (default: a free one); `wait`: until healthy."""
    port = port or free_port()
    argv = [sys.executable, "-m", "tandem.cli", "router", "--config", str(config), "--port", str(port), *args]
    log = tmp_path / f"router-{port}-{len(list(tmp_path.glob('router-*.log')))}.log"
    with _children([(argv, port, log)], wait=wait) as [child]:
        yield child


def static_router_config(tmp_path: Path, engine: Child, *, service: str) -> Path:
    """`router.yaml` in `tmp_path`: service `service` of the simulated model in front of `engine` alone
    (static discovery, decode only)."""
    path = tmp_path / "router.yaml"
    document = {
        "service": service,
        "spec": {"model": {"name": MODEL_NAME, "servedName": MODEL}, "engine": {"kind": "sim"}},
        "discovery": {"kind": "static", "decode": [engine.url]},
    }
    path.write_text(yaml.safe_dump(document))
    return path
