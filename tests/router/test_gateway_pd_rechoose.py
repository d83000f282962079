"""A prefilled request's decode endpoint is chosen again when the decode pool changed during its
prefill (an engine joined at a step): it goes to the new engine, not to the busy one chosen at its
arrival; with the pool unchanged it goes where it was first sent.

Real: the router app on a uvicorn server on 127.0.0.1 with file discovery over an endpoint file in a
temporary directory (what `tandem up` writes as the autoscaler starts engines), httpx as the caller,
the router's /metrics. Faked: the engines (`FakeEngine`; the prefill engine answers with NIXL-style
`kv_transfer_params`, which name where any decode engine loads the KV). Waits poll with a generous
bound; no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.router.harness import MODEL, MODEL_NAME, NIXL_PARAMS, Launcher, RunningRouter, metric

from tandem.core.routerconfig import EndpointList, RouterConfig, write_endpoint_file

RECHOSEN = "tandem_router_pd_decode_rechosen_total"


async def until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    for _ in range(1000):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_an_engine_that_joins_the_decode_pool_during_a_prefill_gets_that_request(
    launcher: Launcher, tmp_path: Path
) -> None:
    prefill = await launcher.engine("p0", kv_transfer_params=NIXL_PARAMS)
    busy = await launcher.engine("d0", tokens=40, token_delay=0.1)
    joining = await launcher.engine("d1")
    path = tmp_path / "endpoints.json"
    write_endpoint_file(path, EndpointList(prefill=[prefill.url], decode=[busy.url]))
    config = RouterConfig.model_validate(
        {
            "service": "step",
            "spec": {
                "model": {"name": MODEL_NAME, "servedName": MODEL},
                "disaggregation": {"mode": "always"},
            },
            "discovery": {"kind": "file", "path": str(path), "pollSeconds": 0.02},
        }
    )
    router: RunningRouter = await launcher.router_for(config)

    def decode_endpoints(n: int) -> Callable[[], Awaitable[bool]]:
        async def listed() -> bool:
            return bool((await router.http.get("/health")).json()["pools"]["decode"]["endpoints"] == n)

        return listed

    async def prefills(n: int) -> bool:
        return len(prefill.received) == n

    await until("the first decode engine listed", decode_endpoints(1))
    # A long answer holds d0 (its first bytes read: it is decoding there).
    body = {"model": MODEL, "prompt": "earlier", "max_tokens": 40, "stream": True}
    async with router.http.stream("POST", "/v1/completions", json=body) as earlier:
        assert earlier.headers["x-tandem-decode-endpoint"] == busy.url.removeprefix("http://")
        chunks = earlier.aiter_raw()
        await anext(chunks)
        # The next request arrives while d0 is the only decode engine; its prefill is slow.
        prefill.behaviour.answer_delay = 1.0
        request = asyncio.create_task(
            router.http.post("/v1/completions", json={"model": MODEL, "prompt": "later", "max_tokens": 2})
        )
        await until("the later prefill received", lambda: prefills(2))
        assert await metric(router, RECHOSEN) == 0
        write_endpoint_file(path, EndpointList(prefill=[prefill.url], decode=[busy.url, joining.url]))
        await until("the second decode engine listed", decode_endpoints(2))
        answer = await request
        assert answer.status_code == 200
        assert answer.headers["x-tandem-decode-endpoint"] == joining.url.removeprefix("http://")
        assert [r.body["prompt"] for r in joining.received] == ["later"]
        assert joining.received[0].body["kv_transfer_params"] == NIXL_PARAMS
        assert [r.body["prompt"] for r in busy.received] == ["earlier"]
        assert await metric(router, RECHOSEN) == 1
        # With the pool unchanged since its arrival, a request decodes where it was first sent.
        prefill.behaviour.answer_delay = 0.0
        again = await router.http.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}
        )
        assert again.status_code == 200
        assert await metric(router, RECHOSEN) == 1
