"""Upstream HTTP: the only module that talks to engines (`HTTPUpstream`, over the gateway's
`tandem.router.upstream.wire.Wire`), and the router's view of an engine's answer (`UpstreamReply`).

The wire is Tandem's own HTTP/1.1 on asyncio protocols, not a general client: measured on the
gateway's hot path, aiohttp's client spent per streamed chunk what the wire spends per read
(a StreamReader fed, the reading task woken, a read-timeout timer rescheduled), and before it httpx's
pool scanned every pooled connection per request (docs/router-performance.md). Errors arrive as
`UpstreamError`s naming the endpoint.

Bodies are sent as they are given (bytes, already encoded by the caller); `accept-encoding:
identity` keeps the bytes we relay identical to the bytes the engine wrote.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from tandem.router.discovery.collector import Fetch, ScrapeError
from tandem.router.errors import (
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from tandem.router.settings import ProxySettings
from tandem.router.types import Endpoint
from tandem.router.upstream.wire import KEEPALIVE_S, Answer, Sink, Wire

__all__ = ["KEEPALIVE_S", "HTTPUpstream", "Sink", "Upstream", "UpstreamCall", "UpstreamReply", "new_wire"]

#: Bytes of an error body quoted in an `UpstreamStatusError`.
SNIPPET = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamCall:
    """One POST to an engine: `body` is the encoded JSON. `read_timeout_s` (seconds) overrides the
    proxy's default silence limit between two bytes of the answer."""

    path: str
    body: bytes
    headers: Mapping[str, str]
    stream: bool
    read_timeout_s: float | None = None


class UpstreamReply:
    """An engine's answer whose status and first bytes have arrived.

    Buffered (`streaming` False: a non-streaming call, or any status >= 400): `head` is the whole
    body and the connection is already back in the pool. Streaming: `head` is the first bytes (b""
    for an empty body); the rest either goes to a sink (`pipe`, the relay's way: each read from the
    engine handed over from the connection's callback) or comes from `read()` (b"" at the end).
    `close()` is idempotent and synchronous; closing a stream before its end closes its
    connection, which is how the engine learns the client went away.
    """

    __slots__ = ("_answer", "content_type", "endpoint", "head", "status", "streaming")

    def __init__(self, *, endpoint: Endpoint, answer: Answer, head: bytes, streaming: bool) -> None:
        self.endpoint = endpoint
        self.status = answer.status
        self.content_type = answer.headers.get("content-type", "application/json")
        self.head = head
        self.streaming = streaming
        self._answer = answer

    async def read(self) -> bytes:
        """The next bytes of the body after `head`, b"" at its end; raises `UpstreamError` if the
        engine fails."""
        if not self.streaming:
            return b""
        return await self._answer.read()

    def pipe(self, sink: Sink) -> None:
        """Hand the body after `head` to `sink` as it arrives (`tandem.router.upstream.wire`)."""
        if self.streaming:
            self._answer.pipe(sink)
        else:
            sink.end()

    def pause(self) -> None:
        """Stop reading from the engine until `resume` (the client is slower than the engine)."""
        self._answer.pause()

    def resume(self) -> None:
        self._answer.resume()

    def ended(self) -> bool:
        """Whether the whole body has been read (the connection can be reused)."""
        return not self.streaming or self._answer.done

    def close(self) -> None:
        self._answer.close()


class Upstream(Protocol):
    """What the dispatcher needs from the engines' HTTP side (a test may script it)."""

    async def open(self, endpoint: Endpoint, call: UpstreamCall) -> UpstreamReply: ...


async def get_whole(
    wire: Wire,
    url: str,
    path: str,
    *,
    name: str,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """GET `path` from the engine at `url` and read its whole answer within `timeout_s`; raises
    `UpstreamError` (`UpstreamTimeout` when the answer takes longer)."""
    answer = await wire.exchange(
        url, name=name, method="GET", path=path, headers=dict(headers or {}), body=b"", read_s=timeout_s
    )
    try:
        async with asyncio.timeout(timeout_s):
            await answer.wait(whole=True)
    except TimeoutError:
        raise UpstreamTimeout(f"{name}: no whole answer in {timeout_s:g}s") from None
    finally:
        answer.close()
    return answer


def metrics_fetch(wire: Wire) -> Fetch:
    """The metrics collector's `Fetch` over the gateway's `wire`: `GET /metrics` on a kept-alive
    connection to the engine (`get_whole`), its errors in the collector's terms."""

    async def fetch(url: str, timeout_s: float) -> tuple[int, str]:
        try:
            answer = await get_whole(wire, url, "/metrics", name=url, timeout_s=timeout_s)
        except (UpstreamConnectTimeout, UpstreamTimeout) as exc:
            raise TimeoutError(exc.message) from None
        except UpstreamError as exc:
            raise ScrapeError(exc.message) from None
        return answer.status, answer.take().decode("utf-8", errors="replace")

    return fetch


class HTTPUpstream:
    """Sends calls to engines over the gateway's `Wire`, with `Authorization: Bearer <key>` on each
    when `settings.engine_api_key` is set (engines that require vLLM's API key); the key overrides
    any authorization header a call carries."""

    def __init__(self, wire: Wire, settings: ProxySettings) -> None:
        self._wire = wire
        self._settings = settings
        key = settings.engine_api_key
        self._auth: dict[str, str] = {} if key is None else {"authorization": f"Bearer {key}"}

    async def open(self, endpoint: Endpoint, call: UpstreamCall) -> UpstreamReply:
        """POST `call` to `endpoint` and wait for the head of the answer (see `UpstreamReply`).

        Raises `UpstreamStatusError` for a 5xx (nothing was relayed yet, so the caller may retry)
        and the other `UpstreamError`s for transport failures; in every error case the connection
        is closed before raising.
        """
        headers = {
            "content-type": "application/json",
            "accept-encoding": "identity",
            **call.headers,
            **self._auth,
        }
        answer = await self._wire.exchange(
            endpoint.url,
            name=endpoint.name,
            method="POST",
            path=call.path,
            headers=headers,
            body=call.body,
            read_s=call.read_timeout_s or self._settings.read_timeout_seconds,
        )
        try:
            await answer.wait(whole=not call.stream)
        except BaseException:
            answer.close()
            raise
        streaming = call.stream and answer.status < 400
        reply = UpstreamReply(endpoint=endpoint, answer=answer, head=answer.take(), streaming=streaming)
        if reply.status >= 500:
            answer.close()
            snippet = reply.head[:SNIPPET].decode("utf-8", errors="replace")
            raise UpstreamStatusError(
                f"{endpoint.name}: answered {reply.status}: {snippet}", upstream_status=reply.status
            )
        return reply

    async def get_json(self, endpoint: Endpoint, path: str, *, timeout_s: float) -> Any:
        """GET `path` and parse JSON; raises `UpstreamError` (transport or non-2xx) or ValueError."""
        answer = await get_whole(
            self._wire, endpoint.url, path, name=endpoint.name, timeout_s=timeout_s, headers=self._auth
        )
        if not 200 <= answer.status < 300:
            raise UpstreamStatusError(
                f"{endpoint.name}: answered {answer.status}", upstream_status=answer.status
            )
        return orjson.loads(answer.take())


def new_wire(settings: ProxySettings) -> Wire:
    """The upstream wire the gateway makes (its connect timeout from `settings`)."""
    return Wire(connect_s=settings.connect_timeout_seconds)
