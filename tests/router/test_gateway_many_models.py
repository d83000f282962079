"""One gateway in front of two services, routed by the body's `model`, with an alias split between them.

Real: the gateway (`create_many_app` over a `GatewayFile`), uvicorn servers on 127.0.0.1, the official
`openai` client and httpx as callers, /metrics as Prometheus text. Faked: the engines
(`fake_engine.FakeEngine`), one decode pool per service.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from tests.router.fake_engine import FakeEngine
from tests.router.harness import Launcher, RunningRouter, metric

from tandem.core.gateway import GatewayFile
from tandem.core.routerconfig import EndpointList, write_endpoint_file
from tandem.router.compose.many import create_many_app
from tandem.router.settings import RouterSettings

QWEN, LLAMA = "qwen", "llama"


def gateway_file(
    services: Mapping[str, tuple[str, Sequence[str]]],
    *,
    aliases: Mapping[str, Sequence[tuple[str, int]]] | None = None,
    args: Mapping[str, Sequence[str]] | None = None,
) -> GatewayFile:
    """`services`: name → (served name, decode URLs); `aliases`: alias → (service, weight)."""
    return GatewayFile.model_validate(gateway_document(services, aliases=aliases, args=args))


def gateway_document(
    services: Mapping[str, tuple[str, Sequence[str]]],
    *,
    aliases: Mapping[str, Sequence[tuple[str, int]]] | None = None,
    args: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """`gateway_file`'s document, not validated."""
    return {
        "kind": "gateway",
        "gateway": "fleet",
        "spec": {
            "aliases": [
                {"name": a, "targets": [{"service": s, "weight": w} for s, w in targets]}
                for a, targets in (aliases or {}).items()
            ]
        },
        "services": [
            {
                "name": name,
                "config": {
                    "service": name,
                    "spec": {
                        "model": {"name": f"org/{served}", "servedName": served},
                        "engine": {"kind": "sim", "args": list((args or {}).get(name, ()))},
                        "prefill": {"replicas": 0},
                        "decode": {"replicas": len(urls)},
                        "disaggregation": {"mode": "off"},
                    },
                    "discovery": {"kind": "static", "decode": list(urls)},
                },
            }
            for name, (served, urls) in services.items()
        ],
    }


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def serve(launcher: Launcher, stack: AsyncExitStack, file: GatewayFile) -> RunningRouter:
    access = RouterSettings().access.model_copy(update={"topology_headers": True})
    app = create_many_app(file, settings=RouterSettings().model_copy(update={"access": access}))
    url = await launcher.serve_app(app)
    http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, trust_env=False, timeout=20))
    client = httpx2.AsyncClient(trust_env=False, timeout=20)
    openai = await stack.enter_async_context(
        AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=20, http_client=client)
    )
    return RunningRouter(url=url, openai=openai, http=http)


async def two_services(
    launcher: Launcher, stack: AsyncExitStack, **options: Any
) -> tuple[RunningRouter, FakeEngine, FakeEngine]:
    a, b = await launcher.engine("a0"), await launcher.engine("b0")
    file = gateway_file({"alpha": (QWEN, [a.url]), "beta": (LLAMA, [b.url])}, **options)
    return await serve(launcher, stack, file), a, b


async def test_each_model_is_served_by_its_own_engines(launcher: Launcher, stack: AsyncExitStack) -> None:
    router, a, b = await two_services(launcher, stack)
    qwen = await router.openai.completions.create(model=QWEN, prompt="Once", max_tokens=2)
    llama = await router.openai.chat.completions.create(
        model=LLAMA, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert qwen.choices[0].text == " a0-0 a0-1" and qwen.model == QWEN
    assert llama.choices[0].message.content == " b0-0 b0-1" and llama.model == LLAMA
    assert [r.body["model"] for r in a.received] == [QWEN]
    assert [r.body["model"] for r in b.received] == [LLAMA]


async def test_models_lists_every_served_name_and_alias(launcher: Launcher, stack: AsyncExitStack) -> None:
    router, _, _ = await two_services(launcher, stack, aliases={"chat": [("alpha", 1)]})
    listed = await router.openai.models.list()
    ids = [m.id for m in listed.data]
    assert sorted(ids) == ["chat", LLAMA, QWEN]
    by_id = {m.id: m.model_dump() for m in listed.data}
    assert by_id[QWEN]["max_model_len"] == 4096  # the engine's own entry
    assert by_id["chat"]["max_model_len"] == 4096  # its target's


async def test_an_unknown_model_is_a_404_in_vllms_words_and_never_a_label_value(
    launcher: Launcher, stack: AsyncExitStack
) -> None:
    router, a, b = await two_services(launcher, stack)
    answer = await router.http.post("/v1/completions", json={"model": "nope-7b", "prompt": "x"})
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["message"] == "The model `nope-7b` does not exist." and error["param"] == "model"
    assert not a.received and not b.received
    assert await metric(router, "tandem_router_unknown_model_total") == 1
    text = (await router.http.get("/metrics")).text
    assert "nope-7b" not in text
    models = {s.labels.get("model") for f in text_string_to_metric_families(text) for s in f.samples}
    assert models == {None, QWEN, LLAMA}


async def test_an_alias_split_90_10_is_exact_and_answers_name_the_alias(
    launcher: Launcher, stack: AsyncExitStack
) -> None:
    router, a, b = await two_services(launcher, stack, aliases={"chat": [("alpha", 90), ("beta", 10)]})
    answers = []
    for _ in range(10):  # ten at a time: the picks are made one by one whatever the concurrency
        answers += await asyncio.gather(
            *(router.openai.completions.create(model="chat", prompt="x", max_tokens=1) for _ in range(10))
        )
    assert (len(a.received), len(b.received)) == (90, 10)
    assert {r.body["model"] for r in a.received} == {QWEN} and {r.body["model"] for r in b.received} == {
        LLAMA
    }
    assert {answer.model for answer in answers} == {"chat"}
    assert await metric(router, "tandem_router_alias_requests_total", alias="chat", target="alpha") == 90
    assert await metric(router, "tandem_router_alias_requests_total", alias="chat", target="beta") == 10


async def test_an_aliased_stream_names_the_alias_in_every_chunk(
    launcher: Launcher, stack: AsyncExitStack
) -> None:
    router, a, _ = await two_services(launcher, stack, aliases={"chat": [("alpha", 1)]})
    body = {
        "model": "chat",
        "prompt": "x",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with router.http.stream("POST", "/v1/completions", json=body) as response:
        raw = b"".join([chunk async for chunk in response.aiter_raw()])
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: {")]
    assert len(events) == 6  # four tokens, the end, the usage
    assert {json.loads(e)["model"] for e in events} == {"chat"}
    assert b'"model": "qwen"' not in raw
    assert a.received[0].body["model"] == QWEN
    stream = await router.openai.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True
    )
    assert {chunk.model async for chunk in stream} == {"chat"}


async def test_each_model_queues_apart(launcher: Launcher, stack: AsyncExitStack) -> None:
    """Model A's engine takes one request at a time and answers slowly; a flood of A waits in A's
    queue, and B's request is answered meanwhile."""
    a = await launcher.engine("a0", answer_delay=1.0)
    b = await launcher.engine("b0")
    file = gateway_file(
        {"alpha": (QWEN, [a.url]), "beta": (LLAMA, [b.url])}, args={"alpha": ["--max-num-seqs", "1"]}
    )
    router = await serve(launcher, stack, file)
    flood = [
        asyncio.create_task(router.openai.completions.create(model=QWEN, prompt="x", max_tokens=1))
        for _ in range(3)
    ]
    await a.arrived.wait()
    for _ in range(500):  # the other two reach A's queue
        if await metric(router, "tandem_router_queue_depth", model=QWEN) == 2:
            break
        await asyncio.sleep(0.01)
    answer = await router.openai.completions.create(model=LLAMA, prompt="x", max_tokens=1)
    assert answer.choices[0].text == " b0-0"
    assert len(a.received) == 1  # A's other two still wait in A's queue
    assert await metric(router, "tandem_router_queue_depth", model=LLAMA) == 0
    await asyncio.gather(*flood)


async def test_metrics_carry_the_model_label(launcher: Launcher, stack: AsyncExitStack) -> None:
    router, _, _ = await two_services(launcher, stack)
    await router.openai.completions.create(model=QWEN, prompt="x", max_tokens=1)
    await router.openai.completions.create(model=QWEN, prompt="x", max_tokens=1)
    await router.openai.completions.create(model=LLAMA, prompt="x", max_tokens=1)
    requests = "tandem_router_requests_total"
    assert await metric(router, requests, model=QWEN, status="200") == 2
    assert await metric(router, requests, model=LLAMA, status="200") == 1
    text = (await router.http.get("/metrics")).text
    endpoints = {
        (s.labels["model"], s.labels["endpoint"])
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "tandem_router_endpoint_up"
    }
    assert {m for m, _ in endpoints} == {QWEN, LLAMA}
    assert (
        len([line for line in text.splitlines() if line.startswith("# TYPE tandem_router_requests_total")])
        <= 1
    )


async def test_a_model_at_zero_is_held_until_its_first_engine_while_others_serve(
    launcher: Launcher, stack: AsyncExitStack, tmp_path: Path
) -> None:
    a, b = await launcher.engine("a0"), await launcher.engine("b0")
    endpoints = tmp_path / "beta.json"
    write_endpoint_file(endpoints, EndpointList())
    document = gateway_document({"alpha": (QWEN, [a.url]), "beta": (LLAMA, [b.url])})
    document["services"][1]["config"]["discovery"] = {
        "kind": "file",
        "path": str(endpoints),
        "pollSeconds": 0.05,
    }
    router = await serve(launcher, stack, GatewayFile.model_validate(document))
    held = asyncio.create_task(router.openai.completions.create(model=LLAMA, prompt="x", max_tokens=1))
    for _ in range(500):
        if await metric(router, "tandem_router_held_requests", model=LLAMA) == 1:
            break
        await asyncio.sleep(0.01)
    assert not held.done()
    served = await router.openai.completions.create(model=QWEN, prompt="x", max_tokens=1)
    assert served.choices[0].text == " a0-0"
    write_endpoint_file(endpoints, EndpointList(decode=[b.url]))
    answer = await held
    assert answer.choices[0].text == " b0-0" and answer.model == LLAMA
