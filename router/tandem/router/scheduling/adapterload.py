"""What a LoRA adapter load adds to a request's TTFT, learned per engine, and the loads in flight.

An engine loads an adapter that is not in its CPU tier before the step that first needs it (a disk
read into the CPU tier, then a copy into a GPU slot): in vLLM (`LRUCacheWorkerLoRAManager`) and in
the simulator the whole step waits, so a load delays the request that needs it **and every request
whose first token falls in that step**. The predicted TTFT of a request sent to engine p becomes

    TTFT̂_p = prefill_p(Q_p + U_p) + (L_p + λ) · ℓ_p

- `prefill_p(·)`: `ttft.ttft_seconds` of the engine's learned prefill model (`ttft.PrefillRates`),
- `L_p`: loads this gateway sent to p that have no first token yet (each one stalls p once),
- `λ`: 1 when the request's adapter is not held on p (`needs_load`), else 0,
- `ℓ_p`: the seconds a load costs on p, learned (below).

"Held": the gateway sent the adapter there lately (`adapterplace.Residency`, an LRU the size of the
engine's CPU tier) or the engine's `vllm:lora_requests_info` names it now. Example: ℓ = 70 ms, one load
in flight on A, none on B; a request for `sql`, held on A, not on B, prefill 30 ms on both: A 30 + 70 =
100 ms, B 30 + 70 = 100 ms; with two loads in flight on A, A is 170 ms and B wins.

**Learning ℓ.** When a request that caused a load gets its first token after `t` seconds, the load's
share is what the prefill model does not explain: `t − prefill_p(W) − L_p(at dispatch) · ℓ_p`, clamped
to [0, `MAX_LOAD_SECONDS`], into an exponentially weighted mean (weight `smoothing`). Such a request
does not train the prefill model, and a request that waited behind `L_p` loads trains it with
`t − L_p · ℓ_p`: a load is not mistaken for slow prefill. Before any load was seen on p, ℓ_p is the
mean of the engines that saw one (one pool, one hardware), else the prior (`DEFAULT_LOAD_SECONDS`).

Which dispatch caused a load is the placement's call: `AdapterPlacement.picked` records the chosen
engine in the residency record and marks the entry as loading when the engine did not hold it; the
first attempt to start there claims the mark (`started`).

**Copies ahead of requests.** When the gateway can load adapters itself (`copier`, the runtime API:
`tandem.router.upstream.adaptercopy.AdapterCopier`), the placement asks for a copy of a hot adapter on
another engine instead of sending a request there to load it (`adapterplace`). A copy in flight counts
as a load in flight on its engine (`copy`: the engine's steps wait for it as for any load);
when it is done (`copy_done`) the engine holds the adapter in the residency record. One copy per
adapter at a time (`copying`). A placement's marked load may also be started before its request
goes out (`take_load`: P/D reads the decode engine's adapter while the prefill runs,
`tandem.router.pd.prefetch`); the request then waits for it as a load in flight, not as its own.

Pure: plain numbers in and out, no clock; one per router process, used from the event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection

from tandem.router.types import EndpointSnapshot

#: A load's cost before any was observed: a rank-8 adapter of a 7B model (about 40 MB) read from a
#: local NVMe and built by vLLM, order of magnitude (docs/sim.md's time model says about 70 ms).
DEFAULT_LOAD_SECONDS = 0.05
DEFAULT_SMOOTHING = 0.2
#: A sample above this is taken as this (a request that also waited for something else).
MAX_LOAD_SECONDS = 30.0
#: Engines remembered at most (a pool's endpoints; URLs of engines gone long ago are dropped first).
MAX_ENGINES = 4096


class Residency:
    """The adapters this gateway sent to each engine lately: an LRU per engine URL, `capacity` entries
    (the engine's CPU tier), most recent last. What the engine itself holds may differ (another gateway
    replica, an eviction by a restart); it is a hint for placement, not a fact."""

    def __init__(self, *, max_engines: int = MAX_ENGINES) -> None:
        self._held: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()
        self._capacity: dict[str, int] = {}
        self._max_engines = max_engines

    def record(self, url: str, adapter: str, *, capacity: int) -> list[str]:
        """`adapter` was sent to `url`: it becomes the most recent there; the least recent beyond
        `capacity` (≥ 1) are forgotten and returned."""
        held = self._held.get(url)
        if held is None:
            held = self._held[url] = OrderedDict()
            if len(self._held) > self._max_engines:
                self._capacity.pop(self._held.popitem(last=False)[0], None)
        else:
            self._held.move_to_end(url)
        self._capacity[url] = capacity
        held[adapter] = None
        held.move_to_end(adapter)
        evicted: list[str] = []
        while len(held) > max(1, capacity):
            evicted.append(held.popitem(last=False)[0])
        return evicted

    def forget(self, url: str) -> list[str]:
        """The engine at `url` holds nothing any more (it restarted); returns what it held."""
        self._capacity.pop(url, None)
        return list(self._held.pop(url, ()))

    def capacity(self, url: str) -> int:
        """The `capacity` the engine's entries were last recorded with (1 before any)."""
        return self._capacity.get(url, 1)

    def holds(self, url: str, adapter: str) -> bool:
        held = self._held.get(url)
        return held is not None and adapter in held

    def adapters(self, url: str) -> list[str]:
        """Least recent first."""
        return list(self._held.get(url, ()))


def holds(residency: Residency, snapshot: EndpointSnapshot, adapter: str) -> bool:
    """Whether the engine holds `adapter`: this gateway sent it there lately (`residency`), or its
    fresh `vllm:lora_requests_info` names it (another gateway's requests, say)."""
    if residency.holds(snapshot.endpoint.url, adapter):
        return True
    engine = snapshot.engine
    load = None if engine is None or engine.stale else engine.stats.adapters
    return load is not None and adapter in load.active


class AdapterLoads:
    """Loads in flight per engine URL and the learned seconds a load costs (module docstring)."""

    def __init__(
        self,
        *,
        prior_seconds: float = DEFAULT_LOAD_SECONDS,
        smoothing: float = DEFAULT_SMOOTHING,
        residency: Residency | None = None,
    ) -> None:
        if prior_seconds < 0:
            raise ValueError("prior_seconds must be >= 0")
        if not 0 < smoothing <= 1:
            raise ValueError("smoothing must be in (0, 1]")
        self.residency = residency or Residency()
        self._prior = prior_seconds
        self._alpha = smoothing
        self._cost: dict[str, float] = {}
        self._observations: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        self._marked: set[tuple[str, str]] = set()  # (url, adapter) picked there while not held
        #: Adapter → the engine URL a copy of it is being loaded onto (module docstring).
        self.copying: dict[str, str] = {}
        #: Starts a copy of an adapter onto an engine, `(url, adapter)`, or says it cannot now
        #: (False); None: the gateway cannot load adapters itself, and an adapter spreads by its
        #: requests' loads.
        self.copier: Callable[[str, str], bool] | None = None
        self._copy_capacity: dict[tuple[str, str], int] = {}
        #: (url, adapter) → capacity: marked loads started ahead of their request (`take_load`).
        self._taken: dict[tuple[str, str], int] = {}

    # -- what the placement says ------------------------------------------------------------------

    def mark(self, url: str, adapter: str) -> None:
        """A request for `adapter` was just placed on `url`, which did not hold it: the attempt
        that starts there next loads it."""
        self._marked.add((url, adapter))

    def unmark(self, url: str, adapter: str) -> None:
        """`url` no longer counts as holding `adapter` (the residency record forgot it)."""
        self._marked.discard((url, adapter))

    def take_load(self, url: str, adapter: str, *, start: Callable[[str, str], bool]) -> bool:
        """The load a placement marked on `url` (its request would read `adapter` there as it
        starts) is started now by `start`, and the request no longer loads it: it waits for it as
        for any load in flight there; `copy_done` hears how it ended. Used by P/D to read a decode
        engine's adapter while the prefill runs (`tandem.router.pd.prefetch`). Not one of `copying`:
        a hot adapter's copies, one at a time, are the placement's way to spread it, which this read
        of an engine already chosen does not hold up. False (the mark kept: the request loads it)
        when nothing is marked, a load of `adapter` onto `url` runs already or `start` refuses.

        >>> loads = AdapterLoads()
        >>> loads.take_load("a", "sql", start=lambda url, adapter: True)
        False
        >>> loads.mark("a", "sql"); loads.take_load("a", "sql", start=lambda url, adapter: True)
        True
        >>> loads.started("a", "sql"), loads.in_flight("a"), loads.copying
        ((False, 1), 1, {})"""
        key = (url, adapter)
        if key not in self._marked or key in self._taken or self.copying.get(adapter) == url:
            return False
        if not start(url, adapter):
            return False
        self._marked.discard(key)
        self._taken[key] = self.residency.capacity(url)
        self._in_flight[url] = self._in_flight.get(url, 0) + 1
        return True

    def copy(
        self, url: str, adapter: str, *, capacity: int, start: Callable[[str, str], bool] | None = None
    ) -> bool:
        """Start a copy of `adapter` onto `url` (by `start`, default the copier); False when one of
        it is in flight (or a load of it onto `url`, `take_load`), there is nothing to start it or
        it refuses; `capacity`: the engine's CPU tier, for the residency record when it is done."""
        start = start or self.copier
        if start is None or adapter in self.copying or (url, adapter) in self._taken:
            return False
        if not start(url, adapter):
            return False
        self.copying[adapter] = url
        self._copy_capacity[(url, adapter)] = capacity
        self._in_flight[url] = self._in_flight.get(url, 0) + 1
        return True

    def copy_done(self, url: str, adapter: str, *, ok: bool) -> None:
        """The copy of `adapter` onto `url` (or the load `take_load` started) ended; `ok`: the
        engine holds it now."""
        if (url, adapter) in self._taken:
            capacity = self._taken.pop((url, adapter))
        elif self.copying.get(adapter) == url:
            del self.copying[adapter]
            capacity = self._copy_capacity.pop((url, adapter), 1)
        else:
            return
        self.settled(url)
        if ok:
            for evicted in self.residency.record(url, adapter, capacity=capacity):
                self.unmark(url, evicted)

    # -- what the dispatcher says -------------------------------------------------------------------

    def started(self, url: str, adapter: str | None) -> tuple[bool, int]:
        """An attempt for `adapter` starts on `url`: whether it loads the adapter (claims the mark),
        and the loads in flight there before it (each delays its first token once)."""
        ahead = self._in_flight.get(url, 0)
        if adapter is None or (url, adapter) not in self._marked:
            return False, ahead
        self._marked.discard((url, adapter))
        self._in_flight[url] = ahead + 1
        return True, ahead

    def settled(self, url: str) -> None:
        """An attempt that loaded an adapter on `url` got its first token, or ended."""
        left = self._in_flight.get(url, 0) - 1
        if left > 0:
            self._in_flight[url] = left
        else:
            self._in_flight.pop(url, None)

    def observe(self, url: str, seconds: float) -> None:
        """A load on `url` took `seconds` of a request's TTFT (clamped to [0, MAX_LOAD_SECONDS])."""
        sample = min(max(0.0, seconds), MAX_LOAD_SECONDS)
        earlier = self._cost.get(url)
        self._cost[url] = sample if earlier is None else (1 - self._alpha) * earlier + self._alpha * sample
        self._observations[url] = self._observations.get(url, 0) + 1

    # -- what the scheduler reads -----------------------------------------------------------------

    def needs_load(self, snapshot: EndpointSnapshot, adapter: str | None) -> bool:
        """Whether a request for `adapter` sent to this engine would load it (`holds`)."""
        return adapter is not None and not holds(self.residency, snapshot, adapter)

    def cost(self, url: str) -> float:
        """Seconds a load costs on `url`: learned, else the mean learned one, else the prior."""
        learned = self._cost.get(url)
        if learned is not None:
            return learned
        if self._cost:
            return sum(self._cost.values()) / len(self._cost)
        return self._prior

    def in_flight(self, url: str) -> int:
        return self._in_flight.get(url, 0)

    def delay(self, url: str, *, loads: bool) -> float:
        """`(L_p + λ) · ℓ_p`: what the loads in flight on `url`, and this request's own when `loads`,
        add to a first token there.

        >>> costs = AdapterLoads(prior_seconds=0.07)
        >>> costs.mark("a", "sql"); costs.started("a", "sql")
        (True, 0)
        >>> round(costs.delay("a", loads=True), 2), round(costs.delay("b", loads=False), 2)
        (0.14, 0.0)"""
        count = self._in_flight.get(url, 0) + (1 if loads else 0)
        return count * self.cost(url) if count else 0.0

    def observations(self, url: str) -> int:
        return self._observations.get(url, 0)

    def restarted(self, url: str) -> None:
        """The engine at `url` restarted: it holds no adapter, and no load or copy of this gateway
        runs there any more (what it learned of a load's cost stays: same hardware)."""
        self.residency.forget(url)
        self._drop_loads(lambda u: u != url)

    def forget(self, keep: Collection[str]) -> None:
        """Drop what is known of engines not in `keep`."""
        self._cost = {url: c for url, c in self._cost.items() if url in keep}
        self._observations = {url: n for url, n in self._observations.items() if url in keep}
        self._drop_loads(keep.__contains__)

    def _drop_loads(self, kept: Callable[[str], bool]) -> None:
        """Forget the loads and copies in flight on every engine URL `kept` refuses."""
        self._in_flight = {url: n for url, n in self._in_flight.items() if kept(url)}
        self._marked = {(url, a) for url, a in self._marked if kept(url)}
        self.copying = {a: url for a, url in self.copying.items() if kept(url)}
        self._copy_capacity = {k: c for k, c in self._copy_capacity.items() if kept(k[0])}
        self._taken = {k: c for k, c in self._taken.items() if kept(k[0])}
