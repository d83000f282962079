"""Fixtures for the router tests (the harness itself is `harness.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
from tests.router.harness import Launcher

from tandem.router.upstream.wire import Wire


@pytest.fixture
async def launcher() -> AsyncIterator[Launcher]:
    """Starts engines and routers for one test; stops them all (in parallel) when it ends."""
    async with AsyncExitStack() as stack:
        launcher = Launcher(stack)
        try:
            yield launcher
        finally:
            launcher.stop_servers_soon()  # all at once; the stack then waits for each


@pytest.fixture
async def wire() -> AsyncIterator[Wire]:
    """The gateway's upstream wire for one test; its idle connections closed at the end."""
    wire = Wire(connect_s=5.0)
    try:
        yield wire
    finally:
        wire.close()
