"""Rounds over every autoscaled InferenceService: each pool's controller steps once per interval.

`Autoscaler` owns the controllers of every service (set and removed by the caller as services come and
go), runs a round every `interval_s` (`ROUND_SECONDS` by default: the collector's scrape period), records each
outcome as metrics and hands the service's outcomes to `report` (Kubernetes: Events and status; locally:
log lines). One pool's failure in a round (an API error while scaling) is logged and does not stop
the others or the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from tandem.core.spec import InferenceServiceSpec

log = logging.getLogger(__name__)

#: Seconds between two rounds (scrape, decide, act), locally and in a cluster. Half a second: a step
#: shows in the gateway's held prefills and the engines' queues at once, and each round earlier is a
#: replica ready half a second sooner (docs/autoscaler.md, "Measured: half-second rounds"); the
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
    ) -> None:
        self.metrics = metrics
        self.report = report
        self._interval = interval_s
        self._clock = clock
        self.services: dict[str, list[PoolController]] = {}
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

    async def round(self) -> list[PoolOutcome]:
        """One step of every pool of every service, services concurrently."""
        now = self._clock()
        results = await asyncio.gather(
            *(self._service_round(name, controllers, now) for name, controllers in self.services.items())
        )
        self.last_round = self._clock()
        return [outcome for outcomes in results for outcome in outcomes]

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
        while not stop.is_set():
            started = self._clock()
            await self.round()
            remaining = self._interval - (self._clock() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, remaining))


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
