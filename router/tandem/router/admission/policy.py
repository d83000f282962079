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
               min(limit, in_flight)   if they do (it keeps what it runs, takes nothing new)

Example: 4 endpoints with `--max-num-seqs 4` (limit 5 each: one request of lookahead) → capacity 20;
the 21st concurrent request waits in the router's queue, where VTC orders it.

**Deadline.** A queued request waits at most `min(ttft_slo, max_queue_wait)`: once its TTFT objective
has passed in the queue its answer would be late anyway, so it is rejected (429) rather than served.

**Early rejection** (Mooncake): when a `TTFTPredictor` predicts the best time to first token over the
candidate endpoints and that already exceeds the time left to the request's TTFT objective, the
request is rejected at once instead of queueing (checked on arrival and again at dispatch).

**Retry-After** for a 429: the time the queue needs to drain to this request's place,

    retry_after = clamp(ceil((queued + 1) / drain_rate), 1, 60) seconds

with `drain_rate` the recent dispatch rate (requests/s, `DrainMeter`); `DEFAULT_RETRY_AFTER_S` (5 s)
while nothing has been dispatched yet. Example: 200 queued, 40 dispatches/s → ceil(201/40) = 6 s.
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
        return EndpointLoad(in_flight=snapshot.in_flight, limit=limit)
    return EndpointLoad(
        in_flight=snapshot.in_flight, limit=limit, waiting=stats.waiting, kv_usage=stats.kv_usage
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


def queue_deadline(*, arrived: float, ttft_slo_s: float, max_queue_wait_s: float) -> float:
    """Clock second after which a request still queued is rejected."""
    return arrived + min(ttft_slo_s, max_queue_wait_s)


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


def slo_out_of_reach(predicted_ttft_s: float | None, *, time_left_s: float) -> bool:
    """Early rejection: a prediction exists and exceeds the time left to the TTFT objective."""
    return predicted_ttft_s is not None and predicted_ttft_s > time_left_s


def retry_after_seconds(*, queued: int, drain_per_s: float | None) -> int:
    """Whole seconds for `Retry-After` (formula and example in the module docstring)."""
    if not drain_per_s or drain_per_s <= 0:
        return DEFAULT_RETRY_AFTER_S
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil((queued + 1) / drain_per_s)))


class DrainMeter:
    """Recent dispatch rate as an exponentially decayed count with time constant `tau_s`:

        on each dispatch at t:  n ← n·exp(−(t − t_last)/τ) + 1
        rate(t) = n·exp(−(t − t_last)/τ) / τ

    At a steady r dispatches/s, n settles at r·τ, so rate = r; after the dispatches stop it decays
    to 0 with time constant τ. Example, τ = 10 s: 40/s for a minute gives n ≈ 400, rate ≈ 40/s.
    """

    def __init__(self, *, tau_s: float = 10.0) -> None:
        if tau_s <= 0:
            raise ValueError("tau_s must be positive")
        self._tau = tau_s
        self._n = 0.0
        self._last: float | None = None

    def record(self, now: float) -> None:
        self._n = self._decayed(now) + 1.0
        self._last = now

    def rate(self, now: float) -> float | None:
        """Dispatches per second, or None before the first dispatch."""
        if self._last is None:
            return None
        return self._decayed(now) / self._tau

    def _decayed(self, now: float) -> float:
        if self._last is None:
            return 0.0
        return self._n * math.exp(-max(0.0, now - self._last) / self._tau)
