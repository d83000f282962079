"""`stop_task`: a background task cancelled and waited for, whatever state it is in."""

from __future__ import annotations

import asyncio

from tandem.core.tasks import stop_task


async def test_a_running_task_is_cancelled_and_has_ended_when_stop_returns() -> None:
    cleaned: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append("finally ran")

    task = asyncio.create_task(forever())
    await asyncio.sleep(0)
    await stop_task(task)
    assert task.cancelled() and cleaned == ["finally ran"]


async def test_none_and_a_finished_task_are_stopped_without_error() -> None:
    await stop_task(None)
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await stop_task(done)
    assert done.done() and not done.cancelled()
