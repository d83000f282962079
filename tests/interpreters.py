"""Other CPython interpreters on this machine, for tests that must run code as another version runs it
(an engine image's Python): this one if it fits, else one on PATH or under pyenv that answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def cpython(low: tuple[int, int], high: tuple[int, int] = (3, 99)) -> str | None:
    """A working CPython whose version is in [low, high], or None."""
    if low <= sys.version_info[:2] <= high:
        return sys.executable
    found = [shutil.which(f"python{low[0]}.{minor}") for minor in range(low[1], min(high[1], 20) + 1)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found += sorted(str(p) for p in pyenv.glob("3.*/bin/python3"))
    probe = f"import sys; sys.exit(not {low} <= sys.version_info[:2] <= {high})"
    for candidate in filter(None, found):
        if subprocess.run([candidate, "-c", probe], capture_output=True, check=False).returncode == 0:
            return candidate
    return None
