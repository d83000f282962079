"""What the router knows and learns for scheduling, in one object per router process.

`SchedulingState` turns endpoint snapshots into per-request `Candidate`s (prefix match, load, queued
prefill work, learned rate, predicted TTFT) and keeps that knowledge current from the router's own
traffic as the dispatcher's `DispatchObserver`:

- `started` (an attempt begins): the request's uncached tokens on that endpoint join the endpoint's
  queued prefill work `Q_p`, and its prompt is recorded in the approximate prefix index (as SGLang and
  llm-d do at routing time, so the next request with the same prefix follows it at once);
- `answered` (the head arrives): the tokens leave `Q_p`; when the head is the first token (a stream's
  first chunk, or a prefill endpoint's one-token answer) the observed TTFT trains the endpoint's
  prefill rate and is reported beside its prediction. The observation is *engine* time: the seconds
  the gateway's own event loop ran late during the attempt (`lag_s`, from the loop-lag monitor) are
  taken out, so a saturated gateway does not teach the predictor that its engines are slow (which
  would make admission reject requests the engines would serve at once);
- `finished` (the attempt is over): a failed attempt's tokens leave `Q_p` too.

With the precise (KV-event) prefix source, a prompt's blocks reach the index only once the engine has
computed them and its events have crossed the network, so until an attempt's first token, and for
`pending_ttl_s` after it, its blocks also count as cached on its endpoint (llm-d's "speculative
indexing"): the next request with the same prefix follows it at once, and a burst keeps its affinity.

It also answers the admission layer: `predicted_ttft(request, candidates)` (the best TTFT̂ over the
candidates; None until every candidate's rate was observed once, so nothing is rejected on a prior).

With `track_prefixes` off (a policy that ignores prefixes, no P/D decision and no KV events to
follow: the composition root decides) no prompt is hashed or recorded and every match is 0.

What it keeps outlives requests (queued work per endpoint, learned rates, the prefix indexes);
nothing is keyed by a request: per-request facts (tokens, block keys, "was prefilled") are the
request's own (`Routable`) and its attempt's `Ticket`.

Pure (no I/O; clock injected) and single-threaded: everything runs on the router's event loop.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

from tandem.router.discovery.kvevents.ports import PrefixSource
from tandem.router.scheduling.adapterload import AdapterLoads
from tandem.router.scheduling.base import Routable
from tandem.router.scheduling.pinned import PinnedTraffic
from tandem.router.scheduling.plugins import Candidate, Cycle
from tandem.router.scheduling.prefix import ApproximatePrefixIndex
from tandem.router.scheduling.ttft import PrefillRates, ttft_seconds
from tandem.router.types import Endpoint, EndpointSnapshot, EngineReading, Pool

#: Profile of a cycle whose endpoint computes the prompt (prefill pool; decode without a prefill).
PROMPT = "prompt"
#: Profile of a decode cycle after a successful prefill: the endpoint loads the prompt's KV.
KV_LOADED = "kv-loaded"
#: Pools larger than this are scored on a shortlist (`SchedulingState.shortlist`).
SHORTLIST_ABOVE = 8
SHORTLIST_HOLDERS = 4
SHORTLIST_LEAST_BUSY = 3


@dataclass(slots=True, kw_only=True)
class Ticket:
    """One attempt as the state follows it (the `DispatchObserver` ticket). Token counts in tokens,
    `started_at` in clock seconds."""

    endpoint: Endpoint
    request: Routable
    prompt_tokens: int
    matched_tokens: int
    uncached_tokens: int
    queued_before: int
    predicted_ttft_s: float
    started_at: float
    kv_loaded: bool
    pending_keys: tuple[int, ...] = ()
    #: It loads its adapter on the engine (`adapterload`); `loads_ahead`: loads in flight there before it.
    adapter_load: bool = False
    loads_ahead: int = 0
    answered: bool = False
    released: bool = False


class SchedulingEvents(Protocol):
    """Where the state and the schedulers report what happened (the router wires metrics and logs)."""

    def dispatched(self, ticket: Ticket, /) -> None:
        """An attempt started with this prefix estimate and prediction."""

    def first_token(self, ticket: Ticket, /, *, observed_s: float) -> None:
        """The attempt's first token came after `observed_s` clock seconds."""


class NoEvents:
    def dispatched(self, ticket: Ticket, /) -> None:
        return None

    def first_token(self, ticket: Ticket, /, *, observed_s: float) -> None:
        return None


class SchedulingState:
    """Candidates, prefix state, queued work and learned rates (module docstring).

    `prefix`: where prefix matches come from (the approximate index itself, or the precise KV-event
    index); `approximate`: the routed-prefix index, always fed (it also gives `cache_fill`);
    `adapter_loads`, `pinned`: the `tandem` policy's record of adapter loads and of each engine's
    pinned traffic (`adapterload`, `pinned`), kept here so the metrics can read them.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        approximate: ApproximatePrefixIndex | None = None,
        prefix: PrefixSource | None = None,
        rates: PrefillRates | None = None,
        events: SchedulingEvents | None = None,
        track_prefixes: bool = True,
        on_record: Callable[[str, Sequence[int]], None] | None = None,
        pending_ttl_s: float = 2.0,
        adapter_loads: AdapterLoads | None = None,
        pinned: PinnedTraffic | None = None,
    ) -> None:
        self.approximate = approximate or ApproximatePrefixIndex()
        self.prefix: PrefixSource = prefix or self.approximate
        self.rates = rates or PrefillRates()
        self.events: SchedulingEvents = events or NoEvents()
        self._clock = clock
        self.track_prefixes = track_prefixes
        self._on_record = on_record
        self._queued: dict[str, int] = {}  # url → uncached tokens without a first token yet
        self._answered: set[str] = set()  # urls that have answered (this gateway, or anyone: not warming)
        self._sized: dict[str, EngineReading] = {}  # url → the engine reading last learned from
        self._turn = 0
        # Precise source only: block keys of prompts in flight, per URL (the events lag behind), and
        # of prompts answered in the last `pending_ttl_s` (key → expiry, oldest first).
        self._pending: dict[str, Counter[int]] = {}
        self._recent: dict[str, OrderedDict[int, float]] = {}
        self._pending_ttl_s = pending_ttl_s
        self.adapter_loads = adapter_loads
        self.pinned = pinned

    # -- reading ------------------------------------------------------------------------------

    def profile_for(self, pool: Pool, request: Routable) -> str:
        """`KV_LOADED` for a decode pick after this request's prefill succeeded, else `PROMPT`."""
        return KV_LOADED if pool == "decode" and request.kv_loaded else PROMPT

    def candidates(
        self, pool: Pool, request: Routable, snapshots: Sequence[EndpointSnapshot], *, profile: str
    ) -> tuple[Cycle, list[Candidate]]:
        """The cycle and one `Candidate` per snapshot (formulas in `Candidate` and `ttft`); above
        `SHORTLIST_ABOVE` snapshots, one per endpoint of the `shortlist`."""
        n = request.prompt_length()
        if len(snapshots) > SHORTLIST_ABOVE:
            snapshots = self.shortlist(request, snapshots, prompt_tokens=n)
        for snapshot in snapshots:
            if snapshot.engine is not None and self._sized.get(snapshot.endpoint.url) is not snapshot.engine:
                self._read_engine(snapshot)
        urls = [s.endpoint.url for s in snapshots]
        matched = self._match(urls, request) if n and self.track_prefixes else {}
        cycle = Cycle(
            pool=pool, profile=profile, request=request, prompt_tokens=n, slo_ttft_s=request.slo.ttft_s
        )
        return cycle, [
            self._candidate(
                s,
                n=n,
                matched=matched.get(s.endpoint.url, 0),
                kv_loaded=profile == KV_LOADED,
                adapter=request.lora_name,
            )
            for s in snapshots
        ]

    def shortlist(
        self, request: Routable, snapshots: Sequence[EndpointSnapshot], *, prompt_tokens: int
    ) -> list[EndpointSnapshot]:
        """The endpoints worth scoring in a large pool, found without looking at every endpoint's
        numbers: those whose routed picture holds the prompt's first block (at most
        `SHORTLIST_HOLDERS`, the least busy), the `SHORTLIST_LEAST_BUSY` with the fewest requests
        from this router, and one more in turn (so new prompts still spread over the whole pool).
        Like SGLang's and Dynamo's routers, which look up the prefix tree first and the load second.
        Example: 64 endpoints, the prompt's system part routed to 2 of them → those 2, the 3 least
        busy and the next in turn: 6 candidates instead of 64."""
        # `sorted(...)[:k]` is what `heapq.nsmallest(k, ...)` returns, ties in the same order, and
        # costs less here: the sort runs in C, nsmallest's loop in Python (2.3 against 3.7 µs at 64).
        busy = attrgetter("in_flight")
        keep: dict[Endpoint, EndpointSnapshot] = {}
        if prompt_tokens and self.track_prefixes:
            holders = self.approximate.holders(request)
            if holders:
                held = [s for s in snapshots if s.endpoint.url in holders]
                for snap in sorted(held, key=busy)[:SHORTLIST_HOLDERS]:
                    keep[snap.endpoint] = snap
        for snap in sorted(snapshots, key=busy)[:SHORTLIST_LEAST_BUSY]:
            keep.setdefault(snap.endpoint, snap)
        self._turn = (self._turn + 1) % len(snapshots)
        turn = snapshots[self._turn]
        keep.setdefault(turn.endpoint, turn)
        return list(keep.values())

    def predicted_ttft(self, request: Routable, candidates: Sequence[EndpointSnapshot], /) -> float | None:
        """The lowest TTFT̂ over `candidates` if `request` were sent now (the admission layer's
        `TTFTPredictor`); None with no candidates or while any candidate's rate is only a prior."""
        if not candidates or not self.rates.known(s.endpoint.url for s in candidates):
            return None
        pool = candidates[0].endpoint.pool
        _, scored = self.candidates(pool, request, candidates, profile=self.profile_for(pool, request))
        return min(c.predicted_ttft_s for c in scored)

    def queued_tokens(self, url: str) -> int:
        return self._queued.get(url, 0)

    def estimate_ttft(self, url: str, request: Routable, /, *, extra_queued: int = 0) -> float:
        """TTFT̂ of `request` on `url` now, computing its prompt there (`tandem.router.pd.disagg`'s
        `TTFTEstimator`): the endpoint's queued work (plus `extra_queued` tokens, work held for it
        elsewhere) and learned rate, the prompt less its prefix cached there; infinite while `url` is
        warming (`ahead`)."""
        if self.warming(url):
            return math.inf  # no prediction to trust (`ahead`)
        n = request.prompt_length() if self.track_prefixes else request.prompt_size()
        matched = min(n, self._match([url], request).get(url, 0)) if n and self.track_prefixes else 0
        uncached = _uncached(n, matched, kv_loaded=False)
        queued = self._queued.get(url, 0) + max(0, extra_queued)
        return self.rates.predict(url, queued_tokens=queued, uncached_tokens=uncached)

    def ahead(self, url: str) -> float:
        """Seconds of work queued on `url` before anything new sent now would start: `c + Q / R` with
        nothing of its own (`tandem.router.pd.hold`); 0 with nothing queued; infinite while it is
        warming (`warming`)."""
        queued = self._queued.get(url, 0)
        if queued <= 0:
            return 0.0
        if self.warming(url):
            return math.inf
        return self.rates.predict(url, queued_tokens=queued, uncached_tokens=0)

    def warming(self, url: str) -> bool:
        """Whether `url` is new and already computes a prompt (`filters.SlowStart`). New: it has not
        answered an attempt of this gateway yet (streamed or not, a prefill or not, any status below
        400) and its engine's own counters, when read, show no finished request since it started
        (`_read_engine`): an engine that served other gateways for hours is not new to a gateway that
        has just started."""
        return url not in self._answered and self._queued.get(url, 0) > 0

    # -- the dispatcher's feedback (DispatchObserver) -------------------------------------------

    def started(self, endpoint: Endpoint, request: Routable, /) -> object:
        n, url = (request.prompt_length() if self.track_prefixes else request.prompt_size()), endpoint.url
        kv_loaded = self.profile_for(endpoint.pool, request) == KV_LOADED
        matched = min(n, self._match([url], request).get(url, 0)) if n and self.track_prefixes else 0
        uncached = _uncached(n, matched, kv_loaded=kv_loaded)
        queued = self._queued.get(url, 0)
        predicted = self.rates.predict(url, queued_tokens=queued, uncached_tokens=uncached)
        loads, ahead = False, 0
        if self.adapter_loads is not None:
            loads, ahead = self.adapter_loads.started(url, request.lora_name)
            predicted += self.adapter_loads.delay(url, loads=False)  # its own load is in flight now
        ticket = Ticket(
            endpoint=endpoint,
            request=request,
            prompt_tokens=n,
            matched_tokens=matched,
            uncached_tokens=uncached,
            queued_before=queued,
            predicted_ttft_s=predicted,
            started_at=self._clock(),
            kv_loaded=kv_loaded,
            adapter_load=loads,
            loads_ahead=ahead,
        )
        self._queued[url] = queued + uncached
        if n and self.track_prefixes:
            keys = self.approximate.record(url, request)
            if self._on_record is not None and keys:
                self._on_record(url, keys)  # sibling workers record it too
            if self.prefix is not self.approximate:
                ticket.pending_keys = tuple(request.block_keys(self.approximate.block_size(url)))
                self._pending.setdefault(url, Counter()).update(ticket.pending_keys)
        self.events.dispatched(ticket)
        return ticket

    def answered(self, ticket: object, /, *, status: int, streamed: bool, lag_s: float = 0.0) -> None:
        """The head of the attempt's answer arrived; `lag_s`: seconds the gateway's event loop ran
        late since the attempt started (taken out of the observed TTFT, module docstring)."""
        if not isinstance(ticket, Ticket) or ticket.answered:
            return
        ticket.answered = True
        self._release(ticket, computed=status < 400)
        endpoint = ticket.endpoint
        if status < 400:
            self._answered.add(endpoint.url)
        first_token = streamed or endpoint.pool == "prefill"
        if status >= 400 or not first_token or ticket.kv_loaded:
            return
        observed = max(0.0, self._clock() - ticket.started_at - max(0.0, lag_s))
        work = ticket.queued_before + ticket.uncached_tokens
        self._learn(ticket, work=work, observed=observed)
        self.events.first_token(ticket, observed_s=observed)

    def _learn(self, ticket: Ticket, *, work: int, observed: float) -> None:
        """Train the prefill model on the first token's `observed` seconds for `work` tokens, less
        the adapter loads it waited behind; when it loaded its adapter itself, train the load cost
        instead (`adapterload`)."""
        url, costs = ticket.endpoint.url, self.adapter_loads
        if costs is None or observed <= 0:
            self.rates.observe(url, tokens=work, seconds=observed)
            return
        stalled = ticket.loads_ahead * costs.cost(url)
        if ticket.adapter_load:
            prefill = self.rates.predict(url, queued_tokens=work, uncached_tokens=0)
            costs.observe(url, observed - prefill - stalled)
        else:
            self.rates.observe(url, tokens=work, seconds=observed - stalled)

    def finished(self, ticket: object, /) -> None:
        if isinstance(ticket, Ticket):
            self._release(ticket)

    # -- membership -------------------------------------------------------------------------------

    def forget(self, keep: Collection[str]) -> None:
        """Drop state of endpoint URLs not in `keep` (they left discovery)."""
        self.approximate.forget(keep)
        self.rates.forget(keep)
        self._queued = {url: q for url, q in self._queued.items() if url in keep}
        self._answered = {url for url in self._answered if url in keep}
        self._pending = {url: p for url, p in self._pending.items() if url in keep}
        self._recent = {url: r for url, r in self._recent.items() if url in keep}
        self._sized = {url: r for url, r in self._sized.items() if url in keep}
        if self.adapter_loads is not None:
            self.adapter_loads.forget(keep)
        if self.pinned is not None:
            self.pinned.forget(keep)

    # -- internals --------------------------------------------------------------------------------

    def _candidate(
        self, snapshot: EndpointSnapshot, *, n: int, matched: int, kv_loaded: bool, adapter: str | None
    ) -> Candidate:
        url = snapshot.endpoint.url
        engine = snapshot.engine
        stats = engine.stats if engine is not None and not engine.stale else None
        load = float(snapshot.in_flight)
        if stats is not None:
            load = max(load, float(stats.running + stats.waiting))
        matched = min(n, max(0, matched))
        queued = self._queued.get(url, 0)
        uncached = _uncached(n, matched, kv_loaded=kv_loaded)
        model = self.rates.model(url)
        predicted = ttft_seconds(model, queued + uncached)
        costs = self.adapter_loads
        if costs is not None:
            predicted += costs.delay(url, loads=costs.needs_load(snapshot, adapter))
        return Candidate(
            snapshot=snapshot,
            url=url,
            load=load,
            kv_usage=stats.kv_usage if stats is not None else None,
            matched_tokens=matched,
            cache_fill=self.approximate.fill(url),
            queued_tokens=queued,
            tokens_per_second=model.rate,
            predicted_ttft_s=predicted,
            warming=self.warming(url) or (kv_loaded and url not in self._answered and snapshot.in_flight > 0),
        )

    def _read_engine(self, snapshot: EndpointSnapshot) -> None:
        """Learn from the endpoint's new engine reading (once per reading): size its routed picture;
        an engine that has finished requests (its own `served`, whoever sent them) is not new, so it
        is not `warming`; one that restarted since the last reading is new again, its cache empty."""
        engine = snapshot.engine
        if engine is None:
            return
        url, stats = snapshot.endpoint.url, engine.stats
        earlier = self._sized.get(url)
        if earlier is not None and stats.restarted_since(earlier.stats):
            self._answered.discard(url)
            self.approximate.clear(url)
        if stats.served:
            self._answered.add(url)
        self.approximate.configure(url, block_size=stats.block_size, capacity_blocks=stats.num_gpu_blocks)
        self._sized[url] = engine

    def _release(self, ticket: Ticket, *, computed: bool = False) -> None:
        """The attempt's work left the queue; `computed`: its engine answered it (the prompt's
        blocks are in its cache), so with the precise source they stay counted for the TTL."""
        if ticket.released:
            return
        ticket.released = True
        url = ticket.endpoint.url
        if ticket.adapter_load and self.adapter_loads is not None:
            self.adapter_loads.settled(url)
        left = self._queued.get(url, 0) - ticket.uncached_tokens
        if left > 0:
            self._queued[url] = left
        else:
            self._queued.pop(url, None)
        pending = self._pending.get(url)
        if pending is not None and ticket.pending_keys:
            pending.subtract(ticket.pending_keys)
            self._pending[url] = +pending  # drops keys at zero
            if not self._pending[url]:
                del self._pending[url]
            if computed and self._pending_ttl_s > 0:
                self._remember(url, ticket.pending_keys)

    def _remember(self, url: str, keys: Sequence[int]) -> None:
        """Keep an answered prompt's keys for `pending_ttl_s`, dropping expired ones first."""
        now = self._clock()
        recent = self._recent.setdefault(url, OrderedDict())
        while recent:
            key, expiry = next(iter(recent.items()))
            if expiry > now:
                break
            del recent[key]
        until = now + self._pending_ttl_s
        for key in keys:
            recent[key] = until
            recent.move_to_end(key)

    def _match(self, urls: Sequence[str], request: Routable) -> dict[str, int]:
        """The prefix source's matches; with the precise source, at least what in-flight and just
        answered requests computed there (their blocks may not be in the engine's events yet)."""
        matched = self.prefix.match(urls, request)
        now = self._clock()
        for url in urls:
            pending = self._pending.get(url)
            recent = self._recent.get(url)
            if not pending and not recent:
                continue
            size = self.approximate.block_size(url)
            keys = request.block_keys(size)
            hits = next(
                (i for i, key in enumerate(keys) if not _held(key, pending, recent, now)),
                len(keys),
            )
            matched[url] = max(matched.get(url, 0), hits * size)
        return matched


def _held(key: int, pending: Counter[int] | None, recent: OrderedDict[int, float] | None, now: float) -> bool:
    return (pending is not None and key in pending) or (recent is not None and recent.get(key, 0.0) > now)


def _uncached(n: int, matched: int, *, kv_loaded: bool) -> int:
    """Prompt tokens the endpoint computes: none when it loads the KV, else at least the last one."""
    if kv_loaded or n == 0:
        return 0
    return max(1, n - matched)
