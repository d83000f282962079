"""The engine loop on simulated time (`tandem.sim.engine.loop`, `tandem.sim.engine.clock`).

Real: the engine core, the loop and asyncio. Faked: time. `VirtualClock` moves only when the loop
sleeps; `ScaledClock` is given a hand-driven monotonic clock and a sleep that records how long it was
asked to wait. No test sleeps for real or looks at the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from tests.sim.builders import TINY, make_core, prompt, request

from tandem.sim.engine.clock import ScaledClock, VirtualClock
from tandem.sim.engine.loop import EngineDead, EngineLoop
from tandem.sim.engine.requests import IterationStats, RequestOutput, SchedulerStats
from tandem.sim.engine.timemodel import BatchShape, step_time


class RecordingSink:
    def __init__(self) -> None:
        self.iterations: list[IterationStats] = []
        self.last: SchedulerStats | None = None

    def record(self, iteration: IterationStats, scheduler: SchedulerStats) -> None:
        self.iterations.append(iteration)
        self.last = scheduler

    def all(self, name: str) -> list[float]:
        return [value for it in self.iterations for value in getattr(it, name)]


@asynccontextmanager
async def running(loop: EngineLoop) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(loop.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def collect(stream: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [output async for output in stream]


PREFILL_100 = step_time(TINY, BatchShape(num_seqs=1, new_tokens=100, context_tokens=100)).total_s
DECODE_101 = step_time(TINY, BatchShape(num_seqs=1, new_tokens=1, context_tokens=101)).total_s


async def test_a_request_runs_in_simulated_time_with_its_ttft_equal_to_the_prefill_step() -> None:
    clock, sink = VirtualClock(start=100.0), RecordingSink()
    loop = EngineLoop(make_core(), clock=clock, sink=sink)
    async with running(loop):
        outputs = await collect(loop.submit(request("r", prompt(100), max_tokens=2)))
    assert [o.finish_reason for o in outputs] == [None, "length"]
    assert sink.all("ttfts_s") == [pytest.approx(PREFILL_100)]
    assert sink.all("itls_s") == [pytest.approx(DECODE_101)]
    assert clock.now() == pytest.approx(100.0 + PREFILL_100 + DECODE_101)
    assert sink.last == SchedulerStats(num_running=0, num_waiting=0, kv_cache_usage=0.0)


async def test_after_idling_the_engine_resumes_at_the_clocks_present() -> None:
    clock, sink = VirtualClock(), RecordingSink()
    loop = EngineLoop(make_core(), clock=clock, sink=sink)
    async with running(loop):
        await collect(loop.submit(request("a", prompt(100), max_tokens=1)))
        clock.advance(50.0)  # nothing to do for 50 simulated seconds
        await collect(loop.submit(request("b", prompt(100, salt=1), max_tokens=1)))
    finished = [f for it in sink.iterations for f in it.finished]
    assert [f.queue_s for f in finished] == [0.0, 0.0]
    assert sink.all("ttfts_s") == [pytest.approx(PREFILL_100)] * 2


async def test_a_scaled_clock_sleeps_the_step_time_divided_by_the_scale() -> None:
    wall = [0.0]
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        wall[0] += seconds
        await asyncio.sleep(0)

    clock = ScaledClock(10.0, monotonic=lambda: wall[0], sleep=fake_sleep)
    loop = EngineLoop(make_core(), clock=clock)
    async with running(loop):
        await collect(loop.submit(request("r", prompt(100), max_tokens=2)))
    assert slept[:2] == [pytest.approx(PREFILL_100 / 10), pytest.approx(DECODE_101 / 10)]
    assert clock.now() == pytest.approx(PREFILL_100 + DECODE_101)


async def test_requests_that_arrive_together_are_batched_and_share_steps() -> None:
    clock, sink = VirtualClock(), RecordingSink()
    loop = EngineLoop(make_core(), clock=clock, sink=sink)
    async with running(loop):
        streams = [loop.submit(request(f"r{i}", prompt(100, salt=i), max_tokens=3)) for i in range(4)]
        results = await asyncio.gather(*(collect(s) for s in streams))
    assert all(len(r) == 3 for r in results)
    steps = [it for it in sink.iterations if it.num_generation_tokens]
    assert [it.num_generation_tokens for it in steps] == [4, 4, 4]


async def test_an_aborted_request_stops_and_frees_its_blocks() -> None:
    core = make_core()
    sink = RecordingSink()
    loop = EngineLoop(core, clock=VirtualClock(), sink=sink)
    async with running(loop):
        stream = loop.submit(request("r", prompt(100), max_tokens=1000))
        first = await anext(stream)
        loop.abort("r")
        await asyncio.sleep(0)
    assert first.finish_reason is None
    assert core.pool.usage() == 0.0 and not core.has_work()
    assert [f.finish_reason for it in sink.iterations for f in it.finished] == ["abort"]


async def test_an_internal_error_fails_open_requests_instead_of_hanging_them() -> None:
    core = make_core()
    loop = EngineLoop(core, clock=VirtualClock())

    def broken(*, now: float) -> object:
        raise RuntimeError("bug in the scheduler")

    core.plan_step = broken  # type: ignore[assignment, method-assign]
    task = asyncio.create_task(loop.run())
    stream = loop.submit(request("r", prompt(10), max_tokens=2))
    with pytest.raises(EngineDead, match="bug in the scheduler"):
        await collect(stream)
    with pytest.raises(RuntimeError):
        await task
    with pytest.raises(EngineDead):
        loop.submit(request("s", prompt(10), max_tokens=2))


def test_a_virtual_clock_only_moves_forward() -> None:
    clock = VirtualClock(start=3.0)
    clock.advance(-1.0)
    clock.advance(2.0)
    assert clock.now() == 5.0


def test_a_scaled_clock_needs_a_positive_scale() -> None:
    with pytest.raises(ValueError, match="time_scale"):
        ScaledClock(0.0)
