"""`tandem up` of a spec as a subprocess, for the tests that read what a real local stack does: started
on a free port of 127.0.0.1, its output collected line by line, ready when it prints `ready: `, and
stopped with SIGINT (as Ctrl-C stops it) when the test is done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tests.servers import free_port

READY_TIMEOUT_S = 120.0


@dataclass
class Stack:
    process: subprocess.Popen[str]
    spec: Path
    state_dir: Path
    output: list[str]

    @property
    def endpoint(self) -> str:
        """The OpenAI base URL, as `tandem up` prints it (`endpoint: http://127.0.0.1:PORT/v1`)."""
        return next(line.split(" ", 1)[1] for line in self.output if line.startswith("endpoint: "))


@contextmanager
def running_up(spec: dict[str, Any], folder: Path) -> Iterator[Stack]:
    """`tandem up -f <folder>/isvc.yaml --state-dir <folder>/state` until the block ends; fails the
    test with the stack's output if it exits or is not ready within `READY_TIMEOUT_S`."""
    path = folder / "isvc.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    state_dir = folder / "state"
    process = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "up", "-f", str(path), "--port", str(free_port()),
         "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    output: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line.rstrip("\n"))
            if line.startswith("ready: "):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.wait(0.5):
            assert process.poll() is None, "tandem up exited:\n" + "\n".join(output)
            assert time.monotonic() < deadline, "tandem up is not ready:\n" + "\n".join(output)
        yield Stack(process=process, spec=path, state_dir=state_dir, output=output)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
