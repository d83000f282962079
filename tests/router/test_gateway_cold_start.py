"""Scale from zero through the whole gateway: requests that arrive while the decode pool has no engine
are held and served once discovery lists one; the hold's bound and deadline answer 429 with
Retry-After; `maxHeldRequests: 0` keeps the 503; a client that leaves while held is withdrawn; a
gateway waiting for its first decode engine is ready (`/health` 200 `cold_start`).

Real: the router app on a uvicorn server on 127.0.0.1 with file discovery over an endpoint file in a
temporary directory (what `tandem up` writes as the autoscaler starts engines), httpx and the
official `openai` client as callers, the router's /metrics. Faked: the engine (`FakeEngine`). Waits
poll /metrics with a generous bound; no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import openai
import pytest
from tests.router.harness import MODEL, MODEL_NAME, Launcher, RunningRouter, metric

from tandem.core.routerconfig import EndpointList, RouterConfig, write_endpoint_file

BODY = {"model": MODEL, "prompt": "x", "max_tokens": 1}


class ColdPool:
    """A router whose decode pool is listed in an endpoint file that starts empty."""

    def __init__(self, path: Path, router: RunningRouter) -> None:
        self.path = path
        self.router = router

    def list_decode(self, *urls: str) -> None:
        write_endpoint_file(self.path, EndpointList(decode=list(urls)))

    async def listed(self, n: int) -> None:
        """Wait until discovery has read `n` decode engines from the file."""
        for _ in range(1000):
            if (await self.router.http.get("/health")).json()["pools"]["decode"]["endpoints"] == n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the router never listed {n} decode engines")

    async def until(self, name: str, value: float, **labels: str) -> None:
        for _ in range(1000):
            if await metric(self.router, name, **labels) == value:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{name}{labels} never reached {value}")


async def cold_router(
    launcher: Launcher, tmp_path: Path, cold_start: Mapping[str, Any] | None = None
) -> ColdPool:
    """A router over a decode pool scaled to zero (autoscaling from min 0, no engine listed yet)."""
    path = tmp_path / "endpoints.json"
    write_endpoint_file(path, EndpointList())
    config = RouterConfig.model_validate(
        {
            "service": "cold",
            "spec": {
                "model": {"name": MODEL_NAME, "servedName": MODEL},
                "decode": {"replicas": 0, "autoscaling": {"enabled": True, "min": 0, "max": 2}},
                "disaggregation": {"mode": "off"},
                "router": {"coldStart": dict(cold_start or {})},
            },
            "discovery": {"kind": "file", "path": str(path), "pollSeconds": 0.02},
        }
    )
    return ColdPool(path, await launcher.router_for(config))


async def test_a_request_held_while_the_pool_is_empty_is_served_once_an_engine_is_listed(
    launcher: Launcher, tmp_path: Path
) -> None:
    pool = await cold_router(launcher, tmp_path)
    held = asyncio.create_task(pool.router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1))
    await pool.until("tandem_router_held_requests", 1)
    engine = await launcher.engine("d0")
    assert engine.received == []
    health = await pool.router.http.get("/health")  # ready: it must stay in its Service to hold requests
    assert (health.status_code, health.json()["status"]) == (200, "cold_start")
    pool.list_decode(engine.url)  # the autoscaler's first decode engine is ready
    answer = await held
    assert answer.choices[0].text == " d0-0"
    assert [r.body["prompt"] for r in engine.received] == ["x"]
    assert await metric(pool.router, "tandem_router_held_requests") == 0
    assert await metric(pool.router, "tandem_router_held_total", outcome="released") == 1
    assert await metric(pool.router, "tandem_router_hold_seconds_count") == 1
    # Released into admission as a new arrival: it went through the gate like any other request.
    assert await metric(pool.router, "tandem_router_queue_wait_seconds_count", outcome="dispatched") == 1
    await pool.listed(1)
    again = await pool.router.http.post("/v1/completions", json=BODY)  # the pool is warm: no hold
    assert again.status_code == 200
    assert await metric(pool.router, "tandem_router_held_total", outcome="released") == 1


async def test_beyond_max_held_requests_the_next_one_gets_429_with_retry_after(
    launcher: Launcher, tmp_path: Path
) -> None:
    pool = await cold_router(launcher, tmp_path, {"maxHeldRequests": 1, "retryAfterSeconds": 7})
    held = asyncio.create_task(pool.router.http.post("/v1/completions", json=BODY))
    await pool.until("tandem_router_held_requests", 1)
    refused = await pool.router.http.post("/v1/completions", json=BODY)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "7"
    error = refused.json()["error"]
    assert error["type"] == "RateLimitError" and error["code"] == "model_cold_start"
    assert "no decode engine is ready yet" in error["message"]
    assert "1 requests already held" in error["message"]
    with pytest.raises(openai.RateLimitError):
        await pool.router.openai.completions.create(model=MODEL, prompt="y", max_tokens=1)
    assert await metric(pool.router, "tandem_router_held_total", outcome="rejected") == 2
    assert await metric(pool.router, "tandem_router_held_requests") == 1
    held.cancel()


async def test_a_request_held_past_hold_seconds_gets_429_with_retry_after(
    launcher: Launcher, tmp_path: Path
) -> None:
    pool = await cold_router(launcher, tmp_path, {"holdSeconds": 0.2, "retryAfterSeconds": 12})
    response = await pool.router.http.post("/v1/completions", json=BODY, headers={"x-request-id": "cold-1"})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "12"
    assert response.headers["x-request-id"] == "cold-1"
    error = response.json()["error"]
    assert error["code"] == "model_cold_start"
    assert error["message"].startswith("held ") and "no engine yet" in error["message"]
    assert await metric(pool.router, "tandem_router_held_total", outcome="expired") == 1
    assert await metric(pool.router, "tandem_router_held_requests") == 0
    assert await metric(pool.router, "tandem_router_requests_total", status="429") == 1


async def test_with_holding_off_an_empty_pool_answers_503_at_once_and_health_is_503(
    launcher: Launcher, tmp_path: Path
) -> None:
    pool = await cold_router(launcher, tmp_path, {"maxHeldRequests": 0})
    response = await pool.router.http.post("/v1/completions", json=BODY)
    assert response.status_code == 503
    health = await pool.router.http.get("/health")  # nothing is held: not ready, as before
    assert (health.status_code, health.json()["reason"]) == (503, "no decode endpoint known")
    for outcome in ("released", "expired", "rejected", "cancelled"):
        assert await metric(pool.router, "tandem_router_held_total", outcome=outcome) == 0


async def test_a_client_that_leaves_while_held_is_withdrawn_and_the_gauge_returns_to_zero(
    launcher: Launcher, tmp_path: Path
) -> None:
    pool = await cold_router(launcher, tmp_path)
    held = asyncio.create_task(pool.router.http.post("/v1/completions", json=BODY))
    await pool.until("tandem_router_held_requests", 1)
    held.cancel()  # the client hangs up while its request is held
    await pool.until("tandem_router_held_total", 1, outcome="cancelled")
    assert await metric(pool.router, "tandem_router_held_requests") == 0
    engine = await launcher.engine("d0")
    pool.list_decode(engine.url)
    await pool.listed(1)
    ok = await pool.router.http.post("/v1/completions", json=BODY)  # served at once, nothing left held
    assert ok.status_code == 200
    assert len(engine.received) == 1  # the withdrawn request never reached the engine
    assert await metric(pool.router, "tandem_router_held_total", outcome="released") == 0
    assert await metric(pool.router, "tandem_router_requests_total", status="499") == 1
