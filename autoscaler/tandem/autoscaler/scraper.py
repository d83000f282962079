"""Scraping engines' and gateways' `/metrics` over HTTP (the collector's I/O half).

Each engine (and each gateway replica) gets one GET per round; an answer that is not a 200 with
metrics text, a timeout or a connection error is a failed scrape (None), which makes the pool's
observation invalid: the decider then holds instead of guessing.

An engine's pod runs the tenant's image, so its `/metrics` is not trusted to be well behaved. Each
scrape has a **total deadline** (`deadline_s`: connect, headers and the whole body; a page that drips
a byte a second never ends otherwise, since each byte restarts a read timeout) and a **size cap**
(`max_bytes`: a declared `Content-Length` above it is refused before the body, and a body is read in
chunks and dropped as soon as it passes the cap, so an endless or 100 MB answer costs at most the cap
plus one chunk of memory; a compressed page is refused, as it could inflate past the cap). Any of
these makes the scrape fail (None, logged with the reason).
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

#: Seconds a whole scrape may take, and the largest page read (bytes): vLLM's page is tens of KiB.
SCRAPE_DEADLINE_S = 0.8
MAX_PAGE_BYTES = 8 * 1024 * 1024


class PageRefused(Exception):
    """A `/metrics` answer over the size cap, or compressed (asked not to be: a small compressed
    body can inflate far past the cap)."""


class Scraper:
    """Scrapes many engines at once with one shared client (the caller owns and closes it)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        deadline_s: float = SCRAPE_DEADLINE_S,
        max_bytes: int = MAX_PAGE_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._deadline = deadline_s
        self._max_bytes = max_bytes
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
            async with asyncio.timeout(self._deadline):
                page = await self._page(f"{url.rstrip('/')}/metrics")
        except TimeoutError:
            log.warning(f"{what} scrape failed", extra={"endpoint": url, "error": "deadline passed"})
            return None
        except (httpx.HTTPError, PageRefused) as exc:
            log.warning(f"{what} scrape failed", extra={"endpoint": url, "error": repr(exc)})
            return None
        return page.decode("utf-8", errors="replace")

    async def _page(self, url: str) -> bytes:
        """The body of a 200 answer, at most `max_bytes` of it (module docstring)."""
        headers = {"accept-encoding": "identity"}
        async with self._client.stream("GET", url, headers=headers, timeout=self._deadline) as response:
            response.raise_for_status()
            encoding = response.headers.get("content-encoding", "identity").lower()
            if encoding != "identity":
                raise PageRefused(f"a {encoding} page, asked for identity")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max_bytes:
                raise PageRefused(f"{declared} bytes declared, the cap is {self._max_bytes}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self._max_bytes:
                    raise PageRefused(f"over {self._max_bytes} bytes")
            return bytes(body)
