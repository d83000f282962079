"""Admission decisions as pure functions: saturation, capacity, deadlines, early rejection, Retry-After.

Nothing here waits or does I/O; `tandem.router.admission.gate` applies these rules on the event loop.

**Saturation.** An endpoint is saturated when the router has its `limit` of requests open to it (the
engine's learned concurrency plus a small lookahead, this process's share of it:
`tandem.router.discovery.capacity`), or, only if those checks are configured (off by default: a
scrape is up to a second old, and holding requests on one stalls the whole pool that long), when the
engine reports `max_waiting` or more requests waiting or a KV cache at least `max_kv_usage` full. The
gate admits while the router's admitted requests are fewer than the decode pool's **capacity**:

    capacity = Σ over decode endpoints in rotation of
               limit                   if the engine's own metrics do not say saturated
               min(limit, occupied)    if they do (it keeps what it runs, takes nothing new)

Example: 4 endpoints with `--max-num-seqs 8` (limit 9 each: one request of lookahead) → capacity 36;
the 37th concurrent request waits in the router's queue, where VTC orders it. (A stream handed over
near its end no longer counts: `in_flight` here is the endpoint's `occupied`.)

**Deadline.** A request's own deadline is the TTFT objective its client sent (`x-slo-ttft-ms`); the
spec's default objective (`spec.router.slo`) steers routing and measures attainment but is nobody's
deadline, so it never rejects anything. Every queued request also waits at most `max_queue_wait`
(the router's bound on how long the queue may hold anyone):

    budget = min(own deadline, max_queue_wait)    (max_queue_wait alone without a deadline)

**Honest early rejection.** A request that must queue is refused at once only when the wait it faces
cannot fit its budget: the requests the fair queue will dispatch before it (`ahead`, the queue's own
estimate: `VTCQueue.ahead`) at the queue's measured drain rate, plus, with a deadline of its own and a
`TTFTPredictor`, the engine's predicted time to first token:

    expected_wait = ahead / drain_rate;   reject if expected_wait + predicted_ttft > budget

The drain rate is the larger of two readings: the one measured while requests waited
(`DrainMeter`), and the pool's own, by Little's law, from the capacity it has now and how long an
admitted request holds its unit of it (`HoldMeter`):

    drain_rate = max(measured, capacity / mean_hold)

The measured rate is the truth of a standing queue, but it is the past. At a step onto a pool that
was just scaled down it is what the shrinking pool dispatched while the requests on the engines that
left still held their capacity: next to nothing, a fraction of what the pool drains seconds later.
A refusal is final, while a wait that proves too long is refused at its bound anyway, so a request
is refused early only when both readings say it cannot fit. Nothing is refused on a guess: with no
drain rate measured yet, only the prediction counts (the pool's reading raises a measured rate; it
never stands alone). Example: 40 requests ahead, a measured 0.6/s (64 s), a pool of 20 slots each
held 5 s (4/s): the wait is 10 s.

What is ahead depends on who asks: under VTC a tenant below its fair share has little ahead of it,
so it is not refused while the heavy tenant's own backlog is. Example: 40 requests ahead, draining
at 20/s → 2 s; a request with `x-slo-ttft-ms: 1000` is refused, one without waits.

**Retry-After** for a 429: the time the queue needs to drain to the request's place,

    retry_after = clamp(ceil((ahead + 1) / drain_rate), 1, 60) seconds

with `drain_rate` the rate above; `DEFAULT_RETRY_AFTER_S` (5 s) while none has been measured.
Example: 200 ahead, 40 dispatches/s → ceil(201/40) = 6 s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tandem.router.scheduling.base import Routable
from tandem.router.types import EndpointSnapshot

DEFAULT_RETRY_AFTER_S = 5
MAX_RETRY_AFTER_S = 60

#: The 429s' texts by reason (`AdmissionGate`), formatted with the facts behind them.
REFUSALS = {
    "queue_full": "the router's queue is full ({queued} requests waiting); retry later",
    "pushed_out": "the router's queue is full ({queued} requests waiting) and this tenant holds more "
    "of it than its share: its newest waiting request made room for another tenant's; retry later",
    "deadline": "the request cannot start within {budget:.3g}s (its x-slo-ttft-ms objective or the "
    "router's queue limit): {wait:.2g}s of queue ahead of it ({ahead} requests at {drain:.2g}/s); "
    "retry later",
    "late": "the request could not start within {budget:.3g}s (its x-slo-ttft-ms objective or the "
    "router's queue limit): it waited {wait:.2g}s in the queue; retry later",
    "slo": "the request cannot start within its {budget:.3g}s objective: {wait:.2g}s of queue ahead of "
    "it and a predicted {predicted:.3g}s to first token on the best engine; retry later",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SaturationLimits:
    """Engine-metric thresholds; None (the default) disables each check."""

    max_waiting: int | None = None
    max_kv_usage: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointLoad:
    """One decode endpoint's load: the router's own count and its `limit` (the most it may have
    open), plus the engine's reported waiting requests and KV usage (fraction 0..1) when a metrics
    collector provides them (else None)."""

    in_flight: int
    limit: int
    waiting: int | None = None
    kv_usage: float | None = None


def load_from_snapshot(snapshot: EndpointSnapshot, *, limit: int) -> EndpointLoad:
    """The router's in-flight count and `limit` plus, when the metrics collector has a fresh
    reading, the engine's waiting requests and KV usage (a stale or missing reading is unknown)."""
    stats = snapshot.engine.fresh if snapshot.engine is not None else None
    if stats is None:
        return EndpointLoad(in_flight=snapshot.occupied, limit=limit)
    return EndpointLoad(
        in_flight=snapshot.occupied, limit=limit, waiting=stats.waiting, kv_usage=stats.kv_usage
    )


def engine_saturated(load: EndpointLoad, limits: SaturationLimits) -> bool:
    """Whether the engine's own metrics say it should take nothing new."""
    waiting_full = limits.max_waiting is not None and (load.waiting or 0) >= limits.max_waiting
    kv_full = (
        limits.max_kv_usage is not None and load.kv_usage is not None and load.kv_usage >= limits.max_kv_usage
    )
    return waiting_full or kv_full


def saturated(load: EndpointLoad, limits: SaturationLimits) -> bool:
    """Whether the endpoint has no room for another request."""
    return load.in_flight >= load.limit or engine_saturated(load, limits)


def pool_capacity(loads: Iterable[EndpointLoad], limits: SaturationLimits) -> int:
    """How many admitted requests the pool can hold now (formula in the module docstring)."""
    return sum(
        min(load.limit, load.in_flight) if engine_saturated(load, limits) else load.limit for load in loads
    )


def queue_budget(*, deadline_s: float | None, max_queue_wait_s: float) -> float:
    """Seconds a request may wait in the queue: its own deadline, capped by the router's bound."""
    return max_queue_wait_s if deadline_s is None else min(deadline_s, max_queue_wait_s)


def expected_wait(*, ahead: int, drain_per_s: float | None) -> float | None:
    """Seconds until the queue has dispatched the `ahead` requests before this one (None: no rate)."""
    if not drain_per_s or drain_per_s <= 0:
        return None
    return ahead / drain_per_s


def pool_drain_rate(*, capacity: int | None, mean_hold_s: float | None) -> float | None:
    """Little's law: a pool holding `capacity` admitted requests, each for `mean_hold_s` on average,
    frees `capacity / mean_hold_s` units per second (None when either is unknown)."""
    if capacity is None or capacity <= 0 or mean_hold_s is None or mean_hold_s <= 0:
        return None
    return capacity / mean_hold_s


def drain_estimate(measured: float | None, pool: float | None) -> float | None:
    """The drain rate the wait is priced at (module docstring): the measured one, raised to the
    pool's own when that is higher; None while nothing was measured."""
    if measured is None:
        return None
    return max(measured, pool or 0.0)


def wait_out_of_reach(wait_s: float | None, predicted_ttft_s: float | None, *, budget_s: float) -> bool:
    """Honest early rejection (module docstring): what is known of the wait and of the engine's
    time to first token already exceeds the budget. Nothing known → never."""
    if wait_s is None and predicted_ttft_s is None:
        return False
    return (wait_s or 0.0) + (predicted_ttft_s or 0.0) > budget_s


class TTFTPredictor(Protocol):
    """Predicts time to first token (seconds) if `request` were sent now.

    Returns the best (lowest) prediction over `candidates` (the decode pool's endpoints in rotation),
    or None when it cannot predict (no model yet, no data for these endpoints). Synchronous, pure
    over its inputs and the predictor's own learned state, cheap (it runs on the event loop).
    """

    def predicted_ttft(
        self, request: Routable, candidates: Sequence[EndpointSnapshot], /
    ) -> float | None: ...


class NoPrediction:
    """The conservative default: never predicts, so nothing is rejected early."""

    def predicted_ttft(self, request: Routable, candidates: Sequence[EndpointSnapshot], /) -> float | None:
        return None


def retry_after_seconds(*, ahead: int, drain_per_s: float | None) -> int:
    """Whole seconds for `Retry-After` (formula and example in the module docstring)."""
    if not drain_per_s or drain_per_s <= 0:
        return DEFAULT_RETRY_AFTER_S
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil((ahead + 1) / drain_per_s)))


class _Decaying:
    """Weights that decay with time constant `tau_s`: the two meters below."""

    def __init__(self, tau_s: float) -> None:
        if tau_s <= 0:
            raise ValueError("tau_s must be positive")
        self._tau = tau_s
        self._last: float | None = None

    def _decay(self, now: float) -> float:
        """The factor e^(−dt/τ) by which what was seen at the last call shrinks by `now` (1 at the
        first call, or for a clock that did not move on)."""
        last = self._last
        if last is not None and now <= last:
            return 1.0
        self._last = now
        return 1.0 if last is None else math.exp(-(now - last) / self._tau)


class DrainMeter(_Decaying):
    """The queue's drain rate: dispatches from the queue per second *while requests were waiting*,
    both counts exponentially decayed with time constant `tau_s`:

        n ← n·e^(−dt/τ) + dispatches          (dispatches from the queue)
        b ← b·e^(−dt/τ) + τ·(1 − e^(−dt/τ))   if requests waited during dt, else b·e^(−dt/τ)
        rate = n / b                          once b ≥ `min_busy_s`, else None

    Normalising by the time requests waited (not by wall time) keeps a quiet spell from reading as
    a slow drain: the rate is what the engines free while there is a backlog. At a steady r
    dispatches/s with a standing queue, n → r·τ and b → τ, so rate = r. Example, τ = 10 s: 5 s of
    backlog with 100 dispatches → n ≈ 79, b ≈ 3.9 → ≈ 20/s.
    """

    def __init__(self, *, tau_s: float = 10.0, min_busy_s: float = 0.5) -> None:
        super().__init__(tau_s)
        self._min_busy = min_busy_s
        self._n = 0.0
        self._busy = 0.0
        self._waiting = False

    def tick(self, now: float, *, waiting: bool, dispatched: int = 0) -> None:
        """Account the time since the last tick (backlogged or not, as the last tick said), add
        `dispatched` dispatches from the queue, and note whether requests wait from now on."""
        self._advance(now)
        self._n += dispatched
        self._waiting = waiting

    def rate(self, now: float) -> float | None:
        """Dispatches per second of backlog, or None before `min_busy_s` of backlog was seen."""
        self._advance(now)
        if self._busy < self._min_busy:
            return None
        return self._n / self._busy

    def _advance(self, now: float) -> None:
        decay = self._decay(now)
        self._n *= decay
        self._busy = self._busy * decay + (self._tau * (1.0 - decay) if self._waiting else 0.0)


class HoldMeter(_Decaying):
    """How long an admitted request holds its unit of capacity (grant to hand-over or release), a
    mean whose weights decay with time constant `tau_s`:

        s ← s·e^(−dt/τ) + held;   w ← w·e^(−dt/τ) + 1;   mean = s / w   once w ≥ `min_weight`

    Example, τ = 10 s: requests that held 4 s each, then, over the last 10 s, ones that held 8 s →
    the mean moves most of the way to 8 s (e^(−1) ≈ 0.37 of the old weight is left).
    """

    def __init__(self, *, tau_s: float = 10.0, min_weight: float = 3.0) -> None:
        super().__init__(tau_s)
        self._min_weight = min_weight
        self._sum = 0.0
        self._weight = 0.0

    def observe(self, now: float, held_s: float) -> None:
        """One request gave back its unit of capacity after `held_s` seconds."""
        self._advance(now)
        self._sum += max(0.0, held_s)
        self._weight += 1.0

    def mean(self, now: float) -> float | None:
        """Mean seconds held, or None before `min_weight` (decayed) observations."""
        self._advance(now)
        if self._weight < self._min_weight:
            return None
        return self._sum / self._weight

    def _advance(self, now: float) -> None:
        decay = self._decay(now)
        self._sum *= decay
        self._weight *= decay
