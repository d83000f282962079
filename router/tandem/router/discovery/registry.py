"""The endpoint registry: which engines each pool has, which are in rotation, and the router's own
accounting per endpoint (requests in flight, consecutive failures).

Rotation is passive: an endpoint leaves it after `failure_threshold` consecutive failures and comes
back `cooldown_seconds` later (on the injected clock). Once back it is on probation: its consecutive
count is still at or above the threshold, so one more failure takes it out for another cool-down,
while one success clears the count. Story with threshold 3, cool-down 10 s:

    t=0 fail, t=1 fail, t=2 fail → out until t=12 · t=12 in rotation · t=13 fail → out until t=23
    · t=23 success → healthy, count 0

Engine state comes from the metrics collector, per engine URL (an engine listed in both pools is
scraped once): `record_scrape` stores its `EngineStats` with the clock time; `record_scrape_miss`
counts a failed scrape. Snapshots carry the last good stats with their age, marked stale once
`stale_after` scrapes in a row failed. A URL whose scrapes failed to *reach* it (connect error,
timeout, 5xx) `unreachable_after` times in a row leaves rotation in both pools until a scrape
succeeds again; an answer that is not engine metrics (404, other text) only makes the data stale.

Membership listeners (`on_members`) are told after every `set_pool`, synchronously: the cold-start
hold (`tandem.router.admission.coldstart`) wakes its held requests when the decode pool gains a member.

Pure (no I/O) and single-threaded: every call happens on the router's event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tandem.router.types import (
    POOLS,
    Endpoint,
    EndpointSnapshot,
    EngineReading,
    EngineStats,
    Pool,
    kv_compatible,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Engine:
    stats: EngineStats | None = None
    scraped_at: float = 0.0  # clock seconds of the last good scrape
    misses: int = 0  # failed scrapes since the last good one
    unreachable: int = 0  # of those, the ones that could not reach the engine, in a row
    sent: int = 0  # upstream requests begun to it, ever
    sent_at_scrape: int = 0  # `sent` when the last good scrape was recorded


class EndpointRegistry:
    """Members of each pool (set by discovery) plus per-endpoint state, one live `EndpointSnapshot`
    per endpoint (updated in place; see `tandem.router.types`).

    Invariants: `in_flight >= 0`; an endpoint removed by discovery while requests are in flight keeps
    its state (and its metrics) until the last one ends, but is never a candidate again. While every
    member is in rotation (the usual case) `candidates` hands out one prepared tuple: a decision's
    cost does not grow with the pool's size here.
    """

    def __init__(
        self,
        *,
        failure_threshold: int,
        cooldown_seconds: float,
        clock: Callable[[], float],
        stale_after: int = 3,
        unreachable_after: int = 3,
    ) -> None:
        self._threshold = failure_threshold
        self._cooldown = cooldown_seconds
        self._clock = clock
        self._stale_after = stale_after
        self._unreachable_after = unreachable_after
        self._members: dict[Pool, tuple[Endpoint, ...]] = {pool: () for pool in POOLS}
        self._views: dict[Endpoint, EndpointSnapshot] = {}  # members, and removed ones still draining
        self._pool_views: dict[Pool, tuple[EndpointSnapshot, ...]] = {pool: () for pool in POOLS}
        self._out_until: dict[Endpoint, float] = {}  # cooling down after failures (clock seconds)
        self._down: set[Endpoint] = set()  # not in rotation (cooling down, or unreachable)
        self._engines: dict[str, _Engine] = {}  # by URL, members only
        self._draining = False  # some removed endpoint still has requests in flight
        self._listeners: list[Callable[[Pool], None]] = []
        self._restart_listeners: list[Callable[[str], None]] = []

    # -- membership (discovery) -------------------------------------------------------------

    def set_pool(self, pool: Pool, urls: Iterable[str], *, layouts: Mapping[str, str] | None = None) -> None:
        """Replace the members of `pool` with `urls` (order kept, duplicates and trailing `/` dropped).
        `layouts`: KV layouts by URL (`Endpoint.layout`; a URL not in it has none). Endpoints that
        stay keep their state (and take their new layout, if it changed)."""
        known = {url.rstrip("/"): layout for url, layout in (layouts or {}).items()}
        members = tuple(
            dict.fromkeys(Endpoint(pool, url, known.get(url)) for url in (u.rstrip("/") for u in urls))
        )
        self._members[pool] = members
        for endpoint in members:
            view = self._views.get(endpoint)
            if view is None:
                self._views[endpoint] = EndpointSnapshot(
                    endpoint=endpoint, in_flight=0, consecutive_failures=0, in_rotation=True
                )
            elif view.endpoint.layout != endpoint.layout:
                view.endpoint = endpoint
            self._engines.setdefault(endpoint.url, _Engine())
        self._pool_views[pool] = tuple(self._views[e] for e in members)
        self._draining = True
        self._forget_idle_removed()
        urls = set(self.urls())
        for url in [u for u in self._engines if u not in urls]:
            del self._engines[url]
        for endpoint in members:
            self._refresh(endpoint)
        for listener in self._listeners:
            listener(pool)

    def on_members(self, listener: Callable[[Pool], None]) -> None:
        """Call `listener(pool)` after every `set_pool` of `pool` (its members may be unchanged)."""
        self._listeners.append(listener)

    def on_restart(self, listener: Callable[[str], None]) -> None:
        """Call `listener(url)` after a good scrape whose reading says the engine at `url` restarted
        since the last one (`EngineStats.restarted_since`)."""
        self._restart_listeners.append(listener)

    def endpoints(self, pool: Pool) -> tuple[Endpoint, ...]:
        """The current members of `pool`, in discovery order."""
        return self._members[pool]

    def urls(self) -> list[str]:
        """The distinct engine URLs of both pools (what the metrics collector scrapes)."""
        return list(dict.fromkeys(e.url for pool in POOLS for e in self._members[pool]))

    def tracked(self) -> list[EndpointSnapshot]:
        """Every endpoint with state: current members plus removed ones still draining."""
        self._expire_cooldowns()
        return list(self._views.values())

    def now(self) -> float:
        return self._clock()

    # -- reading ----------------------------------------------------------------------------

    def snapshot(self, endpoint: Endpoint) -> EndpointSnapshot:
        self._expire_cooldowns()
        view = self._views.get(endpoint)
        if view is None:
            return EndpointSnapshot(endpoint=endpoint, in_flight=0, consecutive_failures=0, in_rotation=True)
        return view

    def snapshots(self, pool: Pool) -> Sequence[EndpointSnapshot]:
        """Every member of `pool`, in or out of rotation."""
        self._expire_cooldowns()
        return self._pool_views[pool]

    def candidates(
        self, pool: Pool, *, exclude: Collection[Endpoint] = (), pairs_with: str | None = None
    ) -> Sequence[EndpointSnapshot]:
        """Members of `pool` in rotation, minus `exclude` (endpoints this request already tried);
        with `pairs_with` (a KV layout), only those whose layout is `kv_compatible` with it."""
        views = self.snapshots(pool)
        if pairs_with is not None:
            views = [v for v in views if kv_compatible(pairs_with, v.endpoint.layout)]
        if not exclude and not self._down:
            return views
        return [v for v in views if v.in_rotation and v.endpoint not in exclude]

    def _expire_cooldowns(self) -> None:
        if not self._out_until:
            return
        now = self._clock()
        for endpoint in [e for e, until in self._out_until.items() if now >= until]:
            del self._out_until[endpoint]
            self._refresh(endpoint)

    def _refresh(self, endpoint: Endpoint) -> None:
        """Recompute the view's rotation and engine reading from the state."""
        view = self._views.get(endpoint)
        if view is None:
            return
        engine = self._engines.get(endpoint.url)
        view.in_rotation = endpoint not in self._out_until and not self._unreachable(engine)
        view.engine = self._reading(engine)
        if view.in_rotation:
            self._down.discard(endpoint)
        else:
            self._down.add(endpoint)

    def _unreachable(self, engine: _Engine | None) -> bool:
        return engine is not None and engine.unreachable >= self._unreachable_after

    def _reading(self, engine: _Engine | None) -> EngineReading | None:
        if engine is None or engine.stats is None:
            return None
        return EngineReading(
            stats=engine.stats,
            scraped_at=engine.scraped_at,
            stale=engine.misses >= self._stale_after,
            sent=engine.sent_at_scrape,
        )

    def _refresh_url(self, url: str) -> None:
        for pool in POOLS:
            endpoint = Endpoint(pool, url)
            if endpoint in self._views:
                self._refresh(endpoint)

    # -- engine state (the metrics collector) ---------------------------------------------------

    def record_scrape(self, url: str, stats: EngineStats) -> None:
        """A good scrape of `url`: fresh stats; an unreachable engine returns to rotation."""
        engine = self._engines.get(url)
        if engine is None:
            return
        if self._unreachable(engine):
            log.info("endpoint reachable again", extra={"endpoint": url})
        earlier = engine.stats
        engine.stats, engine.scraped_at, engine.misses, engine.unreachable = stats, self._clock(), 0, 0
        engine.sent_at_scrape = engine.sent
        self._refresh_url(url)
        if earlier is not None and self._restart_listeners and stats.restarted_since(earlier):
            for listener in self._restart_listeners:
                listener(url)

    def record_scrape_miss(self, url: str, *, unreachable: bool) -> bool:
        """A failed scrape of `url`; `unreachable`: the engine could not be reached (connect error,
        timeout, 5xx), not merely an answer without engine metrics. Returns True when this miss
        took the engine out of rotation."""
        engine = self._engines.get(url)
        if engine is None:
            return False
        engine.misses += 1
        engine.unreachable = engine.unreachable + 1 if unreachable else 0
        self._refresh_url(url)
        if engine.unreachable != self._unreachable_after:
            return False
        log.warning(
            "endpoint out of rotation: metrics unreachable",
            extra={"endpoint": url, "failed_scrapes": engine.unreachable},
        )
        return True

    # -- accounting (the dispatcher) --------------------------------------------------------

    def begin(self, endpoint: Endpoint) -> None:
        """An upstream request to `endpoint` starts; pair with exactly one `end`."""
        view = self._views.get(endpoint)
        if view is None:  # not a member (a caller's own endpoint): tracked until it ends
            view = self._views[endpoint] = EndpointSnapshot(
                endpoint=endpoint, in_flight=0, consecutive_failures=0, in_rotation=True
            )
            self._draining = True
        view.in_flight += 1
        engine = self._engines.get(endpoint.url)
        if engine is not None:
            engine.sent += 1

    def busy(self) -> bool:
        """Whether any upstream request is open (begun and not yet ended)."""
        return any(view.in_flight for view in self._views.values())

    def hand_over(self, endpoint: Endpoint) -> None:
        """An upstream request to `endpoint` is about to end: its slot may be given away (`end`
        must then say `handed_over`)."""
        view = self._views.get(endpoint)
        if view is not None and view.finishing < view.in_flight:
            view.finishing += 1

    def end(self, endpoint: Endpoint, *, handed_over: bool = False) -> None:
        """An upstream request to `endpoint` is over (response closed, whatever the outcome)."""
        view = self._views.get(endpoint)
        if view is not None and handed_over and view.finishing > 0:
            view.finishing -= 1
        if view is not None and view.in_flight > 0:
            view.in_flight -= 1
        if self._draining and view is not None and not view.in_flight:
            self._forget_idle_removed()

    def record_success(self, endpoint: Endpoint) -> None:
        """The endpoint answered (any status below 500): clear its failure count."""
        view = self._views.get(endpoint)
        if view is None:
            return
        if view.consecutive_failures >= self._threshold:
            log.info("endpoint healthy again", extra={"endpoint": endpoint.name, "pool": endpoint.pool})
        view.consecutive_failures = 0
        if self._out_until.pop(endpoint, None) is not None:
            self._refresh(endpoint)

    def record_failure(self, endpoint: Endpoint) -> bool:
        """The endpoint failed (connect error, timeout, broken response, 5xx). Returns True when this
        failure took it out of rotation."""
        view = self._views.get(endpoint)
        if view is None:
            return False
        view.consecutive_failures += 1
        if view.consecutive_failures < self._threshold:
            return False
        self._out_until[endpoint] = self._clock() + self._cooldown
        self._refresh(endpoint)
        log.warning(
            "endpoint out of rotation",
            extra={
                "endpoint": endpoint.name,
                "pool": endpoint.pool,
                "consecutive_failures": view.consecutive_failures,
                "cooldown_s": self._cooldown,
            },
        )
        return True

    def _forget_idle_removed(self) -> None:
        members = {endpoint for pool in POOLS for endpoint in self._members[pool]}
        removed = [e for e in self._views if e not in members]
        for endpoint in removed:
            if not self._views[endpoint].in_flight:
                del self._views[endpoint]
                self._out_until.pop(endpoint, None)
                self._down.discard(endpoint)
        self._draining = len(self._views) > len(members)
