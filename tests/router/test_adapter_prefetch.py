"""P/D under a LoRA adapter: the decode engine reads the adapter while the prefill runs
(`tandem.router.pd.prefetch`).

Real: the router (`create_app`) on 127.0.0.1 with a copier (`adapterLoadDir`), redis-server (the
`redis_server` fixture) as the KV pool, httpx; /metrics as Prometheus text. Faked: the engines are
`FakeEngine`s (they record what they get and write nothing; the decode engine answers vLLM's
`POST /v1/load_lora_adapter` from the test), so the test stores the chunks the prefill would write and
every barrier passes at its first check. Nothing is timed: the load starts its answer once the prefill
has arrived, ends it 0.2 s after the prefill's answer, and the test reads who had received what then.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.responses import Response
from tests.router.harness import MODEL, Launcher, metric
from tests.router.test_lora_pool import (
    ISOLATED,
    SECRET,
    complete,
    fake_vllm_pd,
    lora_router_config,
    store_chunks,
)
from tests.servers import RedisServer

from tandem.kvpool.engine_keys import KeysUnavailable
from tandem.router.compose.service import decode_loads
from tandem.router.config import pool_keys, resolve
from tandem.router.scheduling.adapterload import AdapterLoads
from tandem.router.settings import RouterSettings
from tandem.router.upstream.adaptercopy import AdapterCopier
from tandem.router.upstream.client import HTTPUpstream, new_wire

PREFETCHES = "tandem_router_adapter_prefetches_total"


@pytest.fixture(autouse=True)
def keyed_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_KV_POOL_KEY", SECRET)


async def test_the_decode_engine_reads_the_adapter_while_the_prefill_runs(
    launcher: Launcher, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A disaggregated request under `sql`, held by no engine: the decode engine gets the in-place load
    of `sql` while the prefill is still being answered, and the decode request only after that load
    has ended (here after the prefill's answer). A second `sql` request and a base-model one read
    nothing; a load that fails (`chat`) leaves the request to load its adapter itself, and the
    request still succeeds."""
    prefill = await launcher.engine("p0", answer_delay=0.5)
    decode = await launcher.engine("d0")
    seen: list[tuple[dict[str, Any], bool, int]] = []  # (body, prefill still answering, decodes so far)

    async def load_lora_adapter(request: Request) -> Response:
        body = await request.json()
        await asyncio.wait_for(prefill.arrived.wait(), timeout=10)
        during = prefill.open_requests > 0
        for _ in range(1000):  # this load ends after the prefill's answer: decode must wait for it
            if not prefill.open_requests:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        seen.append((body, during, len(decode.received)))
        if body["lora_name"] == "chat":
            message = "Call to add_lora method failed: no such adapter"
            return JSONResponse({"error": {"message": message, "code": 500}}, status_code=500)
        return Response(f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    decode.app.post("/v1/load_lora_adapter")(load_lora_adapter)
    # A CPU tier with room beyond the GPU slots (the read evicts no adapter of the running batch), too
    # little to load both declared adapters ahead (`AdapterWarmer` plans nothing).
    lora = {"maxLoras": 2, "maxCpuLoras": 3}
    config = fake_vllm_pd(
        tmp_path, prefill.url, decode.url, redis_server.url, lora=lora, connector="tandem"
    ).model_copy(update={"adapter_load_dir": "/adapters"})
    keys = pool_keys(config, environ={"TANDEM_KV_POOL_KEY": SECRET})
    assert not isinstance(keys, KeysUnavailable)
    store_chunks(redis_server, keys, (None, "sql", "chat"))
    router = await launcher.router_for(config, settings=ISOLATED)

    answer = await complete(router, "sql")
    assert answer.headers["x-tandem-prefill-endpoint"] == prefill.url.removeprefix("http://")
    assert seen == [({"lora_name": "sql", "lora_path": "/adapters/sql", "load_inplace": True}, True, 0)], (
        "one load of sql on the decode engine, during the prefill, and the decode request after it"
    )
    assert [r.body["model"] for r in decode.received] == ["sql"]
    assert await metric(router, PREFETCHES, outcome="loaded") == 1

    await complete(router, "sql")
    await complete(router, MODEL)
    assert len(seen) == 1, "the decode engine holds sql now; the base model needs no adapter"
    assert [r.body["model"] for r in prefill.received] == ["sql", "sql", MODEL], "all three disaggregated"

    await complete(router, "chat")
    assert [body["lora_name"] for body, _, _ in seen] == ["sql", "chat"]
    assert await metric(router, PREFETCHES, outcome="failed") == 1
    assert [r.body["model"] for r in decode.received][-1] == "chat", "the request went on without it"


@pytest.mark.parametrize(
    ("lora", "load_dir", "on"),
    [
        pytest.param({"maxLoras": 2, "maxCpuLoras": 3}, "/adapters", True, id="room-in-the-cpu-tier"),
        pytest.param({"maxLoras": 2}, "/adapters", False, id="vllm-default-tier"),
        pytest.param({"maxLoras": 2, "maxCpuLoras": 2}, "/adapters", False, id="cpu-tier-equals-slots"),
        pytest.param({"maxLoras": 2, "maxCpuLoras": 3}, None, False, id="no-runtime-loads"),
    ],
)
def test_the_decode_side_read_is_on_only_with_a_copier_and_room_in_the_cpu_tier(
    lora: dict[str, int], load_dir: str | None, on: bool
) -> None:
    """At vLLM's default tier (`maxCpuLoras` = `maxLoras`) the CPU tier holds only the running batch's
    adapters: a read the engine's scheduler did not ask for would evict one of them."""
    config = lora_router_config(
        decode=["http://127.0.0.1:1"], prefill=["http://127.0.0.1:2"], mode="always",
        spec={"engine": {"kind": "sim", "lora": lora}},
    ).model_copy(update={"adapter_load_dir": load_dir})  # fmt: skip
    effective = resolve(config, RouterSettings())
    proxy = RouterSettings().proxy
    copier = AdapterCopier(HTTPUpstream(new_wire(proxy), proxy), directory="/adapters", timeout_s=1.0)
    loads = AdapterLoads()
    made = decode_loads(effective, loads, copier if load_dir is not None else None)
    assert (made is not None) is on
