"""Tandem's gateway replicas around a run: their own `/metrics` counters, scraped just before and just
after it (parsing and deltas pure; `scrape_gateways` fetches).

Counters read (every series of a name is summed, so a gateway with `--workers` counts once; the
gateway counts its side routes too, `/metrics` among them, so only `/v1/` routes are requests):

| field | metric (`tandem_router_...`) | meaning |
| --- | --- | --- |
| `requests` | `requests_total` (`/v1/` routes, any status) | generation requests it answered |
| `counter_syncs_ok` | `shared_counter_syncs_total{outcome="ok"}` | syncs of the shared VTC counters |
| `counter_syncs_error` | `shared_counter_syncs_total{outcome="error"}` | failed syncs |

(The shared counters are the fair queue's, kept in the KV pool's Redis: `tandem.router.workers.counters`.)

Over a run each is the after − before delta: with `--gateway-replicas 2`, requests 30 and 30 say the
driver's spreading reached both replicas, and syncs ok above 0 on both that they shared their VTC
counters while it ran (about 10 per second each at the gateway's default 100 ms interval; 0 with one
replica, which has nothing to share). A scrape that fails is that replica's `error`, never the run's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tandem.bench.counters import MetricsError

REQUESTS = "tandem_router_requests_total"
SYNCS = "tandem_router_shared_counter_syncs_total"


@dataclass(frozen=True)
class GatewayCounters:
    """One replica's counters at one moment, or a delta between two (the module table)."""

    requests: float = 0.0
    counter_syncs_ok: float = 0.0
    counter_syncs_error: float = 0.0

    def __sub__(self, earlier: GatewayCounters) -> GatewayCounters:
        return GatewayCounters(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)}
        )


def parse_gateway_counters(text: str) -> GatewayCounters:
    """The module table's counters out of a gateway's Prometheus text; absent metrics count 0.
    Raises MetricsError for text that is not Prometheus exposition."""
    totals = {"requests": 0.0, "counter_syncs_ok": 0.0, "counter_syncs_error": 0.0}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == REQUESTS and sample.labels.get("route", "").startswith("/v1/"):
                    totals["requests"] += float(sample.value)
                elif sample.name == SYNCS and sample.labels.get("outcome") in ("ok", "error"):
                    totals[f"counter_syncs_{sample.labels['outcome']}"] += float(sample.value)
    except ValueError as exc:  # the parser's error for malformed exposition text
        raise MetricsError(f"invalid Prometheus text: {exc}") from None
    return GatewayCounters(**totals)


def replica_report(
    urls: Sequence[str],
    before: Mapping[str, GatewayCounters | str],
    after: Mapping[str, GatewayCounters | str],
) -> list[dict[str, Any]]:
    """One entry per replica, in `urls` order: its URL and counter deltas, or its scrape `error`.

    Example: requests 2 before and 32 after, syncs ok 3 and 103 → requests 30, counter_syncs_ok 100.
    """
    report: list[dict[str, Any]] = []
    for url in urls:
        first, last = before.get(url, "not scraped before the run"), after.get(url, "not scraped after")
        if isinstance(first, str) or isinstance(last, str):
            report.append({"url": url, "error": first if isinstance(first, str) else last})
        else:
            report.append({"url": url, **asdict(last - first)})
    return report


async def scrape_gateways(
    client: httpx.AsyncClient, urls: Sequence[str], *, timeout_s: float = 10.0
) -> dict[str, GatewayCounters | str]:
    """GET every replica's `/metrics` (`urls` are base URLs, `/v1` or not) concurrently: url → its
    counters, or the error message when the scrape failed."""

    async def one(url: str) -> GatewayCounters | str:
        metrics = url.rstrip("/").removesuffix("/v1") + "/metrics"
        try:
            response = await client.get(metrics, timeout=timeout_s)
            response.raise_for_status()
            return parse_gateway_counters(response.text)
        except httpx.HTTPError as exc:
            return f"{metrics}: {type(exc).__name__}: {exc}"
        except MetricsError as exc:
            return f"{metrics}: {exc}"

    results = await asyncio.gather(*(one(u) for u in urls))
    return dict(zip(urls, results, strict=True))
