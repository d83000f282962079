"""The autoscaler inside `tandem up`: one background thread with its own event loop.

It runs in the `tandem up` process (not as a child) because it starts and stops engine processes
through the runtime's own `Supervisor`, which must know every child to stop them all on exit. The
metrics are served on 127.0.0.1:`metrics_port` (`/metrics`, prometheus_client's server). The gateway's
queue depth is read from the local router's `/metrics` every round (requests waiting there count in
both pools' demand).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Literal
from wsgiref.simple_server import WSGIServer

import httpx
from prometheus_client import CollectorRegistry, start_http_server

from tandem.autoscaler.control import PoolName, PoolOutcome, PoolTarget
from tandem.autoscaler.metrics import AutoscalerMetrics
from tandem.autoscaler.readings import GatewayReading
from tandem.autoscaler.runner import ROUND_SECONDS, Autoscaler, controllers_for
from tandem.autoscaler.scraper import Scraper
from tandem.core.spec import InferenceService
from tandem.local.autoscale import LocalEndpoints, LocalPool
from tandem.local.plan import LOOPBACK, LocalPlan
from tandem.local.ports import free_ports
from tandem.local.supervisor import Child, Supervisor

Say = Callable[[str], None]
POOLS: tuple[Literal["prefill", "decode"], ...] = ("prefill", "decode")


def write_initial_endpoints(plan: LocalPlan, engines: Sequence[Child]) -> LocalEndpoints | None:
    """List the (ready) planned engines in the endpoint file before the gateway starts; the file is
    written even with none (a pool that starts from zero), so the gateway finds an empty pool, not
    a missing file."""
    if plan.endpoint_file is None:
        return None
    listed = LocalEndpoints(plan.endpoint_file)
    for child in engines:
        if child.plan.role in POOLS:
            listed.add(child.plan.role, child.plan.url)
    listed.save()
    return listed


class LocalAutoscaler:
    """Starts with `start()` (returns the metrics URL), ends with `stop()` (idempotent)."""

    def __init__(
        self,
        *,
        isvc: InferenceService,
        plan: LocalPlan,
        supervisor: Supervisor,
        listed: LocalEndpoints,
        metrics_port: int,
        say: Say,
        interval_s: float = ROUND_SECONDS,
        startup_timeout_s: Callable[[PoolName], float] = lambda pool: 120.0,
    ) -> None:
        self._isvc = isvc
        self._plan = plan
        self._supervisor = supervisor
        self._listed = listed
        self._ports = free_ports()  # engines bind them later: below the ephemeral range
        self._metrics_port = metrics_port
        self._say = say
        self._interval = interval_s
        #: How long an engine the autoscaler starts may take to become ready, per pool (as at launch).
        self._startup_timeout = startup_timeout_s
        self._registry = CollectorRegistry()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self._metrics_port}/metrics"

    def start(self) -> str:
        self._server, _ = start_http_server(self._metrics_port, addr=LOOPBACK, registry=self._registry)
        self._thread = threading.Thread(target=self._run, name="autoscaler", daemon=True)
        self._thread.start()
        self._started.wait(timeout=30)
        return self.metrics_url

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        pools = {pool: self._pool(pool) for pool in POOLS}
        async with httpx.AsyncClient(trust_env=False) as client:
            scraper = Scraper(client)
            targets: dict[PoolName, PoolTarget] = dict(pools)
            name = self._isvc.metadata.name
            autoscaler = Autoscaler(
                metrics=AutoscalerMetrics(self._registry), report=self._report, interval_s=self._interval
            )
            gateways = [p.url for p in self._plan.processes if p.role == "router"]

            async def queues() -> dict[str, GatewayReading | None]:
                return await scraper.gateways(gateways)

            autoscaler.set_service(
                name,
                controllers_for(
                    name, self._isvc.spec, targets=targets, scrape=scraper.scrape, gateways=queues
                ),
            )
            self._started.set()
            try:
                await autoscaler.run(self._stop)
            finally:
                for pool in pools.values():
                    await pool.close()

    def _pool(self, pool: Literal["prefill", "decode"]) -> LocalPool:
        assert self._plan.new_engine is not None  # autoscaled plans always have one
        mine = [c for c in self._supervisor.children if c.plan.role == pool]
        target = LocalPool(
            pool=pool,
            supervisor=self._supervisor,
            listed=self._listed,
            new_engine=self._plan.new_engine,
            ports=self._ports,
            next_index=len(mine),
            startup_timeout_s=self._startup_timeout(pool),
            on_change=lambda message: self._say(f"autoscaler: {pool}: {message}"),
        )
        target.ready.extend(mine)
        return target

    async def _report(self, service: str, outcomes: Sequence[PoolOutcome]) -> None:
        for outcome in outcomes:
            if outcome.direction is not None:
                self._say(
                    f"autoscaler: {outcome.pool} {outcome.previous} → {outcome.desired} "
                    f"({outcome.decision.reason})"
                )
