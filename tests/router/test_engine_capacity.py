"""Dispatching into capacity: each engine's concurrency from the spec's engine arguments, learned from
its own running and waiting counts, shared between gateway processes; and, end to end, the backlog
waiting in the gateway's fair queue rather than in the engine's.

Pure tables and stories (no clock needed: learning follows readings), then real servers on 127.0.0.1:
a router in front of a fake engine that counts how many requests it holds at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.router.fake_engine import FakeEngine
from tests.router.harness import MODEL, Launcher, RunningRouter, metric
from tests.router.scheduling_builders import A, B, C, snapshot, stats

from tandem.router.discovery.capacity import (
    CONFIRM,
    DEFAULT_CAPACITY,
    RECHECK_FIRST,
    EngineCapacity,
    capacity_from_args,
    kv_bound,
)
from tandem.router.settings import AdmissionSettings, RouterSettings
from tandem.router.types import Endpoint


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
        (4, 0.0, 1, 1000, 4),  # the default: no lookahead, nothing queued in the engine by design
        (4, 0.1, 1, 1000, 4),  # 0.4 rounds to no lookahead: a small engine's queue stays empty
        (8, 0.1, 2, 1000, 5),  # two workers, ceil((8 + 1) / 2) each
        (8, 0.0, 2, 1000, 4),  # the docstring's example: ceil(8 / 2)
        (256, 0.1, 1, 1000, 282),  # 256 + 26
        (5, 0.1, 2, 1000, 3),  # 0.5 rounds up: ceil(6 / 2)
        (256, 0.0, 1, 100, 100),  # the operator's cap wins
        (4, 0.25, 1, 1000, 5),
    ],
)
def test_the_dispatch_limit_is_capacity_plus_lookahead_shared_and_capped(
    initial: int, lookahead: float, share: int, cap: int, limit: int
) -> None:
    capacity = EngineCapacity(initial=initial, lookahead=lookahead, share=share, cap=cap)
    assert capacity.limit(snapshot(A)) == limit


def learner(capacity: EngineCapacity) -> Callable[..., int]:
    """`learn(running, waiting, ...)`: C after a reading of endpoint A; every reading is a new one, and
    a new engine step unless `tokens` says otherwise."""
    step = iter(range(1, 1_000_000))

    def learn(
        running: int, waiting: int, *, kv: float | None = 0.1, tokens: float | None = None,
        started: float | None = None, stale: bool = False,
    ) -> int:  # fmt: skip
        reading = stats(
            running=running, waiting=waiting, kv_usage=kv, started=started,
            tokens=float(next(step)) if tokens is None else tokens,
        )  # fmt: skip
        return capacity.concurrency(snapshot(A, engine=reading, stale=stale))

    return learn


def test_a_held_back_engine_teaches_its_limit_and_the_limit_is_held() -> None:
    """`--max-num-seqs 4` on the engine, nothing declared: three readings holding requests back at 4
    make C 4, confirmed; running everything it is sent at 4 does not grow C (that would put requests
    in the engine's queue, ahead of a tenant who arrives later)."""
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    learn = learner(capacity)
    assert [learn(4, 8), learn(4, 8), learn(4, 7)] == [DEFAULT_CAPACITY, DEFAULT_CAPACITY, 4]
    known = capacity.known(A.url)
    assert known is not None and known.confirmed and known.kind == "seqs"
    assert [learn(4, 0) for _ in range(RECHECK_FIRST - 1)] == [4] * (RECHECK_FIRST - 1)
    assert [learn(3, 0), learn(0, 0)] == [4, 4]  # less running says nothing


def test_a_confirmed_slot_count_is_checked_by_one_request_now_and_then() -> None:
    """Every RECHECK_FIRST readings at the limit (then twice as many, and so on) one more request is
    allowed; queued at the limit, it confirms the limit in one reading; run, it lets C grow again."""
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    learn = learner(capacity)
    [learn(4, 8) for _ in range(CONFIRM)]
    saturated = [learn(4, 0) for _ in range(RECHECK_FIRST)]
    assert saturated == [4] * (RECHECK_FIRST - 1) + [5]  # the check: one more request
    assert learn(4, 0) == 5  # the extra request has not reached it yet: still checking
    assert learn(4, 1) == 4  # queued behind the 4 running: the limit stands, confirmed at once
    saturated = [learn(4, 0) for _ in range(2 * RECHECK_FIRST)]
    assert saturated == [4] * (2 * RECHECK_FIRST - 1) + [5]  # the next check comes twice as late
    # This time it runs the fifth: its limit grew (a restarted engine that kept its start time, or
    # another gateway's limit); C grows by quarters again, unconfirmed, until it holds back again.
    assert [learn(5, 0), learn(7, 0), learn(7, 3), learn(7, 3), learn(7, 2)] == [7, 9, 9, 9, 7]


def test_a_request_caught_waiting_for_the_engines_next_step_does_not_shrink_it() -> None:
    """At saturation a scrape sometimes lands while a just-arrived request waits for the next engine
    step: running 39 of 40, waiting 1. Believing it once would cap the engine at 39 for good."""
    capacity = EngineCapacity(initial=256)
    learn = learner(capacity)
    readings = [(40, 0), (39, 1), (40, 0), (39, 1), (39, 1), (40, 0), (38, 1), (39, 1), (40, 0)]
    assert [learn(r, w) for r, w in readings] == [256] * len(readings)
    # Held back at the same count three times in a row is the engine's limit.
    assert [learn(39, 2), learn(39, 1), learn(39, 4)] == [256, 256, 39]


def test_a_burst_is_learned_in_two_readings_when_the_second_shows_what_had_waited() -> None:
    """A burst of 16 reaches an engine of 4 slots between two scrapes: the first reading after it
    (12 waiting, 16 sent since) proves nothing, since those could have arrived a moment before; the
    second (11 still waiting, nothing sent since) shows requests that waited through engine steps at
    running 4: C is 4, confirmed, without the third reading."""
    from tandem.router.types import EndpointSnapshot, EngineReading

    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)

    def learn(running: int, waiting: int, *, sent: int, tokens: float) -> int:
        reading = EngineReading(
            stats=stats(running=running, waiting=waiting, kv_usage=0.1, tokens=tokens),
            scraped_at=0.0,
            stale=False,
            sent=sent,
        )
        view = EndpointSnapshot(
            endpoint=A, in_flight=16, consecutive_failures=0, in_rotation=True, engine=reading
        )
        return capacity.concurrency(view)

    assert learn(0, 0, sent=0, tokens=0.0) == DEFAULT_CAPACITY  # before the burst
    assert learn(4, 12, sent=16, tokens=100.0) == DEFAULT_CAPACITY
    assert learn(4, 11, sent=16, tokens=200.0) == 4
    # A second reading whose waiting requests may all have just been sent is not proof: three readings.
    other = EngineCapacity(initial=DEFAULT_CAPACITY)
    capacity = other
    assert [learn(4, 3, sent=n, tokens=100.0 * n) for n in (10, 13, 16)] == [DEFAULT_CAPACITY] * 2 + [4]


def test_readings_taken_while_the_engine_is_still_in_the_same_step_say_nothing() -> None:
    """A slow engine (vLLM on CPU, a long prefill) takes longer than the scrape interval per step:
    requests that arrived meanwhile wait for the next step while running stays the same. Scrapes in
    the same step (its prompt + generation token counters have not moved) are not readings in a row."""
    capacity = EngineCapacity(initial=256)
    learn = learner(capacity)
    # One long step seen by five scrapes: running 40, more and more waiting; it counts once.
    assert [learn(40, w, tokens=1000) for w in (3, 9, 14, 20, 26)] == [256] * 5
    # Three steps that each end holding requests back at the same count are the engine's limit.
    assert [learn(40, 5, tokens=1500), learn(40, 6, tokens=1900)] == [256, 40]


def test_an_engine_that_runs_more_than_believed_raises_c_to_that() -> None:
    """Another gateway sends to it too, or its limit grew: what it runs is a lower bound, unconfirmed."""
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    learn = learner(capacity)
    [learn(4, 8) for _ in range(CONFIRM)]
    assert learn(6, 0) == 6
    known = capacity.known(A.url)
    assert known is not None and not known.confirmed
    assert learn(6, 0) == 8  # unconfirmed: grows by a quarter while it runs everything


def test_a_restarted_engine_keeps_its_c_as_a_start_value_and_relearns_it() -> None:
    """A pod restarted with another --max-num-seqs: its counters' start time changed, so its limit is
    found again, smaller by holding back, larger by growing."""
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    learn = learner(capacity)
    [learn(8, 8, started=1000.0) for _ in range(CONFIRM)]
    assert learn(8, 0, started=1000.0) == 8
    assert learn(8, 0, started=2000.0) == 10  # a new start: unconfirmed, so it may grow
    assert [learn(6, 4, started=2000.0) for _ in range(CONFIRM)] == [10, 10, 6]
    # Counters that went backwards say the same on an engine without a start time.
    [learn(6, 0, tokens=t) for t in (5000.0, 5100.0)]
    assert learn(6, 0, tokens=10.0) == 8


def test_a_new_engine_starts_at_its_pools_confirmed_capacity_not_at_256() -> None:
    """An engine the autoscaler adds to a pool whose engines hold a confirmed C of 4 and 5 starts at
    4, unconfirmed, before and after its first reading (so a queue of prefilled requests is not
    handed to it at once); it still grows when it runs all it is sent. An engine of the other pool,
    whose engines have confirmed nothing, starts at 256."""
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    tokens = iter(range(1, 1_000))

    def read(endpoint: Endpoint, running: int, waiting: int) -> int:
        reading = stats(running=running, waiting=waiting, kv_usage=0.1, tokens=float(next(tokens)))
        return capacity.concurrency(snapshot(endpoint, engine=reading))

    for endpoint, c in ((A, 5), (B, 4)):
        assert [read(endpoint, c, 3) for _ in range(CONFIRM)][-1] == c
    assert capacity.concurrency(snapshot(C)) == 4  # no reading yet
    assert read(C, 0, 0) == 4
    known = capacity.known(C.url)
    assert known is not None and not known.confirmed
    assert read(C, 4, 0) == 5  # it ran all it was sent: a start value grows by a quarter
    prefill = Endpoint("prefill", "http://10.0.1.1:8000")
    assert capacity.concurrency(snapshot(prefill)) == DEFAULT_CAPACITY
    assert read(prefill, 0, 0) == DEFAULT_CAPACITY


def test_an_engine_still_at_its_start_value_takes_the_pools_c_when_a_peer_confirms_it() -> None:
    """A fresh gateway, four engines at 256, a flood sent to all: the first engine confirmed at 4
    brings the others still at 256 (never seen running more than 4) down to 4, unconfirmed, so that
    a request recalled from it (or a newcomer) waits in the gateway rather than in another engine's
    queue, and they recall their own excess at their next reading. One seen running more keeps its C;
    the other pool's engines keep theirs; one that can run more grows again by quarters."""
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    tokens = iter(range(1, 1_000))
    engines = {url: Endpoint("decode", url) for url in ("http://10.0.0.1:8000", "http://10.0.0.2:8000")}
    engines["bigger"] = Endpoint("decode", "http://10.0.0.3:8000")
    prefill = Endpoint("prefill", "http://10.0.1.1:8000")

    def read(endpoint: Endpoint, running: int, waiting: int) -> int:
        reading = stats(running=running, waiting=waiting, kv_usage=0.1, tokens=float(next(tokens)))
        return capacity.concurrency(snapshot(endpoint, engine=reading, in_flight=14))

    first, second, bigger = engines.values()
    assert read(second, 4, 10) == DEFAULT_CAPACITY  # held back once: not yet its limit
    assert read(bigger, 6, 0) == DEFAULT_CAPACITY
    assert read(prefill, 4, 10) == DEFAULT_CAPACITY
    assert [read(first, 4, 10) for _ in range(CONFIRM)][-1] == 4
    assert capacity.concurrency(snapshot(second)) == 4, "the pool's C before its own next reading"
    known = capacity.known(second.url)
    assert known is not None and not known.confirmed
    assert capacity.concurrency(snapshot(bigger)) == DEFAULT_CAPACITY, "it ran 6: not a start value"
    assert capacity.concurrency(snapshot(prefill)) == DEFAULT_CAPACITY, "another pool"
    assert [read(second, 4, 9), read(second, 4, 8)] == [4, 4]
    known = capacity.known(second.url)
    assert known is not None and known.confirmed, "its own readings confirm it as before"

    other = EngineCapacity(initial=DEFAULT_CAPACITY)
    capacity = other
    [read(first, 4, 10) for _ in range(CONFIRM)]
    assert [read(second, 4, 0), read(second, 5, 0), read(second, 7, 0)] == [5, 7, 9], "it grows if it can"


def test_below_a_declared_max_num_seqs_only_a_full_kv_cache_is_believed() -> None:
    """Batches of equal requests finish together; a scrape every second can land on the same passing
    moment each time. With --max-num-seqs 4 declared, that is not learned; a full KV cache is."""
    capacity = EngineCapacity(initial=4, ceiling=4)
    learn = learner(capacity)
    assert [learn(3, 1, kv=0.1) for _ in range(5)] == [4] * 5
    # Full: each reading bounds C at once (3 / 0.95 → 3), and the third in a row is learned.
    assert [learn(3, 1, kv=0.95), learn(3, 2, kv=0.97), learn(3, 1, kv=0.96)] == [3, 3, 3]
    assert [learn(3, 0, kv=0.5), learn(4, 0, kv=0.5)] == [4, 4]  # grows back, never above the declared 4


def test_a_kv_bound_limit_follows_the_caches_room() -> None:
    """vLLM's default 256 slots, a KV cache that holds about 40 of these requests: held back at 40
    with the cache full, C is 40 (kind kv); as requests get shorter the cache has room and C grows to
    what it holds when full, a quarter at most per reading."""
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    learn = learner(capacity)
    assert [learn(40, 20, kv=0.97) for _ in range(CONFIRM)] == [41, 41, 40]  # bounded at once, then learned
    known = capacity.known(A.url)
    assert known is not None and known.kind == "kv"
    assert learn(40, 0, kv=1.0) == 40  # no room: held
    assert learn(40, 0, kv=0.95) == 42  # room for ⌊40 / 0.95⌋ = 42
    assert learn(42, 0, kv=0.6) == 53  # room for ⌊42 / 0.6⌋ = 70: a quarter more now
    assert learn(53, 0, kv=0.8) == 66


def test_learning_is_while_the_gateway_sends_more_than_the_engine_was_seen_running() -> None:
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    assert not capacity.learning(snapshot(A))  # nothing sent, nothing read
    assert capacity.learning(snapshot(A, in_flight=12))  # sending before any reading
    reading = stats(running=4, waiting=8, kv_usage=0.1, tokens=1.0)
    assert capacity.learning(snapshot(A, in_flight=12, engine=reading))
    # Within what it ran, but that reading held requests back: the next readings decide.
    assert capacity.learning(snapshot(A, in_flight=4, engine=reading))
    calm = stats(running=4, waiting=0, kv_usage=0.1, tokens=1.5)
    assert not capacity.learning(snapshot(A, in_flight=4, engine=calm))  # within what it ran, nothing held
    filling = stats(running=4, waiting=0, kv_usage=0.85, tokens=1.7)
    assert capacity.learning(snapshot(A, in_flight=4, engine=filling))  # bounded by its KV cache
    for tokens in (2.0, 3.0, 4.0):
        reading = stats(running=4, waiting=8, kv_usage=0.1, tokens=tokens)
        capacity.concurrency(snapshot(A, engine=reading))
    assert not capacity.learning(snapshot(A, in_flight=12, engine=reading))  # confirmed: nothing to learn


def test_the_dispatch_limit_of_a_learned_engine_is_shared_between_gateway_processes() -> None:
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY, share=2)
    learn = learner(capacity)
    [learn(4, 8) for _ in range(CONFIRM)]
    assert capacity.limit(snapshot(A)) == 2


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


def test_the_kv_bound_holds_at_once_and_a_start_value_stays_bounded() -> None:
    """At a step the engine's cache fills in less time than the confirming readings take: the first
    reading of a filling cache stops more being sent (nothing waits in the engine yet). A start value
    (256, nothing declared or learned) becomes the bound, unconfirmed: the next reading with room does
    not give the flood back; the engine grows by a quarter per reading while it runs all it gets."""
    capacity = EngineCapacity(initial=256, lookahead=0.1)

    def limit(running: int, waiting: int, kv: float, tokens: float) -> int:
        reading = stats(running=running, waiting=waiting, kv_usage=kv, tokens=tokens)
        return capacity.limit(snapshot(A, engine=reading))

    assert limit(10, 0, 0.45, tokens=100) == 282  # 256 + 26: room
    assert limit(19, 0, 0.86, tokens=200) == 24  # ⌊19 / 0.86⌋ = 22, + 2 lookahead
    assert limit(19, 0, 0.86, tokens=200) == 24  # the same step again: the same bound
    assert limit(12, 0, 0.55, tokens=300) == 24  # requests ended: C stays at 22, unconfirmed
    assert limit(22, 0, 0.6, tokens=400) == 31  # all 22 run, nothing waits: 22 + 6, + 3 lookahead
    # A stale reading says nothing, and neither does the bound it carried.
    reading = stats(running=19, waiting=3, kv_usage=0.99, tokens=500)
    assert capacity.limit(snapshot(A, engine=reading, stale=True)) == 31


def test_a_confirmed_c_is_bounded_by_a_filling_cache_only_while_it_fills() -> None:
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    learn = learner(capacity)
    [learn(40, 8) for _ in range(CONFIRM)]  # a slot count of 40, confirmed
    assert learn(30, 0, kv=0.95) == 31  # long answers fill the cache: bounded at once
    assert learn(30, 0, kv=0.5) == 40  # the next reading with room lifts it


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


def test_an_engine_that_preempts_at_c_holds_one_less() -> None:
    """A KV cache of 128 blocks and answers that end at 22 blocks: the engine admits 6 or 7 and
    pre-empts (recomputes) as they grow; each reading with new pre-emptions at C takes C one down, to
    where the cache sustains what runs; C then stays (kind kv: it grows only with room in the cache)."""
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    step = iter(range(1, 1000))

    def learn(running: int, waiting: int, *, kv: float, preemptions: float) -> int:
        reading = stats(running=running, waiting=waiting, kv_usage=kv, tokens=float(next(step)),
                        preemptions=preemptions)  # fmt: skip
        return capacity.concurrency(snapshot(A, engine=reading))

    assert [learn(6, 8, kv=0.97, preemptions=0) for _ in range(CONFIRM)] == [6, 6, 6]
    assert learn(6, 0, kv=0.95, preemptions=0) == 6
    assert learn(5, 1, kv=0.8, preemptions=2) == 5  # pre-empted at C: one less, at once
    known = capacity.known(A.url)
    assert known is not None and known.confirmed and known.kind == "kv"
    assert learn(5, 0, kv=0.86, preemptions=2) == 5  # no room for a sixth (5 / 0.86 = 5.8)
    assert learn(2, 0, kv=0.3, preemptions=2) == 5  # fewer running: nothing learned
    assert learn(5, 0, kv=0.4, preemptions=2) == 7  # shorter answers: room for 11, a quarter more now


def test_a_lone_preemption_at_a_kv_limit_passes_and_two_readings_in_a_row_take_it_down() -> None:
    """Answers of staggered lengths that fit the cache at C line up at their longest now and then: one
    request pre-empted in a reading after one without keeps C (kind kv); pre-emptions in two readings in
    a row take it one down."""
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    step = iter(range(1, 1000))

    def learn(running: int, *, kv: float, preemptions: float, waiting: int = 0) -> int:
        reading = stats(running=running, waiting=waiting, kv_usage=kv, tokens=float(next(step)),
                        preemptions=preemptions)  # fmt: skip
        return capacity.concurrency(snapshot(A, engine=reading))

    assert [learn(6, kv=0.97, preemptions=0, waiting=8) for _ in range(CONFIRM)] == [6, 6, 6]
    assert learn(6, kv=0.93, preemptions=1) == 6  # one, after a reading without: let pass
    assert learn(6, kv=0.95, preemptions=1) == 6
    assert learn(5, kv=0.8, preemptions=2, waiting=1) == 6  # one again, after a reading without
    assert learn(5, kv=0.85, preemptions=3, waiting=1) == 5  # a second reading in a row: one less
    known = capacity.known(A.url)
    assert known is not None and known.confirmed and known.kind == "kv"


def test_a_lone_preemption_still_takes_an_unconfirmed_limit_down() -> None:
    """Before C is known (256, nothing declared) one pre-emption is a cache that does not hold what runs."""
    capacity = EngineCapacity(initial=DEFAULT_CAPACITY)
    step = iter(range(1, 1000))

    def learn(running: int, preemptions: float) -> int:
        reading = stats(running=running, waiting=0, kv_usage=0.5, tokens=float(next(step)),
                        preemptions=preemptions)  # fmt: skip
        return capacity.concurrency(snapshot(A, engine=reading))

    assert learn(7, 0) == 256
    assert learn(7, 1) == 6


def test_a_declared_engine_that_preempts_holds_one_less_too() -> None:
    capacity = EngineCapacity(initial=8, ceiling=8)
    learn = learner(capacity)
    assert learn(8, 0) == 8
    reading = stats(running=7, waiting=1, kv_usage=0.5, tokens=100.0, preemptions=0)
    assert capacity.concurrency(snapshot(A, engine=reading)) == 8  # below it, held back: not believed
    reading = stats(running=7, waiting=1, kv_usage=0.5, tokens=200.0, preemptions=3)
    assert capacity.concurrency(snapshot(A, engine=reading)) == 7  # pre-empted: its cache ran out at 8


async def test_a_gateway_told_nothing_learns_an_engines_slots_and_keeps_the_backlog() -> None:
    """A real simulated engine with `--max-num-seqs 2`, a gateway whose spec says nothing of it: a
    burst of 12 streams is learned from the engine's own numbers (held back at 2), the gauges say so,
    and from then on the engine holds no more waiting than the handover sends ahead."""
    import httpx
    from tests.router.servers import serve

    from tandem.core.routerconfig import RouterConfig
    from tandem.router.app import create_app as router_app
    from tandem.sim.app import create_app as sim_app
    from tandem.sim.settings import SimSettings

    sim = SimSettings(profile="tiny-cpu", served_model_name="qwen", time_scale=10, max_num_seqs=2, seed=1)
    async with serve(sim_app(sim)) as engine:
        config = RouterConfig.model_validate(
            {
                "service": "capacity-test",
                "spec": {
                    "model": {"name": "tiny", "servedName": "qwen"},
                    "engine": {"kind": "sim"},
                    "decode": {"replicas": 1},
                    "disaggregation": {"mode": "off"},
                    "router": {"slo": {"ttftSeconds": 60}},
                },
                "discovery": {"kind": "static", "decode": [engine.url]},
            }
        )
        settings = RouterSettings.model_validate(
            {"collector": {"interval_seconds": 0.2, "learning_interval_seconds": 0.05}}
        )
        async with (
            serve(router_app(config, settings=settings)) as router,
            httpx.AsyncClient(timeout=60, trust_env=False) as client,
        ):
            body = {"model": "qwen", "prompt": "hello", "max_tokens": 48, "stream": True, "ignore_eos": True}
            waiting: list[float] = []

            async def watch() -> None:  # the engine's own queue, while the burst runs
                while True:
                    page = (await client.get(f"{engine.url}/metrics")).text
                    line = next(x for x in page.splitlines() if x.startswith("vllm:num_requests_waiting{"))
                    waiting.append(float(line.rsplit(" ", 1)[1]))
                    await asyncio.sleep(0.02)

            async def send() -> None:
                async with client.stream("POST", f"{router.url}/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    async for _ in response.aiter_bytes():
                        pass

            watcher = asyncio.create_task(watch())
            await asyncio.gather(*(send() for _ in range(12)))
            first = list(waiting)
            waiting.clear()
            await asyncio.gather(*(send() for _ in range(12)))  # a second burst, C known
            watcher.cancel()
            page = (await client.get(f"{router.url}/metrics")).text
    name = engine.url.removeprefix("http://")

    def gauge(metric_name: str) -> float:
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name == metric_name and sample.labels.get("endpoint") == name:
                    return float(sample.value)
        raise AssertionError(f"{metric_name} for {name} not on the gateway's page")

    assert gauge("tandem_router_engine_capacity") == 2
    assert gauge("tandem_router_engine_capacity_confirmed") == 1
    assert gauge("tandem_router_engine_dispatch_limit") == 2
    assert max(first) > 0, "the first burst reached the engine before its slots were known"
    # The second burst waited in the gateway: at most the 2 requests sent as 2 streams neared their
    # end together (the handover) wait in the engine, against 10 with nothing learned.
    assert max(waiting) <= 2, waiting
