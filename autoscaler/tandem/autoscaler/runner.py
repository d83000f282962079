"""Rounds over every autoscaled InferenceService: each pool's controller steps once per interval.

`Autoscaler` owns the controllers of every service (set and removed by the caller as services come and
go), runs a round every `interval_s` (`ROUND_SECONDS` by default: the collector's scrape period), records each
outcome as metrics and hands the service's outcomes to `report` (Kubernetes: Events and status; locally:
log lines). One pool's failure in a round (an API error while scaling) is logged and does not stop
the others or the next round.

Services are independent: each service's step is a task of its own, and a round waits for them at
most `budget_s` (by default the interval, and at least the scrape deadline). A service still busy
then (an engine that answers slowly, an API call that hangs) goes on in the background: its outcome
is recorded and reported when it ends, the round returns without it, and the next round starts no
second step for it while the first runs. So one tenant's engine can delay only its own service's
decisions. Example: services A and B, B's engines drip `/metrics`: each round ends after A's step,
B's scrape fails at its deadline (`tandem.autoscaler.scraper`) and B holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from tandem.autoscaler.control import (
    GatewayFn,
    PoolController,
    PoolName,
    PoolOutcome,
    PoolTarget,
    ScrapeFn,
)
from tandem.autoscaler.decider import DeciderParams, decode_params, prefill_params
from tandem.autoscaler.metrics import AutoscalerMetrics
from tandem.autoscaler.scraper import SCRAPE_DEADLINE_S
from tandem.core.spec import InferenceServiceSpec

log = logging.getLogger(__name__)

#: Seconds between two rounds (scrape, decide, act), locally and in a cluster. Half a second: a step
#: shows in the gateway's held prefills and the engines' queues at once, and each round earlier is a
#: replica ready half a second sooner (docs/autoscaler.md, "Half-second rounds"); the
#: decider's windows and medians are spans of seconds, not counts of rounds.
ROUND_SECONDS = 0.5

Report = Callable[[str, Sequence[PoolOutcome]], Awaitable[None]]


def pool_params(spec: InferenceServiceSpec) -> dict[PoolName, DeciderParams]:
    """The decider parameters of every pool whose `autoscaling.enabled` is true."""
    params: dict[PoolName, DeciderParams] = {}
    if spec.prefill.autoscaling.enabled:
        params["prefill"] = prefill_params(spec.prefill.autoscaling)
    if spec.decode.autoscaling.enabled:
        params["decode"] = decode_params(spec.decode.autoscaling)
    return params


def controllers_for(
    service: str,
    spec: InferenceServiceSpec,
    *,
    targets: Mapping[PoolName, PoolTarget],
    scrape: ScrapeFn,
    gateways: GatewayFn | None = None,
) -> list[PoolController]:
    """One controller per autoscaled pool of `spec`; `gateways` reads the gateway's queue (both pools)."""
    return [
        PoolController(
            service=service,
            pool=pool,
            params=params,
            target=targets[pool],
            scrape=scrape,
            gateways=gateways,
        )
        for pool, params in pool_params(spec).items()
    ]


async def _no_report(service: str, outcomes: Sequence[PoolOutcome]) -> None:
    return None


class Autoscaler:
    """Runs the rounds (module docstring); `clock` is monotonic seconds (injected for tests)."""

    def __init__(
        self,
        *,
        metrics: AutoscalerMetrics,
        report: Report = _no_report,
        interval_s: float = ROUND_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        budget_s: float | None = None,
    ) -> None:
        self.metrics = metrics
        self.report = report
        self._interval = interval_s
        self._clock = clock
        self._budget = budget_s if budget_s is not None else max(interval_s, SCRAPE_DEADLINE_S)
        self.services: dict[str, list[PoolController]] = {}
        #: Each service's step now running (module docstring: one at a time per service).
        self.in_flight: dict[str, asyncio.Task[list[PoolOutcome]]] = {}
        #: When the last round ended (the clock's seconds); None before the first.
        self.last_round: float | None = None

    def set_service(self, service: str, controllers: list[PoolController]) -> None:
        """Add a service, or update its pools: a pool kept keeps its decider state and history."""
        old = {c.pool: c for c in self.services.get(service, [])}
        merged = []
        for controller in controllers:
            kept = old.get(controller.pool)
            if kept is not None:
                kept.params, kept.target = controller.params, controller.target
                kept.scrape, kept.gateways = controller.scrape, controller.gateways
                controller = kept
            merged.append(controller)
        if merged:
            self.services[service] = merged
        else:
            self.remove_service(service)

    def remove_service(self, service: str) -> None:
        if self.services.pop(service, None) is not None:
            self.metrics.forget(service)
        task = self.in_flight.pop(service, None)
        if task is not None:
            task.cancel()

    async def round(self) -> list[PoolOutcome]:
        """One step of every pool of every service not still busy with the last one, services
        independently; returns the outcomes of the steps that ended within `budget_s`."""
        now = self._clock()
        started: list[asyncio.Task[list[PoolOutcome]]] = []
        for name, controllers in self.services.items():
            if name in self.in_flight:
                log.info("autoscaler: last round's step still running; skipped", extra={"service": name})
                continue
            task = asyncio.create_task(self._service_round(name, controllers, now), name=f"autoscale {name}")
            task.add_done_callback(functools.partial(self._ended, name))
            self.in_flight[name] = task
            started.append(task)
        done: set[asyncio.Task[list[PoolOutcome]]] = set()
        if started:
            done, _ = await asyncio.wait(started, timeout=self._budget)
        self.last_round = self._clock()
        return [outcome for task in started if task in done for outcome in task.result()]

    def _ended(self, service: str, task: asyncio.Task[list[PoolOutcome]]) -> None:
        if self.in_flight.get(service) is task:
            del self.in_flight[service]

    async def close(self) -> None:
        """Cancel the steps still running."""
        tasks = list(self.in_flight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def alive(self, within_s: float) -> bool:
        """True when a round ended less than `within_s` ago (liveness)."""
        return self.last_round is not None and self._clock() - self.last_round < within_s

    async def _service_round(
        self, service: str, controllers: list[PoolController], now: float
    ) -> list[PoolOutcome]:
        outcomes: list[PoolOutcome] = []
        for controller in controllers:
            try:
                outcome = await controller.step(now)
            except Exception as exc:  # noqa: BLE001 -- boundary: one pool's I/O failure must not stop the others
                log.warning(
                    "autoscaler round failed: %r",
                    exc,
                    extra={"service": service, "pool": controller.pool, "error": repr(exc)},
                )
                continue
            self.metrics.record(outcome)
            _log(outcome)
            outcomes.append(outcome)
        try:
            await self.report(service, outcomes)
        except Exception as exc:  # noqa: BLE001 -- boundary: a failed Event/status write is retried next round
            log.warning("autoscaler report failed: %r", exc, extra={"service": service, "error": repr(exc)})
        return outcomes

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds every `interval_s` until `stop` is set."""
        try:
            while not stop.is_set():
                started = self._clock()
                await self.round()
                remaining = self._interval - (self._clock() - started)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=max(0.0, remaining))
        finally:
            await self.close()


def _log(outcome: PoolOutcome) -> None:
    fields = {
        "service": outcome.service,
        "pool": outcome.pool,
        "ready": outcome.ready,
        "desired": outcome.desired,
        "reason": outcome.decision.reason,
    }
    if outcome.direction is not None:
        log.info(f"scaled {outcome.direction}", extra={**fields, "from": outcome.previous})
    elif not outcome.decision.valid:
        log.debug("hold", extra=fields)
