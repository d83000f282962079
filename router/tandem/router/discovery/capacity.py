"""How many requests each engine can run at once, and so how many the gateway sends it.

The gateway dispatches only into capacity it knows: an engine gets at most `limit` requests from
this gateway process at once, counted by the gateway itself (`EndpointSnapshot.in_flight`, exact and
immediate), so the backlog waits in the gateway's fair queue, where it can be ordered between
tenants, not in the engine's first-come-first-served queue.

Per engine, `C` is its concurrency (vLLM's `--max-num-seqs`, or less when its KV cache is the
limit). It starts at `initial` (the pool's `--max-num-seqs` from `spec.engine.args`, else vLLM's
default 256) and follows the engine's own numbers, one step per new scrape:

    down:  `CONFIRM` readings in a row show waiting > 0 with the same running R < C, and either
           the engine's KV cache is at least `KV_FULL` used or its `--max-num-seqs` is unknown
           →  C = R  (the engine holds requests back at R: that is its limit)
    up:    waiting = 0 and running ≥ C  →  C = max(running, C + max(1, ⌈C / 4⌉)), at most `ceiling`
           (it ran everything it was sent: try a quarter more, so a C that went too low is back
           within a few scrapes: 40 → 50 → 63 → 79 ...)

Only readings taken after the engine has stepped count: when its token counters (`tokens`, vLLM's
prompt + generation tokens) have not moved since the previous reading, the engine is in the same step
(a slow engine, e.g. vLLM on CPU or a long prefill, takes longer than the scrape interval), and that
reading says nothing new: requests that arrived during the step wait for the next one while running
stays the same, which would otherwise look like a held-back engine three times in a row.

**The KV cache bounds C at once.** A reading whose KV cache is at least `KV_BOUND_FROM` used also
bounds C for as long as it is the latest: `C ≤ max(running, ⌊running / usage⌋)`, the requests the
cache holds when full at the share each running request holds now. It is not learned (the next
reading replaces it, and a reading below `KV_BOUND_FROM` lifts it), so it cannot keep an engine
small; it stops the gateway from sending a filling engine requests it can only queue while the
three readings the learned C needs come in (at a step from idle those seconds were the engine's
queue, and its requests could not move to the engines that joined meanwhile). Example: running 20,
KV 0.9 used → C ≤ ⌊20 / 0.9⌋ = 22; KV 0.5 used → no bound. Below `KV_BOUND_FROM` the share is not
used: running requests of unequal sizes (a few long conversations) would make it say full too soon.

One reading is not enough to go down: a request that has just arrived waits for the engine's next
step (a few ms), and a scrape that catches that moment would otherwise shrink C for good (the
gateway would never send enough again to see it grow back). Nor are readings in a row when the
engine's `--max-num-seqs` is known (`ceiling`, from the spec's engine arguments): a periodic load
(batches of equal requests finishing together) can show the same passing moment at every scrape,
so below a known `--max-num-seqs` only a full KV cache is believed: the one thing that keeps vLLM
from running what it may. A C that went too low still grows back, by a quarter per reading, while the
engine runs everything it gets. `ceiling` is `initial` when it comes from the engine's arguments
(the engine will not run more), else `MAX_CAPACITY`.

`limit = ceil((C + lookahead) / share)`, capped at `cap`, with `lookahead = round(fraction · C)`
requests queued in the engine so its next batch is not short while the gateway's next request is on
its way (default fraction 0.1: none for an engine of 4, 26 for one of 256; a queued lookahead
request makes a tenant who arrives later wait behind it, so it stays small), and `share` the number
of gateway processes sending to the same engines (workers × replicas; each takes its part). Example:
an engine with `--max-num-seqs 8` behind 2 workers: C = 8, lookahead 1, each worker sends it at
most ceil(9 / 2) = 5. Starting from 256 on an engine whose KV cache holds 100 sequences: three
scrapes in a row show running 100 with waiting > 0 → C = 100, limit 110.

Pure (the readings come in; no clock, no I/O).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.core.engineargs import arg_value
from tandem.router.types import EndpointSnapshot, EngineReading, EngineStats

#: vLLM's default `--max-num-seqs`, the starting point when the spec's engine arguments say nothing.
DEFAULT_CAPACITY = 256
MAX_CAPACITY = 65_536
#: Readings in a row that must show the same held-back running count before C goes down.
CONFIRM = 3
#: KV-cache usage (0..1) at which an engine that holds requests back is taken to be full.
KV_FULL = 0.9
#: KV-cache usage (0..1) from which a reading bounds C at once (`kv_bound`).
KV_BOUND_FROM = 0.8


def capacity_from_args(args: Sequence[str]) -> int | None:
    """`--max-num-seqs N` (or `=N`) from engine arguments, else None."""
    value = arg_value(args, "--max-num-seqs")
    return int(value) if value is not None and value.isdigit() and int(value) > 0 else None


def kv_bound(stats: EngineStats) -> int | None:
    """The running requests the engine's KV cache holds when full, at the share each running request
    holds now; None below `KV_BOUND_FROM` used or with nothing running. Examples: running 20, usage 0.9
    → 22; usage 1.0 → 20; usage 0.5 → None."""
    usage = stats.kv_usage
    if usage is None or usage < KV_BOUND_FROM or stats.running <= 0:
        return None
    return max(stats.running, math.floor(stats.running / min(usage, 1.0)))


@dataclass(slots=True)
class EngineCapacity:
    """Learned concurrency per engine URL and the dispatch limit it gives (module docstring)."""

    initial: int = DEFAULT_CAPACITY
    lookahead: float = 0.1
    share: int = 1
    cap: int = MAX_CAPACITY
    ceiling: int = MAX_CAPACITY
    _learned: dict[str, int] = field(default_factory=dict)
    _seen: dict[str, EngineReading] = field(default_factory=dict)
    _held: dict[str, tuple[int, int]] = field(default_factory=dict)  # url → (running, readings in a row)
    _tokens: dict[str, float] = field(default_factory=dict)  # url → the engine's token counters' sum
    _bound: dict[str, int] = field(default_factory=dict)  # url → `kv_bound` of its latest reading

    def concurrency(self, snapshot: EndpointSnapshot) -> int:
        """C for this endpoint's engine, updated from a reading not seen before: the learned C, within
        the latest fresh reading's KV bound (module docstring)."""
        url, reading = snapshot.endpoint.url, snapshot.engine
        if reading is None or reading.stale:
            return self._learned.get(url, self.initial)
        if self._seen.get(url) is not reading:
            self._seen[url] = reading
            self._learn(url, reading)
        c = self._learned.get(url, self.initial)
        bound = self._bound.get(url)
        return c if bound is None else min(c, bound)

    def limit(self, snapshot: EndpointSnapshot) -> int:
        """Requests this gateway process may have open to the endpoint."""
        c = self.concurrency(snapshot)
        total = c + math.floor(self.lookahead * c + 0.5)
        return max(1, min(self.cap, math.ceil(total / self.share)))

    def has_room(self, snapshot: EndpointSnapshot) -> bool:
        return snapshot.occupied < self.limit(snapshot)

    def total(self, snapshots: Sequence[EndpointSnapshot]) -> int:
        """Σ `limit`: how many requests this process may have open to the pool."""
        return sum(self.limit(s) for s in snapshots)

    def forget(self, keep: set[str]) -> None:
        for url in [u for u in self._learned if u not in keep]:
            del self._learned[url]
        for url in [u for u in self._seen if u not in keep]:
            del self._seen[url]
        for url in [u for u in self._held if u not in keep]:
            del self._held[url]
        for url in [u for u in self._tokens if u not in keep]:
            del self._tokens[url]
        for url in [u for u in self._bound if u not in keep]:
            del self._bound[url]

    def _learn(self, url: str, reading: EngineReading) -> None:
        stats = reading.stats
        bound = kv_bound(stats)
        if bound is None:
            self._bound.pop(url, None)
        else:
            self._bound[url] = bound
        if stats.tokens is not None:
            if self._tokens.get(url) == stats.tokens:
                return  # the engine has not stepped since the last reading: nothing new
            self._tokens[url] = stats.tokens
        c = self._learned.get(url, self.initial)
        kv_full = stats.kv_usage is not None and stats.kv_usage >= KV_FULL
        if stats.waiting > 0 and 0 < stats.running < c and (kv_full or self.ceiling >= MAX_CAPACITY):
            running, seen = self._held.get(url, (stats.running, 0))
            seen = seen + 1 if running == stats.running else 1
            self._held[url] = (stats.running, seen)
            if seen >= CONFIRM:
                c = stats.running
        else:
            self._held.pop(url, None)
            if stats.waiting == 0 and stats.running >= c:
                c = max(stats.running, c + max(1, math.ceil(c / 4)))
        self._learned[url] = max(1, min(self.ceiling, MAX_CAPACITY, c))
