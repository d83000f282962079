"""Sending a request to a pool: pick an endpoint, account for it, and retry elsewhere while the
client has not received a byte.

Retry rule: a connect error, timeout, broken connection or 5xx *before the head of the answer*
takes the next candidate (the scheduler picks again among endpoints not yet tried), up to
`retries` more attempts; then `NoEndpointAvailable` (503). 4xx answers are the client's problem
and are returned as they are. Every failure is recorded against its endpoint (rotation) and in
`tandem_router_upstream_errors_total`, with one exception:

A connect timeout during which the router's own event loop lost at least `excusing_lag_s` (by
`loop_lag`, the `tandem.router.observe.looplag` monitor) is not counted against the engine's rotation: the
timer that fired ran on a stalled loop, so it measured the router, not the engine (a loopback
connect completes in the kernel at once). It is still retried elsewhere and counted in the metric,
with `kind="loop_lag"`. An engine that is really unreachable is still taken out: by the attempts made
while the loop keeps up, and by the metrics collector's failed scrapes.

A request under a LoRA adapter the service declares is **held, not failed**, while no engine can load
the adapter: an engine's 404 for it (vLLM's resolver found no files: the adapter is being fetched
into the cache, or its volume is not mounted yet) is `UpstreamAdapterMissing`, not counted against
the engine's rotation, and when every engine tried answered so the request waits and tries again,
after 0.25 s, then twice as long each time up to 4 s, for at most `adapter_hold_s` (30 s by
default); then `AdapterNotReady` (503, `Retry-After`). `tandem_router_adapter_held_total{outcome}`
counts the holds by how they ended (`loaded`, `expired`). A 404 for the base model or an undeclared
name is the client's problem and goes back as it is (the gateway refuses undeclared names itself).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tandem.router.discovery.capacity import EngineCapacity
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.errors import (
    AdapterNotReady,
    NoEndpointAvailable,
    UpstreamAdapterMissing,
    UpstreamConnectTimeout,
    UpstreamError,
)
from tandem.router.observe.looplag import LoopLagMonitor
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.scheduling import DispatchObserver, NoObserver, Routable, Scheduler
from tandem.router.types import Endpoint, EndpointSnapshot, Pool
from tandem.router.upstream.client import Upstream, UpstreamCall, UpstreamReply
from tandem.router.upstream.recall import Pending, Recalled, Recalls

log = logging.getLogger(__name__)

#: The first wait of a request held for its adapter, and the longest (doubling in between).
ADAPTER_RETRY_FIRST_S = 0.25
ADAPTER_RETRY_MAX_S = 4.0


class Attempt:
    """An upstream exchange that holds one in-flight slot on its endpoint until `finish`."""

    __slots__ = ("_dispatcher", "_finished", "_handed_over", "_ticket", "endpoint", "reply", "retries")

    def __init__(self, reply: UpstreamReply, dispatcher: Dispatcher, ticket: object = None) -> None:
        self.reply = reply
        self.endpoint = reply.endpoint
        self._dispatcher = dispatcher
        self._ticket = ticket
        self._finished = False
        self._handed_over = False
        #: Attempts on other endpoints that failed before this one (`Dispatcher.open`).
        self.retries = 0

    def hand_over(self) -> None:
        """The answer is a few tokens from its end: its slot on the endpoint may go to the next
        request now (it is still open until `finish`); idempotent."""
        if not self._finished and not self._handed_over:
            self._handed_over = True
            self._dispatcher.registry.hand_over(self.endpoint)

    def finish(self, error: UpstreamError | None = None) -> None:
        """Close the upstream response (back to the pool when it was read to its end) and free the
        slot; idempotent and synchronous, so it also runs while a task is being cancelled. `error`:
        the engine failed after the head (e.g. died mid-stream), which counts against it. A client
        that left is not the engine's fault: call without `error`."""
        if self._finished:
            return
        self._finished = True
        try:
            self.reply.close()
        finally:
            self._dispatcher.registry.end(self.endpoint, handed_over=self._handed_over)
            ticket, self._ticket = self._ticket, None  # it holds the request, which holds this attempt
            self._dispatcher.observer.finished(ticket)
            if error is not None:
                self._dispatcher.note_failure(self.endpoint, error)


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatcher:
    registry: EndpointRegistry
    scheduler: Scheduler
    upstream: Upstream
    metrics: RouterMetrics
    retries: int
    #: Told about every attempt (the scheduling state: queued work, routed prefixes, observed TTFT).
    observer: DispatchObserver = field(default_factory=NoObserver)
    #: The event loop's lag monitor (None: every connect timeout counts against the engine).
    loop_lag: LoopLagMonitor | None = None
    #: Seconds of loop lag during a connect timeout that excuse the engine (see the module docstring).
    excusing_lag_s: float = 2.5
    #: Times scheduling decisions (seconds).
    timer: Callable[[], float] = time.perf_counter
    #: Each engine's dispatch limit: candidates without room are passed over while others have it.
    capacity: EngineCapacity | None = None
    #: Requests without an answer yet, which a reading may recall (`tandem.router.upstream.recall`).
    recalls: Recalls | None = None
    #: Longest a request for a declared adapter waits for an engine that can load it (module docstring).
    adapter_hold_s: float = 30.0
    #: The clock of that hold (seconds).
    clock: Callable[[], float] = time.monotonic

    def choose(self, pool: Pool, request: Routable, *, prefer: str | None = None) -> Endpoint | None:
        """The scheduler's pick among `pool`'s endpoints in rotation (None when there is none), for a
        caller that must know the endpoint before sending (the P/D decision); pass it to `open`.
        `prefer`: an endpoint URL taken whenever it is in rotation (a stopped stream's engine)."""
        candidates = self.registry.candidates(pool)
        for snapshot in candidates if prefer is not None else ():
            if snapshot.endpoint.url == prefer:
                return snapshot.endpoint
        candidates = self._with_room(candidates)
        return self.pick(pool, request, candidates) if candidates else None

    def _with_room(self, candidates: Sequence[EndpointSnapshot]) -> Sequence[EndpointSnapshot]:
        """The candidates below their dispatch limit, or all of them when none is (the gate admitted
        the request, so one should have room; a racing prefill or retry must still be placed)."""
        capacity = self.capacity
        if capacity is None:
            return candidates
        roomy = [s for s in candidates if s.occupied < capacity.limit(s)]
        return roomy or candidates

    def pick(self, pool: Pool, request: Routable, candidates: Sequence[EndpointSnapshot]) -> Endpoint:
        """The scheduler's choice among `candidates` (non-empty), timed as one decision in
        `tandem_router_schedule_decision_duration_seconds` (prompt tokens and block keys included
        when the policy asks for them first)."""
        started = self.timer()
        endpoint = self.scheduler.pick(pool, request, candidates)
        self.metrics.decision_duration(pool).observe(self.timer() - started)
        return endpoint

    async def open(
        self,
        pool: Pool,
        *,
        request: Routable,
        call: UpstreamCall,
        first: Endpoint | None = None,
        recallable: str | None = None,
        pairs_with: str | None = None,
        room_for: str | None = None,
    ) -> Attempt:
        """Send `call` to an endpoint of `pool` chosen by the scheduler (the first attempt goes to
        `first` when given and still a candidate), retrying as described above. Raises
        `NoEndpointAvailable` (with the failures in its message), or `Recalled` when `recallable` (the
        request's tenant) and a reading, or another tenant's room (`room_for`), took it back before
        its answer started (`tandem.router.upstream.recall`).
        `pairs_with`: a KV layout; only endpoints whose layout pairs with it are tried
        (`EndpointRegistry.candidates`). `room_for`: the tenant of a request that pre-empted a stream
        for its slot: other tenants' requests still without an answer are recalled from the engine
        it is sent to while that engine has more open than it runs (`Recalls.make_room`,
        `EngineCapacity.runs`)."""
        held_since: float | None = None
        delay = ADAPTER_RETRY_FIRST_S
        while True:
            try:
                opened = await self._open_once(
                    pool, request=request, call=call, first=first if held_since is None else None,
                    recallable=recallable, pairs_with=pairs_with, room_for=room_for,
                )  # fmt: skip
            except _AllMissedAdapter as missed:
                now = self.clock()
                if held_since is None:
                    held_since = now
                    log.info(
                        "no engine can load the adapter yet: the request is held",
                        extra={"request_id": request.request_id, "adapter": request.lora_name, "pool": pool},
                    )
                if now + delay - held_since > self.adapter_hold_s:
                    self.metrics.adapter_held.labels("expired").inc()
                    raise AdapterNotReady(
                        f"adapter `{request.lora_name}` could not be loaded on any engine within "
                        f"{self.adapter_hold_s:g} s ({missed.detail})",
                        adapter=str(request.lora_name),
                        retry_after_s=round(ADAPTER_RETRY_MAX_S),
                    ) from None
                await asyncio.sleep(delay)
                delay = min(ADAPTER_RETRY_MAX_S, delay * 2)
                continue
            if held_since is not None:
                self.metrics.adapter_held.labels("loaded").inc()
            return opened

    async def _open_once(
        self,
        pool: Pool,
        *,
        request: Routable,
        call: UpstreamCall,
        first: Endpoint | None,
        recallable: str | None,
        pairs_with: str | None,
        room_for: str | None = None,
    ) -> Attempt:
        """One round of `open`: the first choice and up to `retries` others. Raises
        `_AllMissedAdapter` when every engine tried answered that it cannot load the request's adapter."""
        tried: list[Endpoint] = []
        failures: list[UpstreamError] = []
        for _ in range(1 + self.retries):
            candidates = self._with_room(self.registry.candidates(pool, exclude=tried, pairs_with=pairs_with))
            if not candidates:
                break
            if not tried and first is not None and any(s.endpoint == first for s in candidates):
                endpoint = first
            else:
                endpoint = self.pick(pool, request, candidates)
            if failures:
                self.metrics.retries.labels(pool, failures[-1].kind).inc()
            tried.append(endpoint)
            try:
                opened = await self.attempt(
                    endpoint, call, request=request, recallable=recallable, room_for=room_for
                )
            except UpstreamError as exc:
                # Kept without its traceback, which holds this frame (and so `failures`): a request
                # served on a retry would otherwise be a reference cycle (tests/router/test_request_garbage).
                failures.append(exc.with_traceback(None))
                continue
            opened.retries = len(failures)
            return opened
        if failures and all(isinstance(f, UpstreamAdapterMissing) for f in failures):
            raise _AllMissedAdapter("; ".join(f.message for f in failures))
        raise _unavailable(pool, failures, known=len(self.registry.endpoints(pool)))

    async def attempt(
        self,
        endpoint: Endpoint,
        call: UpstreamCall,
        *,
        request: Routable | None = None,
        recallable: str | None = None,
        room_for: str | None = None,
    ) -> Attempt:
        """One try on `endpoint`, no retry. Raises `UpstreamError` (already recorded), or
        `Recalled` (`recallable`, `room_for`: see `open`). `request`: the client's request, for the
        observer (attempts without one are not observed)."""
        self.registry.begin(endpoint)
        ticket = self.observer.started(endpoint, request) if request is not None else None
        mark = self.loop_lag.mark() if self.loop_lag is not None else 0.0
        pending = self._register(endpoint, recallable, request) if recallable is not None else None
        room = self._make_room(endpoint, room_for) if room_for is not None else None
        try:
            reply = await self.upstream.open(endpoint, call)
        except UpstreamError as exc:
            self.registry.end(endpoint)
            self.observer.finished(ticket)
            self.note_failure(endpoint, exc, excused=self._loop_stalled(exc, mark))
            raise
        except BaseException as exc:  # cancelled (client gone, timeout, recall): free it, blame no one
            self.registry.end(endpoint)
            self.observer.finished(ticket)
            if pending is not None and pending.taken_back(exc):
                self.metrics.recalled.labels(endpoint.pool, endpoint.name).inc()
                raise Recalled(endpoint, until=pending.until) from None
            raise
        finally:
            if pending is not None and self.recalls is not None:
                self.recalls.done(endpoint, pending)
            if room is not None:
                room.set()  # the requests recalled for it may be sent again, behind it
        if reply.status == 404 and request is not None and request.lora_name is not None:
            reply.close()
            self.registry.end(endpoint)
            self.observer.finished(ticket)
            error = UpstreamAdapterMissing(
                f"{endpoint.name}: cannot load adapter {request.lora_name}: "
                + reply.head[:200].decode("utf-8", errors="replace")
            )
            self.note_failure(endpoint, error)
            raise error
        self.registry.record_success(endpoint)
        lag = self.loop_lag.lag_since(mark) if self.loop_lag is not None else 0.0
        self.observer.answered(ticket, status=reply.status, streamed=reply.streaming, lag_s=lag)
        return Attempt(reply, self, ticket)

    def _register(self, endpoint: Endpoint, tenant: str, request: Routable | None) -> Pending | None:
        """This attempt of `tenant`'s, recallable until its answer starts (`Recalls.register`)."""
        if self.recalls is None:
            return None
        loaded = request is not None and request.kv_loaded
        return self.recalls.register(endpoint, tenant=tenant, loaded=loaded)

    def _make_room(self, endpoint: Endpoint, tenant: str) -> asyncio.Event | None:
        """Recall other tenants' requests without an answer from `endpoint` while it has more open
        than it runs (`Recalls.make_room`), for a request of `tenant` that pre-empted a stream; the
        event (None: none recalled), set once that request's answer started or failed, sends them
        again."""
        if self.recalls is None or self.capacity is None:
            return None
        snapshot = self.registry.snapshot(endpoint)
        room = asyncio.Event()
        count = self.recalls.make_room(
            snapshot, limit=self.capacity.runs(snapshot), tenant=tenant, until=room
        )
        if not count:
            return None  # nothing waits for it
        log.info(
            "requests recalled to make room for a pre-empting request",
            extra={"endpoint": endpoint.name, "tenant": tenant, "recalled": count},
        )
        return room

    def note_failure(self, endpoint: Endpoint, error: UpstreamError, *, excused: bool = False) -> None:
        """Count a failure of `endpoint` (rotation and metrics); `excused`: the router's stalled
        loop explains it, so only the metric counts it (`kind="loop_lag"`)."""
        if excused:
            log.warning(
                "upstream connect timeout during event-loop lag: not counted against the endpoint",
                extra={"endpoint": endpoint.name, "pool": endpoint.pool, "error": error.message},
            )
        elif not isinstance(error, UpstreamAdapterMissing):  # the engine is well; the adapter is not there
            self.registry.record_failure(endpoint)
        kind = "loop_lag" if excused else error.kind
        self.metrics.upstream_errors.labels(endpoint.pool, endpoint.name, kind).inc()

    def _loop_stalled(self, error: UpstreamError, mark: float) -> bool:
        """Whether `error` is a connect timeout during which the loop lost `excusing_lag_s`."""
        if self.loop_lag is None or not isinstance(error, UpstreamConnectTimeout):
            return False
        return self.loop_lag.lag_since(mark) >= self.excusing_lag_s


class _AllMissedAdapter(Exception):
    """Every engine `Dispatcher._open_once` tried could not load the request's adapter."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _unavailable(pool: Pool, failures: list[UpstreamError], *, known: int) -> NoEndpointAvailable:
    if not failures:
        state = "none known" if not known else f"all {known} cooling down after failures"
        return NoEndpointAvailable(f"no {pool} endpoint in rotation ({state})")
    detail = "; ".join(f.message for f in failures)
    attempts = f"{len(failures)} attempt{'s' if len(failures) > 1 else ''} failed"
    error = NoEndpointAvailable(
        f"no {pool} endpoint could serve the request: {detail}",
        public=f"no {pool} endpoint could serve the request ({attempts}); retry later",
    )
    error.__cause__ = failures[-1]
    return error
