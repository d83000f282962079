"""Fixtures for the router tests (the harness itself is `harness.py`)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

# Helpers are imported as `tests.router.*` (the name mypy gives them); `python -m pytest` has the
# repository root on sys.path already, a bare `pytest` does not.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.router.harness import Launcher


@pytest.fixture
async def launcher() -> AsyncIterator[Launcher]:
    """Starts engines and routers for one test; stops them all (in parallel) when it ends."""
    async with AsyncExitStack() as stack:
        launcher = Launcher(stack)
        try:
            yield launcher
        finally:
            launcher.stop_servers_soon()  # all at once; the stack then waits for each
