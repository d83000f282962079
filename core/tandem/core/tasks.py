"""Background tasks' ends: one way to stop a long-running asyncio task."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` and wait until it has ended (its cancellation swallowed); None does nothing.

    Example: `task, self._task = self._task, None; await stop_task(task)` in a component's `stop`.
    """
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
