"""Hostile clients against the gateway: each attack as a client would send it, and the safe outcome.

Real: the router app served on 127.0.0.1 in front of fake engines (`tests.router.fake_engine`, which
applies output limits the way vLLM does and counts the requests it holds at once), real HTTP clients.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import tracemalloc
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from tests.router.harness import MODEL, Launcher, RunningRouter, metric

from tandem.router.settings import AccessSettings, AdmissionSettings, ProxySettings, RouterSettings

CAPACITY = 2


async def test_a_small_max_tokens_beside_a_large_max_completion_tokens_does_not_free_the_slot(
    launcher: Launcher,
) -> None:
    """`max_tokens: 1` with `max_completion_tokens: 8` on chat: vLLM generates 8 tokens. Read as 1, the
    handover would free the request's slot after its first token, and 50 more streams than the
    engine's capacity would all run in it at once, past the fair queue."""
    engine = await launcher.engine("d0", tokens=8, token_delay=0.02)
    settings = RouterSettings(admission=AdmissionSettings(poll_seconds=0.02, handover_tokens=2))
    spec: dict[str, dict[str, Any]] = {
        "engine": {"kind": "sim", "args": ["--max-num-seqs", str(CAPACITY)]},
        "router": {"slo": {"ttftSeconds": 60}},
    }
    router = await launcher.router(decode=[engine], settings=settings, spec=spec)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "max_completion_tokens": 8,
        "stream": True,
    }

    async def stream(client: httpx.AsyncClient) -> int:
        chunks = 0
        async with client.stream("POST", f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                chunks += '"content":" d0-' in line.replace(": ", ":")
        return chunks

    async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
        answers = await asyncio.gather(*(stream(client) for _ in range(CAPACITY + 50)))
    assert answers == [8] * (CAPACITY + 50)  # the engine's limit was the larger one
    # Its capacity, and at most the handed-over streams finishing their last 2 tokens beside them.
    assert engine.most_open <= 2 * CAPACITY, engine.most_open


def _chat(messages: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": 2, **extra}


LIMIT = 4 * 1024 * 1024  # the default max_request_bytes
BODIES: dict[str, tuple[str, bytes]] = {
    # the measured attack: 900,000 one-letter messages, 25 MiB
    "900k messages": (
        "/v1/chat/completions",
        orjson.dumps(_chat([{"role": "user", "content": "a"}] * 900_000)),
    ),
    # up to the limit, each shape that parses into many objects
    "tiny messages": (
        "/v1/chat/completions",
        orjson.dumps(_chat([{"role": "user", "content": "a"}] * (LIMIT // 32))),
    ),
    "empty dicts": ("/v1/chat/completions", orjson.dumps(_chat([{}] * (LIMIT // 3)))),
    "content parts": (
        "/v1/chat/completions",
        orjson.dumps(_chat([{"role": "user", "content": [{"type": "text", "text": "a"}] * (LIMIT // 32)}])),
    ),
    "prompt list": ("/v1/completions", orjson.dumps({"model": MODEL, "prompt": ["a"] * (LIMIT // 5)})),
    "token list": ("/v1/completions", orjson.dumps({"model": MODEL, "prompt": [7] * (LIMIT // 2 - 64)})),
    "nested lists": ("/v1/completions", orjson.dumps({"model": MODEL, "prompt": [[]] * (LIMIT // 3)})),
}


@pytest.mark.parametrize("shape", list(BODIES))
async def test_a_body_of_any_shape_is_refused_or_served_without_the_gateway_ballooning(
    launcher: Launcher, shape: str
) -> None:
    """One body per shape, sent once: the gateway answers it with an error or an answer, and the
    memory it allocated meanwhile (traced: the parser's objects, validation, tokenization) stays under
    100 MiB, against 144 MiB for four MiB of `{}` parsed alone and gigabytes for the 900k messages."""
    engine = await launcher.engine("d0", tokens=2)
    router = await launcher.router(decode=[engine])
    path, body = BODIES[shape]
    gc.collect()
    tracemalloc.start()
    try:
        async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
            response = await client.post(
                f"{router.url}{path}", content=body, headers={"content-type": "application/json"}
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code in (200, 400, 413), response.text[:200]
    if response.status_code != 200:
        assert response.json()["error"]["message"]
    # The request body itself (held by the client and the server) is part of what is traced.
    assert peak - 2 * len(body) < 100 * 2**20, (
        f"{peak / 2**20:.0f} MiB traced for a {len(body) / 2**20:.1f} MiB body"
    )


async def test_a_client_learns_no_engine_address_from_headers_or_errors(launcher: Launcher) -> None:
    """With the gateway's defaults no response names an engine: no `x-tandem-*` header (they told
    whether a prompt was cached, and where), and an engine failure is reported without its address
    (the gateway's log line keeps it, under the request id)."""
    good = await launcher.engine("d0", tokens=2)
    settings = RouterSettings(access=AccessSettings(topology_headers=False))
    router = await launcher.router(decode=[good], settings=settings)
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    answered = await router.http.post("/v1/completions", json=body)
    assert answered.status_code == 200
    assert not [name for name in answered.headers if name.lower().startswith("x-tandem-")]
    good.behaviour.status = 500  # the engine now fails every request
    failed = await router.http.post("/v1/completions", json=body)
    assert failed.status_code == 503
    host = good.url.removeprefix("http://")
    assert host not in failed.text and "127.0.0.1" not in failed.text, failed.text
    assert failed.json()["error"]["message"]


async def test_a_client_that_stops_reading_loses_its_stream_and_its_slot(launcher: Launcher) -> None:
    """A client opens a long stream and never reads it: once the server's buffers are full the
    gateway waits `client_write_seconds` (0.5 here), then ends the stream, closes the engine's
    request and gives its slot to the next request, which is answered. (Before, the silence timer
    re-armed while the upstream was paused, and the stream held its slot for as long as the client
    kept the connection.)"""
    engine = await launcher.engine("d0", tokens=200_000)
    settings = RouterSettings(
        proxy=ProxySettings(client_write_seconds=0.5),
        admission=AdmissionSettings(poll_seconds=0.02, handover_tokens=0),
    )
    spec: dict[str, dict[str, Any]] = {
        "engine": {"kind": "sim", "args": ["--max-num-seqs", "1"]},
        "router": {"slo": {"ttftSeconds": 60}},
    }
    router = await launcher.router(decode=[engine], settings=settings, spec=spec)
    host, port = router.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: backpressure soon
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    body = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 200_000, "stream": True})
    head = f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
    await asyncio.get_running_loop().sock_sendall(
        sock, head.encode() + f"content-length: {len(body)}\r\n\r\n".encode() + body
    )
    try:
        await asyncio.wait_for(engine.arrived.wait(), timeout=30)  # the stream reached the engine
        assert await _eventually(router, lambda: engine.open_requests == 0)  # and was let go
        # The slot is free: the next request (capacity 1) is served while the stalled socket stays open.
        answered = await router.http.post(
            "/v1/completions", json={"model": MODEL, "prompt": "next", "max_tokens": 2}
        )
        assert answered.status_code == 200
    finally:
        sock.close()
    assert await _eventually(router, lambda: True)


async def _eventually(router: RunningRouter, condition: Callable[[], bool]) -> bool:
    """Whether `condition` holds with no request admitted, within 30 s (a grant is released just
    after its response's last byte)."""
    for _ in range(600):
        if condition() and await metric(router, "tandem_router_admitted_requests") == 0:
            return True
        await asyncio.sleep(0.05)
    return False
