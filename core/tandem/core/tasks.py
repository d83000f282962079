"""Background tasks' ends: one way to stop long-running asyncio tasks (one, or several at once)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
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


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]]) -> list[BaseException]:
    """Cancel every task, then wait until all have ended; the errors any of them had ended with
    before (their cancellations swallowed), for the caller to log or ignore.

    Example: `await stop_tasks(self._tasks); self._tasks.clear()` in a component's `stop`.
    """
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
