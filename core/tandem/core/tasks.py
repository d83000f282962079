"""Background tasks: one way to stop long-running asyncio tasks (one, or several at once), and a
call repeated in the background (`Every`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
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


class Every:
    """Calls `fn` every `interval_s` seconds in a background task named `name`, from `start` to `stop`
    (a file followed for changes: the API keys, the adapter names). `fn` must not raise."""

    def __init__(self, fn: Callable[[], object], *, interval_s: float, name: str) -> None:
        self.fn, self.interval_s, self.name = fn, interval_s, name
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.fn()
