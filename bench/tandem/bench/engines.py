"""Scraping every engine's `/metrics` before and after a run (vLLM's names; the simulator serves them).

The parsing, the deltas and the hit-rate definitions are in `tandem.bench.counters` (pure); this
module only fetches. A failed scrape is reported as that engine's error, never fails the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx

from tandem.bench.counters import EngineCounters, MetricsError, parse_counters


def metrics_url(url: str) -> str:
    """An engine base URL (`http://h:p`, `http://h:p/v1`) or a full `/metrics` URL → the metrics URL."""
    base = url.rstrip("/")
    if base.endswith("/metrics"):
        return base
    return base.removesuffix("/v1") + "/metrics"


async def scrape(client: httpx.AsyncClient, url: str, *, timeout_s: float = 10.0) -> EngineCounters:
    """GET one engine's metrics and parse them; raises MetricsError on any failure."""
    try:
        response = await client.get(metrics_url(url), timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise MetricsError(f"{metrics_url(url)}: {type(exc).__name__}: {exc}") from None
    return parse_counters(response.text)


async def scrape_all(client: httpx.AsyncClient, urls: Sequence[str]) -> dict[str, EngineCounters | str]:
    """Scrape every engine concurrently: url → counters, or the error message when it failed."""

    async def one(url: str) -> EngineCounters | str:
        try:
            return await scrape(client, url)
        except MetricsError as exc:
            return str(exc)

    results = await asyncio.gather(*(one(u) for u in urls))
    return dict(zip(urls, results, strict=True))
