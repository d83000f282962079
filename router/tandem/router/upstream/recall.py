"""Recalling requests that wait in an engine's queue beyond its capacity.

The gateway dispatches into the capacity it knows (`tandem.router.discovery.capacity`). Before an
engine's C is known (a fresh gateway, nothing declared: C starts at 256), a flood that arrives at once
is sent on, and the engine queues all it cannot run, first come first served. Once C is learned the
gateway sends no more, but what it already sent still waits in the engine, ahead of any tenant that
asks later: with 64 streams on four engines of 4 slots, 12 per engine, three seconds of answers.

A recall takes such requests back. When a reading of an engine shows requests waiting while this
process has more requests open to it than its dispatch limit, the newest of those still without an
answer's first byte are recalled (`to_recall`: the excess, at most what the engine says waits):

- the upstream request is closed (the engine aborts it; it had not started, or it would have sent a
  first byte), its slot on the endpoint is free, nothing counts against the engine;
- the request gives its unit of admission capacity back and waits in the fair queue again, at the
  front of its tenant's requests, its prompt not charged twice (`AdmissionGate.resume`);
- when its turn comes it is dispatched again, to whichever engine the scheduler picks then.

The client sees nothing but a later first token. Newest first: an engine schedules first come first
served, so the requests dispatched last are the ones still waiting. Only requests with no answer yet
are recalled (a streamed answer's first byte, a whole buffered answer), and by a reading only those
whose KV was not loaded from a prefill elsewhere (the KV they wait for may still be on its way to
that engine; only a pre-empting request recalls them, below). Example: C confirmed at 4 while this
gateway has 16 open to the engine and the reading says 12 wait: the 12 newest are recalled; with 2
gateway workers each holds 8 against a limit of 2 and recalls 6.

**Room for a pre-empting request.** A request that took its slot by pre-empting a stream
(`tandem.router.admission.preemption`) may still find its engine's queue taken: with the handover's
lead (`tandem.router.pipeline.lead`) requests of the tenant over its share are sent to a
disaggregated decode engine before the stream they follow has freed its blocks, and an engine
schedules first come first served. So when it is sent (`make_room`), the newest requests of other
tenants on that engine still without an answer are recalled while the engine has more open than it
runs (the dispatch limit without its lookahead, `EngineCapacity.runs`), the pre-empting request
counted. Here requests whose KV was loaded from a prefill elsewhere are recalled too: the prefill
left the prompt's KV in the KV pool, so whichever decode engine takes them again loads it from there.
The requests recalled this way keep their grants (given back, the gateway would at once grant them
again and send them before the pre-empting request), and are sent again, to whichever engine the
scheduler picks then, once the pre-empting request's answer has started or failed (at most
`ROOM_WAIT_S`): behind it in the engine's queue. Example: C 6, 5 streams running, 2 heavy requests
sent ahead and waiting, the light tenant's request sent: 8 open, so both heavy ones are recalled and
sent again once the light answer has started. The same holds for a pre-empting request computed
on the stopped stream's decode engine (the swap, `tandem.router.pd.disagg`). Nothing of this applies
to an aggregated pool: nothing is sent ahead of a slot there (its lead is the few milliseconds
between a grant and its dispatch).

Counted in `tandem_router_recalled_total{pool,endpoint}`; each recalled request logs one line.
"""

from __future__ import annotations

import asyncio

from tandem.router.types import Endpoint, EndpointSnapshot


def to_recall(*, occupied: int, limit: int, waiting: int, pending: int) -> int:
    """How many of the `pending` (no answer yet) requests to recall: the excess of the `occupied`
    slots over `limit`, at most `waiting` (what the engine's reading says waits).

    >>> to_recall(occupied=16, limit=4, waiting=12, pending=16)
    12
    >>> to_recall(occupied=16, limit=4, waiting=3, pending=16)
    3
    >>> to_recall(occupied=4, limit=4, waiting=5, pending=4)
    0
    """
    return max(0, min(occupied - limit, waiting, pending))


#: The longest a request recalled to make room waits for the pre-empting request before it is sent
#: again (a pre-empting request normally starts within an engine step or two).
ROOM_WAIT_S = 1.0


class Recalled(Exception):
    """The request was taken back from `endpoint` before its answer started (module docstring);
    not an `UpstreamError`: it is not retried elsewhere at once, it waits for its turn again, or,
    recalled to make room (`until`), keeps its grant and is sent again once `until` is set."""

    def __init__(self, endpoint: Endpoint, *, until: asyncio.Event | None = None) -> None:
        super().__init__(f"recalled from {endpoint.name}")
        self.endpoint = endpoint
        self.until = until


class Pending:
    """One request sent to an engine and waiting for the head of its answer, in a task that a recall
    cancels (`Recalls.register`). `tenant`: whose; `loaded`: its KV comes from a prefill elsewhere
    (recalled only to make room, never by a reading)."""

    __slots__ = ("loaded", "recalled", "task", "tenant", "until")

    def __init__(
        self, task: asyncio.Task[object], *, tenant: str | None = None, loaded: bool = False
    ) -> None:
        self.task = task
        self.tenant = tenant
        self.loaded = loaded
        self.recalled = False
        self.until: asyncio.Event | None = None

    def recall(self, until: asyncio.Event | None = None) -> None:
        self.recalled = True
        self.until = until
        self.task.cancel()

    def taken_back(self, error: BaseException) -> bool:
        """Whether `error`, raised in the task while it waited, is this recall and nothing else (the
        task's cancellation is then undone; a client gone at the same moment still cancels it)."""
        return self.recalled and isinstance(error, asyncio.CancelledError) and self.task.uncancel() == 0


class Recalls:
    """The requests without an answer yet, per engine URL in dispatch order, and the recall of the
    newest ones (module docstring)."""

    def __init__(self) -> None:
        self._pending: dict[str, dict[Pending, None]] = {}

    def register(
        self, endpoint: Endpoint, *, tenant: str | None = None, loaded: bool = False
    ) -> Pending | None:
        """The current task waits for `endpoint`'s answer; pair with `done`. None outside a task."""
        task = asyncio.current_task()
        if task is None:
            return None
        entry = Pending(task, tenant=tenant, loaded=loaded)
        self._pending.setdefault(endpoint.url, {})[entry] = None
        return entry

    def done(self, endpoint: Endpoint, entry: Pending) -> None:
        """The answer's head came, or the wait ended otherwise: no longer recallable."""
        waiting = self._pending.get(endpoint.url)
        if waiting is not None:
            waiting.pop(entry, None)
            if not waiting:
                del self._pending[endpoint.url]

    def pending(self, url: str) -> int:
        return len(self._pending.get(url, ()))

    def check(self, snapshot: EndpointSnapshot, *, limit: int) -> int:
        """After a reading of `snapshot`'s engine: recall what `to_recall` says, newest first;
        returns how many."""
        reading = snapshot.engine
        if reading is None or reading.stale:
            return 0
        entries = [e for e in self._pending.get(snapshot.endpoint.url, ()) if not e.loaded]
        count = to_recall(
            occupied=snapshot.occupied, limit=limit, waiting=reading.stats.waiting, pending=len(entries)
        )
        return self._recall(snapshot.endpoint.url, entries[len(entries) - count :] if count else [])

    def make_room(self, snapshot: EndpointSnapshot, *, limit: int, tenant: str, until: asyncio.Event) -> int:
        """Room on `snapshot`'s engine for a request of `tenant` being sent there after pre-empting
        a stream for its slot (`occupied` counts it): the newest requests of other tenants still
        without an answer are recalled while the engine has more open than `limit`; they keep their
        grants and are sent again once `until` is set, behind it (module docstring, "Room for a
        pre-empting request"). Returns how many."""
        entries = [e for e in self._pending.get(snapshot.endpoint.url, ()) if e.tenant != tenant]
        count = to_recall(occupied=snapshot.occupied, limit=limit, waiting=len(entries), pending=len(entries))
        chosen = entries[len(entries) - count :] if count else []
        return self._recall(snapshot.endpoint.url, chosen, until=until)

    def _recall(self, url: str, entries: list[Pending], *, until: asyncio.Event | None = None) -> int:
        """Recall `entries` (all pending on `url`); returns how many."""
        waiting = self._pending.get(url, {})
        for entry in entries:
            del waiting[entry]
            entry.recall(until)
        if not waiting:
            self._pending.pop(url, None)
        return len(entries)
