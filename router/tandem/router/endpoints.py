"""The endpoint registry: which engines each pool has, which are in rotation, and the router's own
accounting per endpoint (requests in flight, consecutive failures).

Rotation is passive: an endpoint leaves it after `failure_threshold` consecutive failures and comes
back `cooldown_seconds` later (on the injected clock). Once back it is on probation: its consecutive
count is still at or above the threshold, so one more failure takes it out for another cool-down,
while one success clears the count. Story with threshold 3, cool-down 10 s:

    t=0 fail, t=1 fail, t=2 fail → out until t=12 · t=12 in rotation · t=13 fail → out until t=23
    · t=23 success → healthy, count 0

Pure (no I/O) and single-threaded: every call happens on the router's event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from tandem.router.types import POOLS, Endpoint, EndpointSnapshot, Pool

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _State:
    in_flight: int = 0
    consecutive_failures: int = 0
    out_until: float | None = None  # clock seconds; None: in rotation


class EndpointRegistry:
    """Members of each pool (set by discovery) plus per-endpoint state.

    Invariants: `in_flight >= 0`; an endpoint removed by discovery while requests are in flight keeps
    its state (and its metrics) until the last one ends, but is never a candidate again.
    """

    def __init__(
        self, *, failure_threshold: int, cooldown_seconds: float, clock: Callable[[], float]
    ) -> None:
        self._threshold = failure_threshold
        self._cooldown = cooldown_seconds
        self._clock = clock
        self._members: dict[Pool, tuple[Endpoint, ...]] = {pool: () for pool in POOLS}
        self._states: dict[Endpoint, _State] = {}

    # -- membership (discovery) -------------------------------------------------------------

    def set_pool(self, pool: Pool, urls: Iterable[str]) -> None:
        """Replace the members of `pool` with `urls` (order kept, duplicates and trailing `/` dropped).
        Endpoints that stay keep their state."""
        members = tuple(dict.fromkeys(Endpoint(pool, url.rstrip("/")) for url in urls))
        self._members[pool] = members
        for endpoint in members:
            self._states.setdefault(endpoint, _State())
        self._forget_idle_removed()

    def endpoints(self, pool: Pool) -> tuple[Endpoint, ...]:
        """The current members of `pool`, in discovery order."""
        return self._members[pool]

    def tracked(self) -> list[EndpointSnapshot]:
        """Every endpoint with state: current members plus removed ones still draining."""
        return [self.snapshot(endpoint) for endpoint in self._states]

    # -- reading ----------------------------------------------------------------------------

    def snapshot(self, endpoint: Endpoint) -> EndpointSnapshot:
        state = self._states.get(endpoint, _State())
        return EndpointSnapshot(
            endpoint=endpoint,
            in_flight=state.in_flight,
            consecutive_failures=state.consecutive_failures,
            in_rotation=self._in_rotation(state),
        )

    def snapshots(self, pool: Pool) -> list[EndpointSnapshot]:
        """Every member of `pool`, in or out of rotation."""
        return [self.snapshot(endpoint) for endpoint in self._members[pool]]

    def candidates(self, pool: Pool, *, exclude: Collection[Endpoint] = ()) -> list[EndpointSnapshot]:
        """Members of `pool` in rotation, minus `exclude` (endpoints this request already tried)."""
        return [snap for snap in self.snapshots(pool) if snap.in_rotation and snap.endpoint not in exclude]

    def _in_rotation(self, state: _State) -> bool:
        return state.out_until is None or self._clock() >= state.out_until

    # -- accounting (the dispatcher) --------------------------------------------------------

    def begin(self, endpoint: Endpoint) -> None:
        """An upstream request to `endpoint` starts; pair with exactly one `end`."""
        self._states.setdefault(endpoint, _State()).in_flight += 1

    def end(self, endpoint: Endpoint) -> None:
        """An upstream request to `endpoint` is over (response closed, whatever the outcome)."""
        state = self._states.get(endpoint)
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1
        self._forget_idle_removed()

    def record_success(self, endpoint: Endpoint) -> None:
        """The endpoint answered (any status below 500): clear its failure count."""
        state = self._states.get(endpoint)
        if state is None:
            return
        if state.consecutive_failures >= self._threshold:
            log.info("endpoint healthy again", extra={"endpoint": endpoint.name, "pool": endpoint.pool})
        state.consecutive_failures = 0
        state.out_until = None

    def record_failure(self, endpoint: Endpoint) -> bool:
        """The endpoint failed (connect error, timeout, broken response, 5xx). Returns True when this
        failure took it out of rotation."""
        state = self._states.get(endpoint)
        if state is None:
            return False
        state.consecutive_failures += 1
        if state.consecutive_failures < self._threshold:
            return False
        state.out_until = self._clock() + self._cooldown
        log.warning(
            "endpoint out of rotation",
            extra={
                "endpoint": endpoint.name,
                "pool": endpoint.pool,
                "consecutive_failures": state.consecutive_failures,
                "cooldown_s": self._cooldown,
            },
        )
        return True

    def _forget_idle_removed(self) -> None:
        members = {endpoint for pool in POOLS for endpoint in self._members[pool]}
        for endpoint in [e for e, s in self._states.items() if e not in members and not s.in_flight]:
            del self._states[endpoint]
