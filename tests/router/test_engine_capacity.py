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
from tests.router.harness import MODEL, Launcher
from tests.router.scheduling_builders import A, snapshot, stats

from tandem.router.discovery.capacity import DEFAULT_CAPACITY, EngineCapacity, capacity_from_args
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
        (4, 0.1, 1, 1000, 5),  # at least one request of lookahead
        (256, 0.1, 1, 1000, 282),  # 256 + 26
        (4, 0.1, 2, 1000, 3),  # two workers: ceil(5 / 2) each
        (256, 0.1, 1, 100, 100),  # the operator's cap wins
        (4, 0.0, 1, 1000, 5),  # still one of lookahead: an engine never waits for the gateway
    ],
)
def test_the_dispatch_limit_is_capacity_plus_lookahead_shared_and_capped(
    initial: int, lookahead: float, share: int, cap: int, limit: int
) -> None:
    capacity = EngineCapacity(initial=initial, lookahead=lookahead, share=share, cap=cap)
    assert capacity.limit(snapshot(A)) == limit


def test_concurrency_is_learned_from_what_the_engine_runs_and_what_waits() -> None:
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    # Its KV cache holds 100 sequences: it runs 100 and queues the rest.
    assert capacity.concurrency(snapshot(A, engine=stats(running=100, waiting=30))) == 100
    # The same reading again teaches nothing new; a busier moment does not raise it while it queues.
    assert capacity.concurrency(snapshot(A, engine=stats(running=100, waiting=5))) == 100
    # Running everything it was sent, more than believed: it can run at least that.
    assert capacity.concurrency(snapshot(A, engine=stats(running=110, waiting=0))) == 110
    # Less running and nothing waiting says nothing about the limit.
    assert capacity.concurrency(snapshot(A, engine=stats(running=3, waiting=0))) == 110
    # Stale numbers are not used.
    assert capacity.concurrency(snapshot(A, engine=stats(running=7, waiting=9), stale=True)) == 110


async def test_the_backlog_waits_in_the_gateway_not_in_the_engine(launcher: Launcher) -> None:
    engine = await launcher.engine("d0", tokens=3, token_delay=0.05)
    settings = RouterSettings(admission=AdmissionSettings(poll_seconds=0.02))
    spec: dict[str, dict[str, Any]] = {
        "engine": {"kind": "sim", "args": ["--max-num-seqs", "2"]},
        "router": {"slo": {"ttftSeconds": 60}},
    }
    router = await launcher.router(decode=[engine], settings=settings, spec=spec)

    async def one(i: int) -> None:
        stream = await router.openai.completions.create(
            model=MODEL, prompt=f"p{i}", max_tokens=3, stream=True
        )
        async for _ in stream:
            pass

    await asyncio.gather(*(one(i) for i in range(10)))
    assert engine.most_open == 3  # --max-num-seqs 2 plus one of lookahead: the rest waited in the gateway
    assert len(engine.received) == 10
