"""`stop_task` and `stop_tasks`: background tasks cancelled and waited for, whatever state they are in."""

from __future__ import annotations

import asyncio

from tandem.core.tasks import stop_task, stop_tasks


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


async def test_several_tasks_all_end_and_an_earlier_failure_is_reported_not_raised() -> None:
    ended: list[int] = []

    async def forever(index: int) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append(index)

    async def fails() -> None:
        raise RuntimeError("broke before the stop")

    running = [asyncio.create_task(forever(i)) for i in range(3)]
    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    errors = await stop_tasks([*running, failed])
    assert sorted(ended) == [0, 1, 2] and all(t.cancelled() for t in running)
    assert [str(e) for e in errors] == ["broke before the stop"]
    assert await stop_tasks([]) == []
