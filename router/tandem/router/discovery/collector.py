"""The endpoint metrics collector: one background task per router that reads every engine's `/metrics`.

Every `interval_seconds` (default 1 s) it GETs `<engine>/metrics` from each engine URL of both pools
at once, with a `timeout_seconds` limit each (default 1 s), parses the vLLM gauges
(`tandem.router.discovery.enginestats`) and hands the result to the registry, which serves it in snapshots
next to the router's own in-flight counts. Outcomes (`tandem_router_engine_scrapes_total{outcome}`):

| outcome | what happened | effect |
|---|---|---|
| `ok` | engine metrics parsed | fresh stats; an unreachable engine returns to rotation |
| `unusable` | an answer, but not engine metrics (404, other text) | stats age; stale after N misses |
| `slow` | no answer within the timeout | as `unusable`: a busy engine still serves |
| `unreachable` | connect error, broken answer, 5xx | as `unusable`; out of rotation after N in a row |

The first round runs before `start` returns, so a gateway knows its engines' state (what they run,
whether they are new: `tandem.router.scheduling.state`) before its first request: a gateway that
restarts in front of warm engines routes at full quality at once. The engines whose numbers are
wanted sooner (`urgent()`: their capacity is being learned, `EngineCapacity.learning`) are read again
every `learning_interval_seconds` (default 0.25 s) between the rounds, only they.

A timeout does not take an engine out of rotation: on a loaded host an engine can be slow to answer
`/metrics` while it serves requests well, and the request path's own failure tracking removes an
engine whose requests fail.

How a page is fetched is injected (`Fetch`): the gateway reads them over its own upstream wire
(`tandem.router.upstream.client.metrics_fetch`: a keep-alive connection per engine, a few tens of
µs per scrape, where an `httpx` GET cost about 1.4 ms of the gateway's CPU on a 2-core machine, 8%
of a round-robin gateway's CPU at 16 requests/s with 4 engines); `httpx_fetch` adapts an
`httpx.AsyncClient`. A round's failures never end the task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Literal

import httpx

from tandem.core.tasks import stop_task
from tandem.router.discovery.enginestats import NotEngineMetrics, parse_engine_metrics
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.settings import CollectorSettings

log = logging.getLogger("tandem.router.discovery.collector")

ScrapeOutcome = Literal["ok", "unusable", "slow", "unreachable"]

#: GET `<url>/metrics` with a time limit → (status, body text). Raises `TimeoutError` when the
#: engine is slow and `ScrapeError` when it cannot be reached or its answer not read.
Fetch = Callable[[str, float], Awaitable[tuple[int, str]]]


class ScrapeError(Exception):
    """The engine could not be reached, or its answer could not be read."""


def httpx_fetch(client: httpx.AsyncClient) -> Fetch:
    """A `Fetch` over an `httpx.AsyncClient`."""

    async def fetch(url: str, timeout_s: float) -> tuple[int, str]:
        try:
            response = await client.get(f"{url}/metrics", timeout=timeout_s)
        except httpx.TimeoutException as exc:
            raise TimeoutError(str(exc)) from exc
        except httpx.HTTPError as exc:
            raise ScrapeError(repr(exc)) from exc
        return response.status_code, response.text

    return fetch


class MetricsCollector:
    """Scrapes engines into `registry` (module docstring). `on_scrape(url, outcome)` is told about
    every scrape (metrics); `on_members(urls)` is awaited with the engine URLs at the start of every
    round (so per-engine state elsewhere follows discovery). `sleep` is injectable for tests."""

    def __init__(
        self,
        *,
        registry: EndpointRegistry,
        fetch: Fetch,
        settings: CollectorSettings,
        on_scrape: Callable[[str, ScrapeOutcome], None] | None = None,
        on_members: Callable[[Collection[str]], Awaitable[None]] | None = None,
        urgent: Callable[[], Collection[str]] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._registry = registry
        self._fetch = fetch
        self._settings = settings
        self._on_scrape = on_scrape
        self.on_members = on_members
        self.urgent = urgent
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Run the first round, then start the background task for the next ones; idempotent."""
        if self._task is None and self._settings.enabled:
            await self._round()
            self._task = asyncio.create_task(self._run(), name="tandem-metrics-collector")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)

    async def scrape_all(self) -> dict[str, ScrapeOutcome]:
        """One round: every engine URL scraped concurrently; returns each one's outcome."""
        urls = self._registry.urls()
        if self.on_members is not None:
            try:
                await self.on_members(urls)
            except Exception:  # e.g. a KV-event subscriber that cannot start: scraping goes on
                log.exception("following the engines failed")
        outcomes = await asyncio.gather(*(self.scrape(url) for url in urls))
        return dict(zip(urls, outcomes, strict=True))

    async def scrape(self, url: str) -> ScrapeOutcome:
        """Scrape one engine and record the result in the registry."""
        outcome: ScrapeOutcome
        try:
            outcome = await self._read(url)
        except TimeoutError as exc:
            log.debug("metrics scrape timed out", extra={"endpoint": url, "error": repr(exc)})
            outcome = "slow"
        except ScrapeError as exc:
            log.debug("metrics scrape failed", extra={"endpoint": url, "error": str(exc)})
            outcome = "unreachable"
        if outcome != "ok":
            self._registry.record_scrape_miss(url, unreachable=outcome == "unreachable")
        if self._on_scrape is not None:
            self._on_scrape(url, outcome)
        return outcome

    async def _read(self, url: str) -> ScrapeOutcome:
        timeout = self._settings.timeout_seconds
        async with asyncio.timeout(timeout):
            status, text = await self._fetch(url, timeout)
        if status >= 500:
            return "unreachable"
        if status != 200:
            return "unusable"
        try:
            stats = parse_engine_metrics(text)
        except NotEngineMetrics as exc:
            log.debug("not engine metrics", extra={"endpoint": url, "error": str(exc)})
            return "unusable"
        self._registry.record_scrape(url, stats)
        return "ok"

    async def _round(self) -> None:
        try:
            await self.scrape_all()
        except Exception:  # a bug in one round must not end scraping for the router's lifetime
            log.exception("metrics collector round failed")

    def _urgent(self) -> list[str]:
        if self.urgent is None:
            return []
        try:
            members = set(self._registry.urls())
            return [url for url in self.urgent() if url in members]
        except Exception:
            log.exception("deciding the next scrape's time failed")
            return []

    async def _run(self) -> None:
        """A round over every engine every `interval_seconds`; in between, the engines `urgent()`
        names are read again every `learning_interval_seconds` (urgency is looked at that often).
        Time is counted as the sleeps asked for plus the scrapes' own time (an injected `sleep` need
        not pass time)."""
        loop = asyncio.get_running_loop()
        settings = self._settings
        tick = min(settings.learning_interval_seconds, settings.interval_seconds)
        since_round = since_urgent = 0.0  # seconds since the last round / the last urgent scrapes
        while True:
            if since_round >= settings.interval_seconds:
                started = loop.time()
                await self._round()
                since_round = since_urgent = loop.time() - started
                continue
            urgent = self._urgent() if tick < settings.interval_seconds else []
            if urgent and since_urgent >= tick:
                started = loop.time()
                await asyncio.gather(*(self.scrape(url) for url in urgent))
                took = loop.time() - started
                since_round, since_urgent = since_round + took, took
                continue
            pause = min(tick, settings.interval_seconds - since_round)
            if urgent:
                pause = min(pause, max(0.0, tick - since_urgent))
            await self._sleep(pause)
            since_round += pause
            since_urgent += pause
