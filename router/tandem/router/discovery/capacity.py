"""How many requests each engine can run at once, and so how many the gateway sends it.

The gateway dispatches only into capacity it knows: an engine gets at most `limit` requests from
this gateway process at once, counted by the gateway itself (`EndpointSnapshot.occupied`, exact and
immediate), so a backlog waits in the gateway's fair queue, where it is ordered between tenants and
pre-emption reaches it, not in the engine's first-come-first-served queue, where neither does. What
was sent before C was known and waits in the engine beyond it is taken back
(`tandem.router.upstream.recall`).

Per engine, `C` is its concurrency: vLLM's `--max-num-seqs`, or less when its KV cache is the limit.
Nothing needs to be declared: C is learned from the engine's own numbers, one step per reading taken
after the engine has stepped (its prompt + generation token counters moved; a slow step seen by two
scrapes is one reading). A declared `--max-num-seqs` (the spec's engine arguments, or
`--engine-capacity`) is where C starts and the most it can be; without one C starts at vLLM's
default 256.

**Held back: the engine's limit, learned and then held.** A reading with requests waiting while the
engine runs fewer than C (or exactly C, while C is not confirmed: a start value such as its pool's)
says the engine holds requests back at what it runs, R: that is its limit.
`CONFIRM` stepped readings in a row at the same R make it C, *confirmed*: the kind of limit is `kv`
when the KV cache was at least `KV_BOUND_FROM` used, else `seqs` (a slot count). One reading is not
enough, since a request that has just arrived waits for the engine's next step (a few ms), and a
scrape can catch that moment. `PROVEN` (2) readings are enough when each after the first shows more
requests waiting than this gateway sent the engine since the reading before (times `share`: the
other processes' sends are not seen): the surplus was there at the last reading already and has
waited through an engine step since. Below a declared `--max-num-seqs` only a full KV cache is
believed (batches of equal requests finishing together can show the same passing moment at every scrape).

**Waiting for an adapter slot is not a limit.** An engine whose requests name more LoRA adapters than
one batch may hold (`max_loras`) keeps the requests of the adapters that do not fit waiting however
many requests it could run. vLLM 0.32 says which waiting requests those are: its
`vllm:num_requests_waiting_by_reason{reason="deferred"}` (`EngineStats.deferred`) counts the requests
a transient constraint, the adapter budget among them, held out of the step's batch; only the rest
(`reason="capacity"`) are a sign of C. Example: 5 running, 3 waiting of which 2 deferred: 1 waits
for capacity, a reading held back at 5. An engine without that series (older vLLM) is read from
`vllm:lora_requests_info` instead (its labels name every adapter with a request in 0.32): a reading
with requests waiting while more adapters are active than `max_lora` neither lowers nor confirms C
(`adapter_bound`); only a pre-emption or a filling KV cache bounds it then. Example: `--max-loras 4`,
requests for 6 adapters, 5 running and 3 waiting: no sign of C. Before this rule a multi-adapter
pool's engines were confirmed at the few requests their batches held, and the gateway held in its
queue requests whose adapters were running and would have joined the batch at once.

**Growing without leaking a backlog.** A reading where the engine ran everything it was sent
(nothing waiting) with at least C running is the only sign C may be too small. What follows it
depends on what is known:

- C not confirmed (a start value, or a limit the engine has since run past): grow by a quarter,
  `C + max(1, ⌈C/4⌉)`, to find the limit quickly (40 → 50 → 63 → 79 ...).
- C confirmed as a slot count: the engine's `--max-num-seqs` does not change while it runs, so C is
  held. Sending more could only put requests into the engine's queue, where a tenant who arrives
  later waits behind them. Once every `recheck` readings (doubling from `RECHECK_FIRST` to
  `RECHECK_LAST` each time the limit is found again) one probe checks it: C + 1 for one reading. The
  engine queues the extra request (waiting > 0 at R = C: confirmed again, in one reading, since the
  gateway knows it sent one more) or runs it (the limit is larger: C grows again as unconfirmed).
- C confirmed by a filling KV cache: the cache's room moves with the requests' lengths. C grows to
  what the cache holds when full at the running share, `⌊running / usage⌋`, by at most a quarter per
  reading; held back again, it goes one down per confirmation (requests the engine pre-empted wait
  too, and what runs then is less than what the cache holds). Example: C = 20 running at 0.6 used →
  ⌊20 / 0.6⌋ = 33, at most 25 this reading. Full is vLLM's own rule: its scheduler admits a waiting
  request while the cache has blocks for its prompt. Grown only to 90 % (answers ending at 22 of
  128 blocks: 5 running at 0.8 used stayed 5 where the engine runs 6), a cache-bound engine ran one
  request short, and a flood's heavy tenant got 0.90× the requests per second vllm-router's round
  robin got from the same engines (docs/benchmarks.md, "A KV-cache-bound engine").

**Pre-empted: one less.** An engine that pre-empted running requests since the last reading
(`vllm:num_preemptions_total` grew: its KV cache ran out as the running answers grew) while running
at least C − 1 (or while C is a start value) holds too many for its cache: C goes one below the
smaller of C and the most it was seen running, confirmed as `kv`. The pre-empted
requests wait at the front of its queue and recompute, and a tenant's request sent after them waits
behind them. Example: a cache of 128 blocks, answers that end at 22 blocks: it admits 7, pre-empts as
they grow; C settles at 5, where nothing is pre-empted. This holds below a declared `--max-num-seqs`
too: a pre-emption is a full cache, the one thing believed there.

A lone pre-emption at a confirmed `kv` C is let pass: one request pre-empted in a reading that
follows one without. Answers of staggered lengths that fit the cache at C line up at their longest
now and then, and the engine pre-empts one of them and recomputes it a step or two later. Taking C
down for it cost the engine a running request until a reading showed room again (a second or so at
the scrape interval), more than the one recomputation. Two readings in a row with pre-emptions, or
more than one pre-emption in a reading, are a cache that does not hold C: one less, as above.
Example: C = 6 confirmed as kv, one pre-emption, then a reading without any: C stays 6; one
pre-emption in each of two readings: C = 5 at the second.

**A new engine starts where its pool stands.** An engine first seen in a pool whose other engines
have a confirmed C starts at the smallest of those, unconfirmed, not at 256: one pool's engines come
from one template (the same `--max-num-seqs`, the same cache), so an engine the autoscaler has just
added is not handed a burst it can only queue while its own readings come in. If it can take more it
runs all it gets and grows by a quarter per reading, as any start value does. Example: decode
engines confirmed at 6 and 7; a third joins at C = 6.

The same holds for an engine already known whose C is still a start value when a pool peer confirms
its own: when one engine of a pool is confirmed, every other engine of that pool that is not
confirmed, has a C above where the pool stands (`start`: the smallest confirmed C) and was never
seen running more than that comes down to it, unconfirmed. At a flood's start every engine of a
fresh gateway holds 256 and is sent the flood; the engines' readings confirm them one by one, a
reading interval or two apart, and until the last is confirmed a request the gateway recalls from
the first (or a newcomer) would be sent into the queue of one still at 256, and recalled again. With
the pool's C they all hold the backlog in the gateway from the first confirmation, and recall what
waits beyond it at their next reading. An engine that can run more shows it by running all it is
sent and grows by a quarter per reading, as a start value does. Example: four engines at 256 with 14
requests each; the first is confirmed at 4, the three others become 4 at once, unconfirmed.

An engine that restarted (its counters' start time changed, or its counters went backwards) keeps
its C as a start value, unconfirmed: it may have come back with another `--max-num-seqs`, which the
readings then find (a larger one by growth, a smaller one held back). An engine that runs more than
C (another gateway sending to it, a limit that grew) raises C to what it runs, unconfirmed.

**The KV cache bounds C at once.** A reading whose KV cache is at least `KV_BOUND_FROM` used also
bounds C for as long as it is the latest: `C ≤ max(running, ⌊running / usage⌋)`, the requests the
cache holds when full at the share each running request holds now. It stops the gateway from sending
a filling engine requests it can only queue while the confirming readings come in. A confirmed C is
not lowered by it (the next reading replaces it, so it cannot keep an engine small); a start value is
(C becomes the bound, unconfirmed, and grows by a quarter per reading while the engine runs all it
gets): otherwise the first reading with room, after the engine pre-empted and freed its cache, would
give it back its 256 and the flood with it. Example: running 20, KV 0.9
used → C ≤ ⌊20 / 0.9⌋ = 22; KV 0.5 used → no bound.

**Learning fast.** `learning(snapshot)`: C is not confirmed and the gateway has more requests open to
the engine than it has ever been seen running, or the latest reading held requests back or bounded C
by the KV cache, so the next readings decide C; the metrics collector
then scrapes it every `learning_interval` instead of every interval (docs/router.md, "Engine
capacity"). At a flood's start C is found in about `CONFIRM` fast readings.

`limit = ceil((C + lookahead) / share)`, capped at `cap`, with `lookahead = round(fraction · C)`
requests queued in the engine beyond C (default 0: the handover, `--handover-tokens`, already sends
the next request as a stream ends) and `share` the number of gateway processes sending to the same
engines (workers × replicas; each takes its part). Example: an engine with `--max-num-seqs 8` behind
2 workers: each worker sends it at most ceil(8 / 2) = 4. Starting from 256 on an engine whose
`--max-num-seqs` is 4 and a flood of 12 requests for it: three fast readings show running 4 with 8
waiting → C = 4, confirmed; the flood's backlog now waits in the gateway.

Pure (the readings come in; no clock, no I/O).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from tandem.core.engineargs import arg_value
from tandem.router.types import EndpointSnapshot, EngineReading, EngineStats

#: vLLM's default `--max-num-seqs`, the starting point when nothing is declared.
DEFAULT_CAPACITY = 256
MAX_CAPACITY = 65_536
#: Stepped readings in a row that must show the same held-back running count before C is learned;
#: `PROVEN` when each after the first showed more requests waiting than were sent since the reading
#: before (the surplus was there at the first one and has waited through an engine step since).
CONFIRM = 3
PROVEN = 2
#: KV-cache usage (0..1) at which an engine that holds requests back is taken to be full.
KV_FULL = 0.9
#: KV-cache usage (0..1) from which a reading bounds C at once (`kv_bound`).
KV_BOUND_FROM = 0.8
#: Readings between the checks of a confirmed slot count: the first, and the most after doubling.
RECHECK_FIRST = 30
RECHECK_LAST = 960

Limit = Literal["seqs", "kv"]


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
    return holds_when_full(stats.running, usage)


def holds_when_full(running: int, usage: float) -> int:
    """The requests a KV cache `usage` (0..1, > 0) used by `running` requests holds when full, at the
    share each holds now (`kv_bound`, and how far a `kv` C grows). Example: 5 running at 0.8 → 6."""
    return max(running, math.floor(running / min(usage, 1.0)))


@dataclass(slots=True)
class EngineLimit:
    """What is known of one engine's concurrency (module docstring). `c`: C; `confirmed`: C was seen
    holding requests back, as `kind`; `most`: the most it was seen running since it started;
    `probing`: C is one above a confirmed slot count for one check."""

    c: int
    confirmed: bool = False
    kind: Limit | None = None
    most: int = 0
    probing: bool = False
    # (running, stepped readings in a row holding requests back at it, all after the first `proven`)
    held: tuple[int, int, bool] = (0, 0, False)
    tokens: float | None = None
    sent: int | None = None  # the latest reading's `EngineReading.sent`
    bound: int | None = None  # `kv_bound` of the latest reading
    preempted: bool = False  # the latest stepped reading showed a pre-emption
    recheck_in: int = RECHECK_FIRST
    recheck_every: int = RECHECK_FIRST
    seen: EngineReading | None = None
    pool: str = ""


@dataclass(slots=True)
class EngineCapacity:
    """Learned concurrency per engine URL and the dispatch limit it gives (module docstring)."""

    initial: int = DEFAULT_CAPACITY
    lookahead: float = 0.0
    share: int = 1
    cap: int = MAX_CAPACITY
    ceiling: int = MAX_CAPACITY
    _engines: dict[str, EngineLimit] = field(default_factory=dict)

    @property
    def declared(self) -> bool:
        """Whether the engines' `--max-num-seqs` was declared (`ceiling` from the spec or settings)."""
        return self.ceiling < MAX_CAPACITY

    def concurrency(self, snapshot: EndpointSnapshot) -> int:
        """C for this endpoint's engine, updated from a reading not seen before: the learned C, within
        the latest fresh reading's KV bound (module docstring)."""
        engine = self._read(snapshot)
        if engine is None:
            return self.start(snapshot.endpoint.pool)
        return engine.c if engine.bound is None else min(engine.c, engine.bound)

    def limit(self, snapshot: EndpointSnapshot) -> int:
        """Requests this gateway process may have open to the endpoint."""
        c = self.concurrency(snapshot)
        total = c + math.floor(self.lookahead * c + 0.5)
        return max(1, min(self.cap, math.ceil(total / self.share)))

    def runs(self, snapshot: EndpointSnapshot) -> int:
        """This process's part of what the engine runs at once: `limit` without the lookahead (what
        is open beyond it waits in the engine's queue)."""
        return max(1, min(self.cap, math.ceil(self.concurrency(snapshot) / self.share)))

    def has_room(self, snapshot: EndpointSnapshot) -> bool:
        return snapshot.occupied < self.limit(snapshot)

    def total(self, snapshots: Sequence[EndpointSnapshot]) -> int:
        """Σ `limit`: how many requests this process may have open to the pool."""
        return sum(self.limit(s) for s in snapshots)

    def learning(self, snapshot: EndpointSnapshot) -> bool:
        """Whether the engine's next readings decide its C: not confirmed, and this process has more
        requests open to it than its share of the most it was seen running, or the latest reading held
        requests back or bounded C by the KV cache (module docstring)."""
        engine = self._read(snapshot)
        if engine is None:
            return snapshot.occupied > 0
        if engine.confirmed:
            return False
        return engine.held[1] > 0 or engine.bound is not None or snapshot.occupied * self.share > engine.most

    def known(self, url: str) -> EngineLimit | None:
        """What is known of `url`'s engine (metrics, tests); None before its first reading."""
        return self._engines.get(url)

    def start(self, pool: str) -> int:
        """Where a new engine of `pool` starts: the smallest confirmed C of the pool's other engines
        (a probe's extra request not counted), else `initial` (module docstring)."""
        confirmed = [e.c - e.probing for e in self._engines.values() if e.pool == pool and e.confirmed]
        return min(confirmed, default=self.initial)

    def forget(self, keep: set[str]) -> None:
        for url in [u for u in self._engines if u not in keep]:
            del self._engines[url]

    def _read(self, snapshot: EndpointSnapshot) -> EngineLimit | None:
        """The engine's state, after learning from its reading if that reading is new."""
        url, reading = snapshot.endpoint.url, snapshot.engine
        engine = self._engines.get(url)
        if reading is None or reading.stale:
            return engine
        if engine is None:
            pool = snapshot.endpoint.pool
            engine = self._engines[url] = EngineLimit(c=self.start(pool), pool=pool)
        if engine.seen is not reading:
            earlier = engine.seen
            engine.seen = reading
            self._learn(engine, reading, earlier)
        return engine

    def _learn(self, engine: EngineLimit, reading: EngineReading, earlier: EngineReading | None) -> None:
        stats = reading.stats
        engine.bound = kv_bound(stats)
        if earlier is not None and stats.restarted_since(earlier.stats):
            engine.confirmed, engine.kind, engine.probing, engine.most = False, None, False, 0
            engine.held, engine.tokens, engine.preempted = (0, 0, False), None, False
            engine.recheck_every = engine.recheck_in = RECHECK_FIRST
        if stats.tokens is not None:
            if engine.tokens == stats.tokens:
                return  # the engine has not stepped since the last reading: nothing new
            engine.tokens = stats.tokens
        sent = engine.sent
        engine.sent = reading.sent
        running, waiting = stats.running, stats.waiting
        held = waiting - stats.deferred if stats.deferred is not None else waiting  # waiting for capacity
        engine.most = max(engine.most, running)
        kv_full = stats.kv_usage is not None and stats.kv_usage >= KV_FULL
        c = engine.c
        if engine.bound is not None and not engine.confirmed and engine.bound < c:
            engine.c = c = engine.bound  # a start value no longer: the cache says less
        preempted = _preempted(stats, earlier)
        lone = preempted == 1 and not engine.preempted and engine.confirmed and engine.kind == "kv"
        engine.preempted = preempted > 0
        if preempted and not lone and c > 1 and (running >= c - 1 or not engine.confirmed):
            # Its KV cache ran out: running requests went back to wait (and recompute), ahead of
            # anything sent after them. C is one less than what ran, confirmed as kv.
            engine.c = max(1, min(c, engine.most) - 1)
            engine.confirmed, engine.kind, engine.probing = True, "kv", False
            engine.held = (0, 0, False)
            self._pool_stands(engine)
        elif running > c and not (engine.confirmed and engine.kind == "kv"):
            # It runs more than believed: at least that, and no longer a known limit. (A cache-bound
            # engine runs one more now and then, a handed-over request while the stream it replaces
            # ends: its room is read from its cache instead, `_ran_everything`.)
            engine.c, engine.confirmed, engine.kind, engine.probing = running, False, None, False
            engine.held = (0, 0, False)
        elif waiting > 0 and stats.deferred is None and adapter_bound(stats):
            # Its requests name more adapters than a batch holds: some wait for an adapter slot
            # whatever its capacity, and the engine does not say which, so what waits says nothing of C.
            engine.held = (0, 0, False)
        elif held > 0 and running > 0 and (running < c or not engine.confirmed):
            # Held back (at C itself too while C is unconfirmed, e.g. its pool's: `_pool_stands`;
            # an unconfirmed engine running more than C was taken by the branch above).
            # Waiting beyond what was sent since the last reading waited through an engine step.
            proven = (
                sent is not None and reading.sent is not None and held > (reading.sent - sent) * self.share
            )
            self._held_back(engine, running, kv_full=kv_full, kv_filling=_filling(stats), proven=proven)
        else:
            engine.held = (0, 0, False)
            if waiting == 0 and running >= c:
                self._ran_everything(engine, running, usage=stats.kv_usage)
        engine.c = max(1, min(self.ceiling, MAX_CAPACITY, engine.c))

    def _held_back(
        self, engine: EngineLimit, running: int, *, kv_full: bool, kv_filling: bool, proven: bool
    ) -> None:
        """Waiting requests while it runs `running` < C: count the reading; enough in a row make
        `running` its confirmed limit: `CONFIRM`, or `PROVEN` when each after the first showed more
        waiting than was sent since the reading before, or one when a probe's one extra request waits
        at the confirmed limit (the gateway knows it sent exactly one more)."""
        if self.declared and not kv_full:
            return  # below a declared --max-num-seqs only a full cache is believed
        last, count, sure = engine.held
        if last == running:
            count, sure = count + 1, sure and proven
        else:
            count, sure = 1, True  # the first of a run proves nothing and needs nothing
        engine.held = (running, count, sure)
        again = engine.probing and running == engine.c - 1  # the probe's extra request was queued
        if count < (PROVEN if sure else CONFIRM) and not again:
            return
        if engine.confirmed and engine.kind == "kv":
            # A cache-bound limit moves with the answers' lengths, and requests pre-empted by the
            # engine wait too: one down per confirmation, not at once to what runs now.
            engine.c = max(running, engine.c - 1)
        else:
            engine.c, engine.kind = running, "kv" if kv_filling else "seqs"
        engine.confirmed, engine.probing, engine.held = True, False, (0, 0, False)
        engine.recheck_every = min(RECHECK_LAST, engine.recheck_every * 2) if again else RECHECK_FIRST
        engine.recheck_in = engine.recheck_every
        self._pool_stands(engine)

    def _pool_stands(self, confirmed: EngineLimit) -> None:
        """`confirmed`'s pool peers whose C is still a start value (not confirmed, above where the
        pool stands, `start`, and never seen running more) come down to it, unconfirmed (module
        docstring)."""
        c = self.start(confirmed.pool)
        for engine in self._engines.values():
            if engine.pool == confirmed.pool and not engine.confirmed and engine.c > c >= engine.most:
                engine.c = c

    def _ran_everything(self, engine: EngineLimit, running: int, *, usage: float | None) -> None:
        """Nothing waits and it runs at least C: grow as the module docstring says."""
        c = engine.c
        if engine.probing or not engine.confirmed:
            if engine.probing and running <= c - 1:
                return  # the probe's extra request has not arrived yet: wait for a reading that shows it
            engine.confirmed, engine.kind, engine.probing = False, None, False
            engine.c = max(running, c + max(1, math.ceil(c / 4)))
        elif engine.kind == "kv":
            if usage is not None and usage > 0:  # room at the running share: up to a full cache
                engine.c = max(c, min(c + max(1, math.ceil(c / 4)), holds_when_full(running, usage)))
        else:  # a confirmed slot count: held, but checked now and then
            engine.recheck_in -= 1
            if engine.recheck_in <= 0:
                engine.probing = True
                engine.c = c + 1


def adapter_bound(stats: EngineStats) -> bool:
    """Whether the engine's requests name more LoRA adapters than one batch may hold (`max_loras`,
    from `vllm:lora_requests_info`): then some of them wait for an adapter slot however many requests
    it could run, and a reading with requests waiting is no sign of its capacity (module docstring).

    >>> from tandem.router.types import AdapterLoad
    >>> def stats(active: int) -> EngineStats:
    ...     names = frozenset(f"a{i}" for i in range(active))
    ...     load = AdapterLoad(running=names, waiting=names, max_loras=4)
    ...     return EngineStats(running=4, waiting=3, kv_usage=0.1, block_size=16, num_gpu_blocks=100,
    ...                        adapters=load)
    >>> adapter_bound(stats(5)), adapter_bound(stats(4))
    (True, False)"""
    load = stats.adapters
    return load is not None and load.max_loras is not None and len(load.active) > load.max_loras


def _filling(stats: EngineStats) -> bool:
    """Whether the KV cache is filling enough (`KV_BOUND_FROM`) to be what holds requests back."""
    return stats.kv_usage is not None and stats.kv_usage >= KV_BOUND_FROM


def _preempted(stats: EngineStats, earlier: EngineReading | None) -> int:
    """How many running requests the engine pre-empted (its KV cache ran out) since `earlier`."""
    before = earlier.stats.preemptions if earlier is not None else None
    if stats.preemptions is None or before is None or stats.preemptions <= before:
        return 0
    return max(1, round(stats.preemptions - before))
