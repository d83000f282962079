"""Where the numbers came from, for every report: the machine, the code's commit, and the workload's
identity (name, parameters, seed, size and a content hash)."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from tandem.bench.workload_file import dump_jsonl
from tandem.bench.workloads import Workload


def machine_info() -> dict[str, Any]:
    """Where the numbers were taken: cores, CPU model, OS, Python."""
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "source": source_info(),
    }


def source_info() -> dict[str, Any]:
    """The git commit of the code that ran (gateway, engines and bench alike) and whether the work tree
    had changes; None values when this is not a git checkout."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    status = git("status", "--porcelain")
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def workload_info(workload: Workload, *, seed: int) -> dict[str, Any]:
    """The workload's identity for the report: name, parameters, seed, size and content hash."""
    return {
        "name": workload.name,
        "params": dict(workload.params),
        "seed": seed,
        "requests": len(workload.requests),
        "tenants": list(workload.tenants),
        "sha256": hashlib.sha256(dump_jsonl(workload).encode("utf-8")).hexdigest(),
    }
