"""How many requests each engine can run at once, and so how many the gateway sends it.

The gateway dispatches only into capacity it knows: an engine gets at most `limit` requests from
this gateway process at once, counted by the gateway itself (`EndpointSnapshot.in_flight`, exact and
immediate), so the backlog waits in the gateway's fair queue, where it can be ordered between
tenants, not in the engine's first-come-first-served queue.

Per engine, `C` is its concurrency (vLLM's `--max-num-seqs`, or less when its KV cache is the
limit). It starts at `initial` (the pool's `--max-num-seqs` from `spec.engine.args`, else vLLM's
default 256) and follows the engine's own numbers at each new scrape:

    waiting > 0 and running > 0  →  C = min(C, running)   the engine ran only `running` of what it had
    waiting = 0 and running > C  →  C = running           it ran everything: it can run at least that

and `limit = ceil((C + lookahead) / share)`, capped at `cap`, with `lookahead = max(1, round(0.1·C))`
requests queued in the engine so its next batch is never short while the gateway's next request is
on its way, and `share` the number of gateway processes sending to the same engines (workers ×
replicas; each takes its part). Example: an engine with `--max-num-seqs 4` behind 2 workers: C = 4,
lookahead 1, each worker sends it at most ceil(5 / 2) = 3. Starting from 256 on an engine whose KV cache
holds 100 sequences: the first scrape shows running 100 with waiting > 0 → C = 100, limit 110.
Starting below the truth, C grows by the lookahead per scrape (10% a second) until waiting appears.

Pure (the readings come in; no clock, no I/O).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.router.types import EndpointSnapshot, EngineReading

#: vLLM's default `--max-num-seqs`, the starting point when the spec's engine arguments say nothing.
DEFAULT_CAPACITY = 256
MAX_CAPACITY = 65_536
_MAX_NUM_SEQS = re.compile(r"^--max-num-seqs(?:=(\d+))?$")


def capacity_from_args(args: Sequence[str]) -> int | None:
    """`--max-num-seqs N` (or `=N`) from engine arguments, else None."""
    for i, arg in enumerate(args):
        match = _MAX_NUM_SEQS.match(arg)
        if match is None:
            continue
        value = match.group(1) or (args[i + 1] if i + 1 < len(args) else "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


@dataclass(slots=True)
class EngineCapacity:
    """Learned concurrency per engine URL and the dispatch limit it gives (module docstring)."""

    initial: int = DEFAULT_CAPACITY
    lookahead: float = 0.1
    share: int = 1
    cap: int = MAX_CAPACITY
    _learned: dict[str, int] = field(default_factory=dict)
    _seen: dict[str, EngineReading] = field(default_factory=dict)

    def concurrency(self, snapshot: EndpointSnapshot) -> int:
        """C for this endpoint's engine, updated from a reading not seen before."""
        url, reading = snapshot.endpoint.url, snapshot.engine
        if reading is not None and not reading.stale and self._seen.get(url) is not reading:
            self._seen[url] = reading
            self._learn(url, reading)
        return self._learned.get(url, self.initial)

    def limit(self, snapshot: EndpointSnapshot) -> int:
        """Requests this gateway process may have open to the endpoint."""
        c = self.concurrency(snapshot)
        total = c + max(1, round(self.lookahead * c))
        return max(1, min(self.cap, math.ceil(total / self.share)))

    def has_room(self, snapshot: EndpointSnapshot) -> bool:
        return snapshot.in_flight < self.limit(snapshot)

    def total(self, snapshots: Sequence[EndpointSnapshot]) -> int:
        """Σ `limit`: how many requests this process may have open to the pool."""
        return sum(self.limit(s) for s in snapshots)

    def forget(self, keep: set[str]) -> None:
        for url in [u for u in self._learned if u not in keep]:
            del self._learned[url]
        for url in [u for u in self._seen if u not in keep]:
            del self._seen[url]

    def _learn(self, url: str, reading: EngineReading) -> None:
        stats = reading.stats
        c = self._learned.get(url, self.initial)
        if stats.waiting > 0 and stats.running > 0:
            c = min(c, stats.running)
        elif stats.waiting == 0 and stats.running > c:
            c = stats.running
        self._learned[url] = max(1, min(MAX_CAPACITY, c))
