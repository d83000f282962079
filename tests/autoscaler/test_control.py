"""One pool's round (`PoolController.step`) with an in-memory target: when it acts and when it does not.

Real: the controller, the collector's pure half and the decider. Stubbed: the target (a list of engine
URLs and a replica count in memory) and the scrape (readings given by the test). Time is a fake clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.autoscaler.control import PoolController, ScrapeFn
from tandem.autoscaler.decider import DeciderParams
from tandem.autoscaler.readings import EngineReading


@dataclass
class MemoryPool:
    ready: list[str]
    asked: int
    scaled: list[int] = field(default_factory=list)

    async def endpoints(self) -> list[str]:
        return list(self.ready)

    async def requested(self) -> int:
        return self.asked

    async def scale(self, replicas: int, *, reason: str) -> None:
        self.scaled.append(replicas)
        self.asked = replicas


def controller(pool: MemoryPool, util: float) -> PoolController:
    async def scrape(urls: Sequence[str]) -> dict[str, EngineReading | None]:
        return {url: EngineReading(kv_usage=util, running=1.0) for url in urls}

    params = DeciderParams(
        min=1, max=8, target=0.5, stable_window_s=4.0, panic_window_s=2.0, scale_down_delay_s=0.0
    )
    return PoolController(service="demo", pool="decode", params=params, target=pool, scrape=scrape)


async def test_no_scale_down_while_requested_replicas_are_still_starting() -> None:
    pool = MemoryPool(ready=["http://e0", "http://e1"], asked=4)  # 2 of 4 ready: 2 starting
    outcome = await controller(pool, util=0.1).step(now=10.0)  # 2 × 0.1 / 0.5 = 0.4 → wants 1
    assert pool.scaled == [] and outcome.desired == 4 and outcome.direction is None
    assert "scale-down waits until the 4 requested replicas are ready (2)" in outcome.decision.reason


async def test_a_settled_pool_scales_down_and_a_starting_one_may_still_scale_up() -> None:
    settled = MemoryPool(ready=["http://e0", "http://e1"], asked=2)
    down = await controller(settled, util=0.1).step(now=10.0)
    assert settled.scaled == [1] and down.direction == "down"
    starting = MemoryPool(ready=["http://e0", "http://e1"], asked=3)  # one replica still starting
    up = await controller(starting, util=1.0).step(now=10.0)  # 2 × 1.0 / 0.5 = 4 ≥ 2 × 2: panic, 4
    assert starting.scaled == [4] and up.direction == "up"


async def test_replicas_that_never_become_ready_are_given_up_on_after_the_time_limit() -> None:
    pool = MemoryPool(ready=["http://e0", "http://e1"], asked=4)  # 2 of 4 never become ready
    control = controller(pool, util=0.1)  # 2 × 0.1 / 0.5 = 0.4 → wants 1
    control.params = DeciderParams(
        min=1, max=8, target=0.5, stable_window_s=4.0, panic_window_s=2.0, scale_down_delay_s=0.0,
        ready_timeout_s=600.0,
    )  # fmt: skip
    waiting = await control.step(now=0.0)
    later = await control.step(now=599.0)
    assert pool.scaled == [] and later.unready_s == 599.0 and not later.gave_up
    assert "scale-down waits" in waiting.decision.reason
    given_up = await control.step(now=600.0)
    assert given_up.gave_up and pool.scaled == [1] and given_up.direction == "down"
    assert "2 requested replicas not ready after 600 s: given up" in given_up.decision.reason
    settled = await control.step(now=601.0)  # 2 ready, 1 asked: nothing missing any more
    assert settled.unready_s is None and not settled.gave_up


async def test_the_controller_learns_the_engine_start_time_from_its_scale_ups() -> None:
    pool = MemoryPool(ready=["http://e0"], asked=1)
    control = controller(pool, util=1.0)  # 1 × 1.0 / 0.5 = 2 ≥ 2 × 1: panic, scale to 2
    first = await control.step(now=10.0)
    assert pool.scaled == [2] and first.engine_start_s is None
    pool.ready.append("http://e1")  # ready 6 s after it was asked
    control.scrape = _fixed(util=0.5)  # on target now: no further scale-up
    learned = await control.step(now=16.0)
    assert learned.engine_start_s == 6.0
    assert learned.observed.engine_start_s == 6.0  # the decider sees it in the observation


def _fixed(util: float) -> ScrapeFn:
    async def scrape(urls: Sequence[str]) -> dict[str, EngineReading | None]:
        return {url: EngineReading(kv_usage=util, running=1.0) for url in urls}

    return scrape
