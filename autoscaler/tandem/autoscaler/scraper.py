"""Scraping engines' and gateways' `/metrics` over HTTP (the collector's I/O half).

Each engine (and each gateway replica) gets one GET per round with a short timeout; an answer that is
not a 200 with metrics text, a timeout or a connection error is a failed scrape (None), which makes the
pool's observation invalid: the decider then holds instead of guessing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import httpx

from tandem.autoscaler.readings import EngineReading, GatewayReading, parse_engine_metrics, parse_gateway

log = logging.getLogger(__name__)


class Scraper:
    """Scrapes many engines at once with one shared client (the caller owns and closes it)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        timeout_s: float = 0.8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._timeout = timeout_s
        #: Stamps each reading with when its answer arrived (`EngineReading.at`).
        self._clock = clock

    async def scrape(self, urls: Sequence[str]) -> dict[str, EngineReading | None]:
        """Engine URL → its reading, or None when the scrape failed."""
        results = await asyncio.gather(*(self.one(url) for url in urls))
        return dict(zip(urls, results, strict=True))

    async def one(self, url: str) -> EngineReading | None:
        text = await self._text(url, what="engine")
        arrived = self._clock()
        try:
            return replace(parse_engine_metrics(text), at=arrived) if text is not None else None
        except ValueError as exc:
            log.warning("engine metrics unreadable", extra={"endpoint": url, "error": repr(exc)})
            return None

    async def gateways(self, urls: Sequence[str]) -> dict[str, GatewayReading | None]:
        """Gateway URL → its demand signals (queue, held requests, arrivals, observed prefill throughputs), or
        None when the scrape failed."""
        results = await asyncio.gather(*(self.gateway(url) for url in urls))
        return dict(zip(urls, results, strict=True))

    async def gateway(self, url: str) -> GatewayReading | None:
        text = await self._text(url, what="gateway")
        arrived = self._clock()
        try:
            return replace(parse_gateway(text), at=arrived) if text is not None else None
        except ValueError as exc:
            log.warning("gateway metrics unreadable", extra={"endpoint": url, "error": repr(exc)})
            return None

    async def _text(self, url: str, *, what: str) -> str | None:
        try:
            response = await self._client.get(f"{url.rstrip('/')}/metrics", timeout=self._timeout)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning(f"{what} scrape failed", extra={"endpoint": url, "error": repr(exc)})
            return None
        return response.text
