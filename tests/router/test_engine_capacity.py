"""Dispatching into capacity: each engine's concurrency from the spec's engine arguments, learned from
its own running and waiting counts, shared between gateway processes; and, end to end, the backlog
waiting in the gateway's fair queue rather than in the engine's.

Pure tables and stories (no clock needed: learning follows readings), then real servers on 127.0.0.1:
a router in front of a fake engine that counts how many requests it holds at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.router.fake_engine import FakeEngine
from tests.router.harness import MODEL, Launcher, RunningRouter, metric
from tests.router.scheduling_builders import A, snapshot, stats

from tandem.router.discovery.capacity import DEFAULT_CAPACITY, EngineCapacity, capacity_from_args, kv_bound
from tandem.router.settings import AdmissionSettings, RouterSettings


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], None),
        (["--max-num-seqs", "4"], 4),
        (["--enforce-eager", "--max-num-seqs=32"], 32),
        (["--max-num-seqs"], None),
        (["--max-num-seqs", "zero"], None),
        (["--max-num-seqs-extra", "9"], None),
    ],
)
def test_the_pools_concurrency_comes_from_max_num_seqs(args: list[str], expected: int | None) -> None:
    assert capacity_from_args(args) == expected


@pytest.mark.parametrize(
    ("initial", "lookahead", "share", "cap", "limit"),
    [
        (4, 0.1, 1, 1000, 4),  # 0.4 rounds to no lookahead: a small engine's queue stays empty
        (8, 0.1, 2, 1000, 5),  # the docstring's example: two workers, ceil((8 + 1) / 2) each
        (256, 0.1, 1, 1000, 282),  # 256 + 26
        (5, 0.1, 2, 1000, 3),  # 0.5 rounds up: ceil(6 / 2)
        (256, 0.1, 1, 100, 100),  # the operator's cap wins
        (4, 0.25, 1, 1000, 5),
    ],
)
def test_the_dispatch_limit_is_capacity_plus_lookahead_shared_and_capped(
    initial: int, lookahead: float, share: int, cap: int, limit: int
) -> None:
    capacity = EngineCapacity(initial=initial, lookahead=lookahead, share=share, cap=cap)
    assert capacity.limit(snapshot(A)) == limit


def test_concurrency_is_learned_from_what_the_engine_runs_and_what_waits() -> None:
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)

    def learn(running: int, waiting: int, *, stale: bool = False) -> int:
        return capacity.concurrency(snapshot(A, engine=stats(running=running, waiting=waiting), stale=stale))

    # Its KV cache holds 100 sequences: it runs 100 and queues the rest, three readings in a row.
    assert [learn(100, 30), learn(100, 5), learn(100, 12)] == [DEFAULT_CAPACITY, DEFAULT_CAPACITY, 100]
    # Running everything it was sent, at least as many as believed: a quarter more is tried.
    assert learn(100, 0) == 125
    assert learn(130, 0) == 157  # 125 + 32
    # Less running and nothing waiting says nothing about the limit.
    assert learn(3, 0) == 157
    # Stale numbers are not used.
    assert learn(7, 9, stale=True) == 157


def test_a_request_caught_waiting_for_the_engines_next_step_does_not_shrink_it() -> None:
    """At saturation a scrape sometimes lands while a just-arrived request waits for the next engine
    step: running 3 of 4, waiting 1. Believing it once would cap the engine at 3 for good (the gateway
    never sends a 4th to see it run one)."""
    capacity = EngineCapacity(initial=256, lookahead=0.0)

    def learn(running: int, waiting: int) -> int:
        return capacity.concurrency(snapshot(A, engine=stats(running=running, waiting=waiting)))

    readings = [(40, 0), (39, 1), (40, 0), (39, 1), (39, 1), (40, 0), (38, 1), (39, 1), (40, 0)]
    assert [learn(r, w) for r, w in readings] == [256] * len(readings)
    # Held back at the same count three times in a row is the engine's limit (its --max-num-seqs
    # is not known here) ...
    assert [learn(39, 2), learn(39, 1), learn(39, 4)] == [256, 256, 39]
    # ... and if that was a passing state after all, C grows back while the engine runs all it gets,
    # by a quarter per reading.
    assert [learn(39, 0), learn(49, 0), learn(62, 0), learn(78, 0)] == [49, 62, 78, 98]


def test_readings_taken_while_the_engine_is_still_in_the_same_step_say_nothing() -> None:
    """A slow engine (vLLM on CPU, a long prefill) takes longer than the scrape interval per step:
    requests that arrived meanwhile wait for the next step while running stays the same. Scrapes in
    the same step (its prompt + generation token counters have not moved) are not readings in a row."""
    capacity = EngineCapacity(initial=256, lookahead=0.0)

    def learn(running: int, waiting: int, tokens: float) -> int:
        return capacity.concurrency(
            snapshot(A, engine=stats(running=running, waiting=waiting, tokens=tokens))
        )

    # One long step seen by five scrapes: running 40, more and more waiting; it counts once.
    assert [learn(40, w, tokens=1000) for w in (3, 9, 14, 20, 26)] == [256] * 5
    # Three steps that each end holding requests back at the same count are the engine's limit.
    assert [learn(40, 5, tokens=1500), learn(40, 6, tokens=1900)] == [256, 40]


def test_below_a_known_max_num_seqs_only_a_full_kv_cache_is_believed() -> None:
    """Batches of equal requests finish together; a scrape every second can land on the same passing
    moment each time. With --max-num-seqs 4 known, that is not learned; a full KV cache is."""
    capacity = EngineCapacity(initial=4, lookahead=0.0, ceiling=4)

    def learn(running: int, waiting: int, kv: float) -> int:
        return capacity.concurrency(snapshot(A, engine=stats(running=running, waiting=waiting, kv_usage=kv)))

    assert [learn(3, 1, 0.1) for _ in range(5)] == [4] * 5
    # Full: each reading bounds C at once (3 / 0.95 → 3), and the third in a row is learned.
    assert [learn(3, 1, 0.95), learn(3, 2, 0.97), learn(3, 1, 0.96)] == [3, 3, 3]
    assert [learn(3, 0, 0.5), learn(4, 0, 0.5)] == [4, 4]  # grows back, never above the known 4


@pytest.mark.parametrize(
    ("running", "usage", "bound"),
    [
        (20, 0.9, 22),  # the docstring's example
        (20, 1.0, 20),
        (20, 1.3, 20),  # never below what it runs
        (20, 0.8, 25),
        (20, 0.79, None),  # below KV_BOUND_FROM: unequal requests would make the share say full too soon
        (0, 0.95, None),  # nothing running: no share to measure
        (5, None, None),
    ],
)
def test_a_filling_kv_cache_bounds_the_engine_at_its_running_share(
    running: int, usage: float | None, bound: int | None
) -> None:
    assert kv_bound(stats(running=running, kv_usage=usage)) == bound


def test_the_kv_bound_holds_at_once_and_lifts_with_the_next_reading_below_it() -> None:
    """At a step the engine's cache fills in less time than three readings take: the first reading
    of a filling cache stops more being sent (nothing waits in the engine yet), and it is not learned,
    so the next reading with room gives the engine its C back."""
    capacity = EngineCapacity(initial=256, lookahead=0.1)

    def limit(running: int, waiting: int, kv: float, tokens: float) -> int:
        reading = stats(running=running, waiting=waiting, kv_usage=kv, tokens=tokens)
        return capacity.limit(snapshot(A, engine=reading))

    assert limit(10, 0, 0.45, tokens=100) == 282  # 256 + 26: room
    assert limit(19, 0, 0.86, tokens=200) == 24  # ⌊19 / 0.86⌋ = 22, + 2 lookahead
    assert limit(19, 0, 0.86, tokens=200) == 24  # the same step again: the same bound
    assert limit(12, 0, 0.55, tokens=300) == 282  # requests ended: lifted, nothing was learned
    # A stale reading says nothing, and neither does the bound it carried.
    reading = stats(running=19, waiting=3, kv_usage=0.95, tokens=400)
    assert capacity.limit(snapshot(A, engine=reading, stale=True)) == 282


async def two_seq_router(
    launcher: Launcher, *, tokens: int, handover: int
) -> tuple[FakeEngine, RunningRouter]:
    """A fake engine streaming `tokens` tokens, behind a router told it runs `--max-num-seqs 2`."""
    engine = await launcher.engine("d0", tokens=tokens, token_delay=0.05)
    settings = RouterSettings(admission=AdmissionSettings(poll_seconds=0.02, handover_tokens=handover))
    spec: dict[str, dict[str, Any]] = {
        "engine": {"kind": "sim", "args": ["--max-num-seqs", "2"]},
        "router": {"slo": {"ttftSeconds": 60}},
    }
    return engine, await launcher.router(decode=[engine], settings=settings, spec=spec)


async def streamed_texts(router: RunningRouter, i: int, *, max_tokens: int) -> int:
    """Request i streamed to its end through the router; its chunks with text."""
    stream = await router.openai.completions.create(
        model=MODEL, prompt=f"p{i}", max_tokens=max_tokens, stream=True
    )
    return len([chunk async for chunk in stream if chunk.choices and chunk.choices[0].text])


async def test_the_backlog_waits_in_the_gateway_not_in_the_engine(launcher: Launcher) -> None:
    engine, router = await two_seq_router(launcher, tokens=3, handover=0)
    await asyncio.gather(*(streamed_texts(router, i, max_tokens=3) for i in range(10)))
    assert engine.most_open == 2  # --max-num-seqs 2 (no lookahead at 2): the rest waited in the gateway
    assert len(engine.received) == 10


@pytest.mark.parametrize(("handover", "most_open"), [(0, 2), (2, 4)])
async def test_a_stream_near_its_end_hands_its_slot_to_the_next_request(
    launcher: Launcher, handover: int, most_open: int
) -> None:
    """--max-num-seqs 2, streams of exactly max_tokens = 8: with a handover of 2 tokens, the next
    two requests reach the engine while the first two stream their last tokens (4 open at once,
    never more); without it the engine never holds more than its 2."""
    engine, router = await two_seq_router(launcher, tokens=8, handover=handover)
    assert await asyncio.gather(*(streamed_texts(router, i, max_tokens=8) for i in range(6))) == [8] * 6
    assert engine.most_open == most_open
    assert await metric(router, "tandem_router_admitted_requests") == 0
    assert await metric(router, "tandem_router_pool_in_flight_requests", pool="decode") == 0
