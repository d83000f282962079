"""The engine loop: steps an `EngineCore` in simulated time and hands tokens to per-request streams.

Simulated time is kept by the loop itself. While the engine is busy, steps run back to back: a step
that starts at t ends at t + duration exactly and the next starts there, whatever the wall clock did
in between (Python overhead never leaks into simulated latencies). The loop sleeps until the clock
reaches the step's end, so with a `ScaledClock` simulated time tracks scale × wall time; if the host
is too slow for the scale, simulated time falls behind instead of latencies inflating. When the
engine goes idle and work arrives, it resumes at the clock's present.

A request arriving during a step is stamped with the clock's present, but never later than the end
of the step in flight (it cannot run before then anyway), so queue times are never negative.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from tandem.sim.engine.clock import Clock
from tandem.sim.engine.core import EngineCore, StepResult
from tandem.sim.engine.requests import IterationStats, NewRequest, RequestOutput, SchedulerStats

logger = logging.getLogger(__name__)


class EngineDead(RuntimeError):
    """The engine loop stopped on an internal error; no request can complete."""


class StatsSink(Protocol):
    """Receives the engine's statistics (the Prometheus metrics implement it)."""

    def record(self, iteration: IterationStats, scheduler: SchedulerStats) -> None: ...


class RequestStream:
    """The outputs of one request, in order; iteration ends after the finishing output."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._done = False

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item.finished
        return item


class EngineLoop:
    """Runs one `EngineCore` on a `Clock` (module docstring). Call `run()` in a task. `on_step_end` is
    called after every completed step (the KV-event publisher flushes the step's events there)."""

    def __init__(
        self,
        core: EngineCore,
        *,
        clock: Clock,
        sink: StatsSink | None = None,
        on_step_end: Callable[[], None] | None = None,
    ) -> None:
        self.core = core
        self._clock = clock
        self._sink = sink
        self._on_step_end = on_step_end
        self._streams: dict[str, RequestStream] = {}
        self._wake = asyncio.Event()
        self._time = clock.now()  # end of the last step, simulated seconds
        self._step_end: float | None = None
        self._idle = True
        self._failure: BaseException | None = None
        self._settling: list[asyncio.Future[None]] = []  # `loads_settled` callers

    def now(self) -> float:
        """The simulated time to stamp an arrival with (module docstring)."""
        present = self._clock.now()
        if self._step_end is not None:
            return min(present, self._step_end)
        return max(present, self._time)

    def submit(self, new: NewRequest) -> RequestStream:
        """Queue a request; its outputs arrive on the returned stream."""
        if self._failure is not None:
            raise EngineDead("the engine loop has stopped") from self._failure
        self.core.add_request(new, now=self.now())
        stream = RequestStream(new.request_id)
        self._streams[new.request_id] = stream
        self._record(IterationStats())
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Forget a request whose client went away (no-op once it finished)."""
        self._streams.pop(request_id, None)
        finished = self.core.abort(request_id, now=self.now())
        if finished is not None:
            self._record(IterationStats(finished=[finished]))

    async def loads_settled(self) -> None:
        """Return once the adapter reads `add_lora` left pending have run in a finished step: vLLM
        answers its runtime load route after `add_lora`, which its engine core runs between two
        steps (at once when idle). Raises `EngineDead` if the loop fails first."""
        if not self.core.loads_pending():
            return
        if self._failure is not None:
            raise EngineDead("the engine loop has stopped") from self._failure
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._settling.append(waiter)
        self._wake.set()
        await waiter

    async def run(self) -> None:
        """Step forever (until cancelled). An internal error fails every open stream, then propagates."""
        try:
            while True:
                await self._step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the core: fail requests instead of leaving them hanging
            logger.exception("engine loop failed")
            self._failure = exc
            for stream in self._streams.values():
                stream.put(EngineDead(f"the engine loop failed: {exc}"))
            self._streams.clear()
            self._settle(EngineDead(f"the engine loop failed: {exc}"))
            raise

    async def _step(self) -> None:
        if not self.core.has_work():
            self._idle = True
            self._wake.clear()
            await self._wake.wait()
        start = max(self._time, self._clock.now()) if self._idle else self._time
        self._idle = False
        plan = self.core.plan_step(now=start)
        if plan.empty:  # nothing can run (cannot happen with a valid config): wait for news
            self._idle = True
            self._wake.clear()
            await self._wake.wait()
            return
        end = start + plan.time.total_s
        self._step_end = end
        try:
            await self._clock.sleep(end - self._clock.now())
        finally:
            self._step_end = None
        self._time = end
        self._dispatch(self.core.finish_step(plan, now=end))
        if self._settling and not self.core.loads_pending():
            self._settle()

    def _settle(self, failure: BaseException | None = None) -> None:
        """Wake every `loads_settled` caller, with `failure` raised in each when given."""
        for waiter in self._settling:
            if not waiter.done():
                if failure is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(failure)
        self._settling.clear()

    def _dispatch(self, result: StepResult) -> None:
        for output in result.outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            stream.put(output)
            if output.finished:
                del self._streams[output.request_id]
        if self._sink is not None:
            self._sink.record(result.iteration, result.scheduler)
        if self._on_step_end is not None:
            self._on_step_end()

    def _record(self, iteration: IterationStats) -> None:
        if self._sink is not None:
            self._sink.record(iteration, self.core.stats())
