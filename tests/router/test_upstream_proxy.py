"""The upstream layer and the dispatcher over `httpx.MockTransport`: error translation, what is
sent, heads and streams, and the retry budget.

Real: `Upstream`, `Dispatcher`, `EndpointRegistry`, `RoundRobin`, `RouterMetrics`. Faked: the network
(every engine is a handler function behind `httpx.MockTransport`).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.errors import (
    NoEndpointAvailable,
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.scheduling import RoundRobin
from tandem.router.settings import ProxySettings
from tandem.router.types import Endpoint, RequestView, Route
from tandem.router.upstream.client import Upstream, UpstreamCall
from tandem.router.upstream.dispatch import Dispatcher

ENGINE = Endpoint("decode", "http://10.0.0.1:8000")
Handler = Callable[[httpx.Request], httpx.Response]


def call(*, stream: bool = False) -> UpstreamCall:
    return UpstreamCall(
        path="/v1/completions",
        body={"model": "qwen", "prompt": "é", "stream": stream},
        headers={"x-request-id": "r1"},
        stream=stream,
    )


def upstream(handler: Handler) -> tuple[Upstream, httpx.AsyncClient]:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return Upstream(client, ProxySettings()), client


def raising(exc: Exception) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


@pytest.mark.parametrize(
    ("exc", "error", "kind"),
    [
        pytest.param(httpx.ConnectError("refused"), UpstreamConnectError, "connect", id="connect"),
        pytest.param(httpx.ConnectTimeout("slow"), UpstreamTimeout, "timeout", id="connect-timeout"),
        pytest.param(httpx.ReadTimeout("silent"), UpstreamTimeout, "timeout", id="read-timeout"),
        pytest.param(httpx.RemoteProtocolError("cut"), UpstreamBroken, "read", id="broken"),
    ],
)
async def test_transport_failures_become_upstream_errors_naming_the_endpoint(
    exc: Exception, error: type[UpstreamError], kind: str
) -> None:
    proxy, client = upstream(raising(exc))
    async with client:
        with pytest.raises(error, match=re.escape("10.0.0.1:8000")) as caught:
            await proxy.open(ENGINE, call())
    assert caught.value.kind == kind


async def test_the_body_is_sent_as_compact_json_with_the_request_id() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    proxy, client = upstream(handler)
    async with client:
        reply = await proxy.open(ENGINE, call())
    [request] = seen
    assert str(request.url) == "http://10.0.0.1:8000/v1/completions"
    assert request.content == '{"model":"qwen","prompt":"é","stream":false}'.encode()
    assert request.headers["x-request-id"] == "r1"
    assert request.headers["accept-encoding"] == "identity"
    assert (reply.status, reply.streaming, json.loads(reply.head)) == (200, False, {"ok": True})


async def test_a_5xx_is_an_upstream_status_error_with_the_engines_words() -> None:
    proxy, client = upstream(lambda r: httpx.Response(503, text="engine overloaded"))
    async with client:
        with pytest.raises(UpstreamStatusError, match="answered 503: engine overloaded") as caught:
            await proxy.open(ENGINE, call())
    assert caught.value.upstream_status == 503


async def test_a_4xx_to_a_streaming_call_is_buffered_whole() -> None:
    proxy, client = upstream(lambda r: httpx.Response(400, json={"error": {"message": "bad"}}))
    async with client:
        reply = await proxy.open(ENGINE, call(stream=True))
    assert (reply.status, reply.streaming) == (400, False)
    assert json.loads(reply.head) == {"error": {"message": "bad"}}


async def chunks(parts: list[bytes], *, fail_after: int | None = None) -> AsyncIterator[bytes]:
    for i, part in enumerate(parts):
        if fail_after is not None and i == fail_after:
            raise httpx.ReadError("connection reset")
        yield part


async def test_a_stream_has_its_first_chunk_as_head_and_the_rest_as_they_come() -> None:
    parts = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    proxy, client = upstream(lambda r: httpx.Response(200, content=chunks(parts)))
    async with client:
        reply = await proxy.open(ENGINE, call(stream=True))
        rest = [chunk async for chunk in reply.rest()]
        await reply.aclose()
    assert reply.streaming
    assert [reply.head, *rest] == parts


async def test_a_stream_that_breaks_raises_upstream_broken_from_rest() -> None:
    parts = [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"]
    proxy, client = upstream(lambda r: httpx.Response(200, content=chunks(parts, fail_after=2)))
    async with client:
        reply = await proxy.open(ENGINE, call(stream=True))
        received = [reply.head]
        with pytest.raises(UpstreamBroken, match="connection reset"):
            async for chunk in reply.rest():
                received.append(chunk)
        await reply.aclose()
    assert received == parts[:2]


async def test_the_dispatcher_tries_one_other_endpoint_then_gives_up_with_both_reasons() -> None:
    hits: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        hits.append(str(request.url.host))
        return httpx.Response(500, text=f"{request.url.host} is broken")

    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=lambda: 0.0)
    registry.set_pool("decode", [f"http://10.0.0.{i}:8000" for i in (1, 2, 3)])
    metrics = RouterMetrics(CollectorRegistry(), registry)
    proxy, client = upstream(handler)
    dispatcher = Dispatcher(
        registry=registry, scheduler=RoundRobin(), upstream=proxy, metrics=metrics, retries=1
    )
    view = RequestView(
        request_id="r", route=Route.COMPLETIONS, model="qwen", tenant="t", stream=False, body={}
    )
    async with client:
        with pytest.raises(NoEndpointAvailable) as caught:
            await dispatcher.open("decode", request=view, call=call())
    assert hits == ["10.0.0.1", "10.0.0.2"]
    assert "10.0.0.1 is broken" in caught.value.message
    assert "10.0.0.2 is broken" in caught.value.message
    assert [s.consecutive_failures for s in registry.snapshots("decode")] == [1, 1, 0]
    assert [s.in_flight for s in registry.snapshots("decode")] == [0, 0, 0]
