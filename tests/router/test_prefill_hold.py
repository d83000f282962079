"""Late binding of prefills (`tandem.router.pd.hold`): held while every prefill engine has a queue, sent
first come first served to whichever engine frees or joins; at most the objective; withdrawn on cancel.

The engines are a dict of seconds queued ahead per URL that the test changes, as the router's scheduling
state would as prefills are sent and end; the clock is the event loop's.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram
from tests.router.harness import MODEL, Launcher, metric

from tandem.router.pd.hold import PrefillHold


def prompt(seed: int) -> str:
    """Sixty distinct words: one prompt's worth of prefill work, the same size for every seed."""
    return " ".join(f"w{seed}x{i}" for i in range(60))


OBJECTIVE = 2.0  # seconds: a request may be sent behind HOLD_SHARE × 2 = 0.5 s of queued work


def hold_over(queues: dict[str, float], *, poll_s: float = 0.05) -> tuple[PrefillHold, CollectorRegistry]:
    registry = CollectorRegistry()
    held = Gauge("held", "requests held", registry=registry)
    seconds = Histogram("hold_seconds", "seconds held", registry=registry)
    hold = PrefillHold(
        ahead=lambda url: queues[url],
        candidates=lambda: list(queues),
        clock=asyncio.get_running_loop().time,
        held_gauge=held,
        hold_seconds=seconds,
        poll_s=poll_s,
    )
    return hold, registry


async def test_an_engine_with_room_takes_the_request_at_once() -> None:
    hold, _ = hold_over({"p0": 0.9, "p1": 0.45})
    assert await hold.admit(slo_ttft_s=OBJECTIVE, tokens=3000) == 0.0


async def test_no_prefill_engine_holds_nothing() -> None:
    hold, _ = hold_over({})
    assert await hold.admit(slo_ttft_s=OBJECTIVE, tokens=3000) == 0.0


async def test_held_requests_go_in_arrival_order_as_engines_free() -> None:
    """The module docstring's example: engines at 0.9 s and 0.7 s → held; a prefill ends on p1
    (0.45 s left) and the first held request goes; the second waits for the next."""
    queues = {"p0": 0.9, "p1": 0.7}
    hold, metrics = hold_over(queues, poll_s=10.0)  # only wake-ups move them
    sent: list[str] = []

    async def request(name: str) -> None:
        await hold.admit(slo_ttft_s=OBJECTIVE, tokens=3000)
        sent.append(name)
        queues["p1"] += 0.2  # the router counts its work on the engine it went to

    first = asyncio.create_task(request("first"))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(request("second"))
    await asyncio.sleep(0.01)
    assert sent == [] and hold.held == 2 and hold.held_tokens == 6000
    assert metrics.get_sample_value("held") == 2
    queues["p1"] = 0.45
    hold.wake()  # a prefill ended
    await first
    await asyncio.sleep(0.01)
    assert sent == ["first"] and hold.held == 1  # p1 is at 0.65 s now: the second still waits
    queues["p1"] = 0.3
    hold.wake()
    await second
    assert sent == ["first", "second"] and hold.held == 0


async def test_a_new_engine_takes_the_first_held_request() -> None:
    queues = {"p0": 1.5}
    hold, _ = hold_over(queues, poll_s=10.0)
    task = asyncio.create_task(hold.admit(slo_ttft_s=OBJECTIVE, tokens=3000))
    await asyncio.sleep(0.01)
    assert not task.done()
    queues["p1"] = 0.0  # the autoscaler's new engine joined the pool
    hold.wake()  # the registry's membership listener
    assert await task > 0


async def test_a_missed_wake_up_costs_a_tick() -> None:
    queues = {"p0": 1.5}
    hold, _ = hold_over(queues, poll_s=0.02)
    task = asyncio.create_task(hold.admit(slo_ttft_s=OBJECTIVE, tokens=3000))
    await asyncio.sleep(0.01)
    queues["p0"] = 0.1  # no wake-up
    assert 0 < await asyncio.wait_for(task, 1.0) < 1.0


async def test_a_request_is_held_at_most_its_objective() -> None:
    hold, metrics = hold_over({"p0": 5.0}, poll_s=0.01)
    held = await hold.admit(slo_ttft_s=0.1, tokens=3000)
    assert held == pytest.approx(0.1, abs=0.05)
    assert metrics.get_sample_value("hold_seconds_sum") == pytest.approx(held)


async def test_a_client_that_leaves_is_withdrawn_and_the_next_one_moves_up() -> None:
    queues = {"p0": 1.5}
    hold, _ = hold_over(queues, poll_s=10.0)
    leaving = asyncio.create_task(hold.admit(slo_ttft_s=OBJECTIVE, tokens=1000))
    await asyncio.sleep(0.01)
    staying = asyncio.create_task(hold.admit(slo_ttft_s=OBJECTIVE, tokens=2000))
    await asyncio.sleep(0.01)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert hold.held == 1 and hold.held_tokens == 2000
    queues["p0"] = 0.2
    hold.wake()
    assert await staying > 0 and hold.held == 0


# ------------------------------------------------------------------------------ in the real router


@pytest.mark.parametrize("late", [True, False], ids=["late-binding", "off"])
async def test_prefills_wait_in_the_gateway_while_the_prefill_engine_is_busy(
    launcher: Launcher, late: bool
) -> None:
    """A prefill engine that takes 1 s per prompt and a 3 s objective (a prompt may be sent behind
    0.75 s of work): once the router has learned its speed, three prompts at once reach it one at a
    time with late binding, all three at once without."""
    prefill = await launcher.engine("p0", answer_delay=1.0)
    decode = await launcher.engine("d0")
    router = await launcher.router(
        decode=[decode],
        prefill=[prefill],
        mode="always",
        spec={"disaggregation": {"convertibleDecoders": False, "latePrefillBinding": late}},
    )
    slo = {"x-slo-ttft-ms": "3000"}

    async def complete(seed: int) -> str:
        raw = await router.openai.completions.with_raw_response.create(
            model=MODEL, prompt=prompt(seed), max_tokens=1, extra_headers=slo
        )
        return raw.headers.get("x-tandem-prefill-endpoint", "")

    assert await complete(1) != ""  # learns the prefill engine's 1 s
    prefill.most_open = 0
    assert all(await asyncio.gather(*(complete(seed) for seed in (2, 3, 4))))
    assert prefill.most_open == (1 if late else 3)
    held = await metric(router, "tandem_router_pd_prefill_hold_seconds_count")
    assert held == (4 if late else 0)
