"""The control loop of one pool: discover → scrape → observe → decide → act.

`PoolController.step(now)` runs one round; the I/O is behind two small interfaces the caller
injects, so the same controller drives Kubernetes Deployments and local processes:

- `PoolTarget`: the pool's ready engines (discovery, as the router sees them), the replica count
  the actuator is currently asked for, and `scale(n)` to change it;
- a scrape function: engine URLs → readings (None for a failed scrape);
- optionally a gateway function: the gateway's queue depth per replica URL (None for a failed
  scrape), whose queued requests count in both pools' demand (`tandem.autoscaler.observe`).

The controller only acts on a valid decision that differs from the current request; a hold (invalid
or stale data) changes nothing, and neither does a scale-down while some requested replicas are not
ready yet (the decider counts ready engines only: shrinking then would undo a scale-up in progress),
unless they have been missing for `ready_timeout_s` (a pod that cannot be scheduled): then the
controller gives up waiting for them (`PoolOutcome.gave_up`), so the pool can shrink again.
Example (timeout 600 s): 4 asked, 2 ready since t=0, load wants 1 → held at 4 until t=600, then 1.
The controller also learns the pool's engine start time from its own scale-ups
(`tandem.autoscaler.startup`) and hands it to the decider in the observation (`engine_start_s`).
What happened comes back as a `PoolOutcome` for metrics, Events and
status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from tandem.autoscaler.decider import (
    DeciderParams,
    DeciderState,
    Decision,
    DecodeObservation,
    PrefillObservation,
    decide_decode,
    decide_prefill,
)
from tandem.autoscaler.observe import (
    PoolHistory,
    Scrape,
    decode_observation,
    learn_service,
    prefill_observation,
    remember,
)
from tandem.autoscaler.readings import EngineReading, GatewayReading
from tandem.autoscaler.startup import StartTimes, asked, cancelled, readied

PoolName = Literal["prefill", "decode"]
ScrapeFn = Callable[[Sequence[str]], Awaitable[dict[str, EngineReading | None]]]
#: The gateway's replicas now: URL → its demand signals (None: that scrape failed).
GatewayFn = Callable[[], Awaitable[Mapping[str, GatewayReading | None]]]
#: How long a measured per-replica prefill rate is remembered (seconds).
RATE_MEMORY_S = 600.0


class PoolTarget(Protocol):
    """One pool's engines and replica count, wherever they run."""

    async def endpoints(self) -> list[str]:
        """Base URLs of the pool's ready engines (what the router routes to)."""
        ...

    async def requested(self) -> int:
        """The replica count the pool is currently asked to have."""
        ...

    async def scale(self, replicas: int, *, reason: str) -> None:
        """Ask for `replicas`; returns once the request is made (not once they are ready)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolOutcome:
    """One round of one pool: what was seen, decided and done. `direction` is set when it scaled."""

    service: str
    pool: PoolName
    observed: DecodeObservation | PrefillObservation
    decision: Decision
    ready: int
    desired: int
    panic: bool
    previous: int
    direction: Literal["up", "down"] | None = None
    #: Seconds some requested replicas have been missing (None: all ready), and whether the
    #: controller gave up waiting for them (`ready_timeout_s` passed).
    unready_s: float | None = None
    gave_up: bool = False
    #: The pool's learned engine start time (None: not measured yet).
    engine_start_s: float | None = None


@dataclass(kw_only=True)
class PoolController:
    """Keeps one pool sized; holds the decider state and the scrape history between rounds."""

    service: str
    pool: PoolName
    params: DeciderParams
    target: PoolTarget
    scrape: ScrapeFn
    gateways: GatewayFn | None = None
    state: DeciderState = field(default_factory=DeciderState)
    history: PoolHistory = field(default_factory=PoolHistory)
    #: Since when (monotonic seconds) fewer replicas than requested have been ready.
    unready_since: float | None = None
    starts: StartTimes = field(default_factory=StartTimes)
    last_ready: int | None = None

    async def step(self, now: float) -> PoolOutcome:
        """One round at monotonic time `now` (module docstring)."""
        urls = await self.target.endpoints()
        if self.gateways is not None:  # at the same time: each reading's counters are read close to `now`
            readings, queues = await asyncio.gather(self.scrape(urls), self.gateways())
        else:
            readings, queues = await self.scrape(urls), {}
        keep = max(self.params.panic_window_s, 1.0) + 1.0
        self.history = remember(self.history, Scrape(now, readings, queues), keep_s=keep)
        ready_now = len(readings)
        if self.last_ready is not None and ready_now > self.last_ready:
            self.starts = readied(
                self.starts,
                now=now,
                count=ready_now - self.last_ready,
                forget_after_s=self.params.ready_timeout_s,
            )
        self.last_ready = ready_now
        observed, decision = self._decide(now)
        previous = await self.target.requested()
        if observed.ready < previous:
            self.unready_since = now if self.unready_since is None else self.unready_since
        else:
            self.unready_since = None
        unready_s = None if self.unready_since is None else now - self.unready_since
        gave_up = unready_s is not None and unready_s >= self.params.ready_timeout_s
        if decision.valid and decision.desired < previous and gave_up:
            gone = f"{previous - observed.ready} requested replicas not ready after {unready_s:.0f} s"
            decision = Decision(desired=decision.desired, reason=f"{decision.reason}; {gone}: given up")
        elif decision.valid and decision.desired < previous and observed.ready < previous:
            # Replicas asked for are still starting: the decider saw only the ready ones, so a
            # scale-down now would undo a scale-up (or shrink a fresh pool) before it took effect.
            wait = f"scale-down waits until the {previous} requested replicas are ready ({observed.ready})"
            decision = Decision(desired=previous, reason=f"{decision.reason}; {wait}")
        direction: Literal["up", "down"] | None = None
        if decision.valid and decision.desired != previous:
            direction = "up" if decision.desired > previous else "down"
            await self.target.scale(decision.desired, reason=decision.reason)
            if direction == "up":
                self.starts = asked(self.starts, now=now, count=decision.desired - previous)
            else:
                self.starts = cancelled(self.starts, count=previous - decision.desired)
        return PoolOutcome(
            service=self.service,
            pool=self.pool,
            observed=observed,
            decision=decision,
            ready=observed.ready,
            desired=decision.desired if decision.valid else previous,
            panic=self.state.panic_since is not None,
            previous=previous,
            direction=direction,
            unready_s=unready_s,
            gave_up=gave_up,
            engine_start_s=self.starts.estimate_s,
        )

    def _decide(self, now: float) -> tuple[DecodeObservation | PrefillObservation, Decision]:
        observed: DecodeObservation | PrefillObservation
        start = self.starts.estimate_s
        if self.pool == "decode":
            self.history = learn_service(self.history)
            observed, problem = decode_observation(self.history)
            observed = replace(observed, engine_start_s=start)
            decision, self.state = decide_decode(
                params=self.params, observed=observed, state=self.state, now=now
            )
        else:
            observed, self.history, problem = prefill_observation(
                self.history, ttft_window_s=self.params.panic_window_s, rate_memory_s=RATE_MEMORY_S
            )
            observed = replace(observed, engine_start_s=start)
            decision, self.state = decide_prefill(
                params=self.params, observed=observed, state=self.state, now=now
            )
        if problem is not None:
            decision = Decision(desired=decision.desired, reason=f"hold: {problem}", valid=False)
        return observed, decision
