"""The upstream layer and the dispatcher against real sockets: error translation, what is sent,
heads and streams, connection reuse, and the retry budget.

Real: `HTTPUpstream` over the gateway's `Wire`, `Dispatcher`, `EndpointRegistry`, `RoundRobin`,
`RouterMetrics`, TCP on 127.0.0.1. Faked: the engines (tests/router/raw_engine.py answers byte for byte).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from typing import cast

import pytest
from prometheus_client import CollectorRegistry
from tests.router.raw_engine import chunk, chunked_head, raw_engine, response, streamed

from tandem.router.admission.gate import AdmissionGate
from tandem.router.admission.grant import Grant
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.errors import (
    NoEndpointAvailable,
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.pipeline.context import RequestContext
from tandem.router.pipeline.exchange import Exchange
from tandem.router.pipeline.stages import Pick
from tandem.router.scheduling import RoundRobin
from tandem.router.settings import ProxySettings
from tandem.router.types import Endpoint, RequestView
from tandem.router.upstream.client import HTTPUpstream, UpstreamCall
from tandem.router.upstream.dispatch import Dispatcher
from tandem.router.upstream.wire import Wire


def call(*, stream: bool = False, read_timeout_s: float | None = None) -> UpstreamCall:
    return UpstreamCall(
        path="/v1/completions",
        body='{"model":"qwen","prompt":"é"}'.encode(),
        headers={"x-request-id": "r1"},
        stream=stream,
        read_timeout_s=read_timeout_s,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_refused_connection_is_a_connect_error_naming_the_endpoint(
    wire: Wire,
) -> None:
    engine = Endpoint("decode", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(UpstreamConnectError, match=re.escape(engine.name)) as caught:
        await HTTPUpstream(wire, ProxySettings()).open(engine, call())
    assert caught.value.kind == "connect"


async def test_an_engine_that_never_answers_is_a_timeout(wire: Wire) -> None:
    async def silent(request: bytes, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async with raw_engine(silent) as engine:
        with pytest.raises(UpstreamTimeout) as caught:
            await HTTPUpstream(wire, ProxySettings()).open(
                Endpoint("decode", engine.url), call(read_timeout_s=0.2)
            )
    assert caught.value.kind == "timeout"


async def test_the_body_goes_as_given_with_the_request_id_and_no_compression(
    wire: Wire,
) -> None:
    async def ok(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response(200, b'{"ok": true}'))

    async with raw_engine(ok) as engine:
        reply = await HTTPUpstream(wire, ProxySettings()).open(Endpoint("decode", engine.url), call())
        reply.close()
    [request] = engine.requests
    head, _, body = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/completions HTTP/1.1")
    assert body == '{"model":"qwen","prompt":"é"}'.encode()
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
    }
    assert headers[b"x-request-id"] == b"r1"
    assert headers[b"accept-encoding"] == b"identity"
    assert headers[b"content-type"] == b"application/json"
    assert (reply.status, reply.streaming, json.loads(reply.head)) == (200, False, {"ok": True})


async def test_a_5xx_is_an_upstream_status_error_with_the_engines_words(
    wire: Wire,
) -> None:
    async def overloaded(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response(503, b"engine overloaded", content_type=b"text/plain"))

    async with raw_engine(overloaded) as engine:
        with pytest.raises(UpstreamStatusError, match="answered 503: engine overloaded") as caught:
            await HTTPUpstream(wire, ProxySettings()).open(Endpoint("decode", engine.url), call())
    assert caught.value.upstream_status == 503


async def test_a_4xx_to_a_streaming_call_is_buffered_whole(wire: Wire) -> None:
    async def bad(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response(400, b'{"error": {"message": "bad"}}'))

    async with raw_engine(bad) as engine:
        reply = await HTTPUpstream(wire, ProxySettings()).open(
            Endpoint("decode", engine.url), call(stream=True)
        )
    assert (reply.status, reply.streaming) == (400, False)
    assert json.loads(reply.head) == {"error": {"message": "bad"}}


PARTS = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]


async def test_a_stream_has_its_first_chunk_as_head_the_rest_as_they_come_and_its_connection_is_reused(
    wire: Wire,
) -> None:
    upstream = HTTPUpstream(wire, ProxySettings())
    async with raw_engine(streamed(PARTS)) as engine:
        for _ in range(2):
            reply = await upstream.open(Endpoint("decode", engine.url), call(stream=True))
            rest = []
            while piece := await reply.read():
                rest.append(piece)
            assert reply.ended()
            reply.close()
            assert reply.streaming and b"".join([reply.head, *rest]) == b"".join(PARTS)
    assert engine.connections == 1  # read to its end, the connection went back to the pool


async def test_a_stream_that_breaks_raises_upstream_broken(wire: Wire) -> None:
    async def dies(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(chunked_head() + chunk(PARTS[0]))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(chunk(PARTS[1])[:5])  # half a chunk, then the engine is gone
        await writer.drain()
        writer.transport.abort()

    async with raw_engine(dies) as engine:
        reply = await HTTPUpstream(wire, ProxySettings()).open(
            Endpoint("decode", engine.url), call(stream=True)
        )
        with pytest.raises(UpstreamBroken, match=re.escape(engine.url.removeprefix("http://"))):
            while await reply.read():
                pass
        reply.close()


def round_robin_dispatcher(wire: Wire, urls: list[str]) -> Dispatcher:
    """A dispatcher over the decode pool `urls`, round robin, one retry."""
    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=lambda: 0.0)
    registry.set_pool("decode", urls)
    return Dispatcher(
        registry=registry,
        scheduler=RoundRobin(),
        upstream=HTTPUpstream(wire, ProxySettings()),
        metrics=RouterMetrics(CollectorRegistry(), registry),
        retries=1,
    )


async def test_the_dispatcher_tries_one_other_endpoint_then_gives_up_with_both_reasons(
    wire: Wire,
) -> None:
    async def broken(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response(500, b"this engine is broken", content_type=b"text/plain"))

    async with raw_engine(broken) as one, raw_engine(broken) as two, raw_engine(broken) as three:
        urls = sorted([one.url, two.url, three.url])
        dispatcher = round_robin_dispatcher(wire, urls)
        registry = dispatcher.registry
        with pytest.raises(NoEndpointAvailable) as caught:
            await dispatcher.open("decode", request=RequestView(request_id="r"), call=call())
        hits = [len(e.requests) for e in sorted((one, two, three), key=lambda e: e.url)]
    assert hits == [1, 1, 0]
    assert caught.value.message.count("this engine is broken") == 2
    assert [s.consecutive_failures for s in registry.snapshots("decode")] == [1, 1, 0]
    assert [s.in_flight for s in registry.snapshots("decode")] == [0, 0, 0]


def test_choose_takes_the_preferred_endpoint_while_it_is_in_rotation(wire: Wire) -> None:
    """`Dispatcher.choose(prefer=...)`: a pre-empting request's decode engine is the stopped stream's
    (`pipeline.stages.Pick`), room or not; an endpoint gone from the pool is not preferred."""
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    dispatcher = round_robin_dispatcher(wire, urls)
    view = RequestView(request_id="r")
    chosen = [dispatcher.choose("decode", view, prefer=urls[2]) for _ in range(3)]
    assert [e.url if e else None for e in chosen] == [urls[2]] * 3
    round_robin = {
        e.url for e in (dispatcher.choose("decode", view, prefer="http://gone:9") for _ in range(3)) if e
    }
    assert round_robin == set(urls)


@pytest.mark.parametrize(
    ("prefill_pool", "adapter", "swapped"),
    [(True, None, True), (False, None, False), (True, "sql-lora", False)],
    ids=["pd", "aggregated", "adapter"],
)
async def test_pick_swaps_a_pre_empting_request_onto_the_stopped_streams_engine_only_with_a_prefill_pool(
    wire: Wire, prefill_pool: bool, adapter: str | None, swapped: bool
) -> None:
    """`pipeline.stages.Pick`: the stopped stream's engine, and `swapped_in`, in a P/D service for a
    base-model request; the scheduler's round robin otherwise (three picks reach all three engines)."""
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    dispatcher = round_robin_dispatcher(wire, urls)
    if prefill_pool:
        dispatcher.registry.set_pool("prefill", ["http://127.0.0.1:9"])
    picked: set[str] = set()
    for n in range(3):
        ctx = RequestContext(request_id=f"r{n}", upstream_id=f"r{n}", path="/v1/completions", started=0.0)
        ctx.adapter = adapter
        ctx.grant = Grant(cast(AdmissionGate, None), tenant="light", prompt_tokens=0, charged=False)
        ctx.grant.preempting, ctx.grant.stopped_on = True, urls[1]
        await Pick(dispatcher)(ctx, cast(Exchange, None))
        assert ctx.decode is not None and ctx.swapped_in is swapped
        picked.add(ctx.decode.url)
    assert picked == ({urls[1]} if swapped else set(urls))
