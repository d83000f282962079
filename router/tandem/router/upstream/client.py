"""Upstream HTTP: the only module that talks to engines, and the one place where client exceptions
become router errors (`translate`), mapped to the most specific `UpstreamError`.

The client is aiohttp's (`ClientSession`, created by the composition root with `new_session`):
measured on the gateway's hot path it costs a fraction of httpx's, whose connection pool scans
every pooled connection per request (docs/router-performance.md). Its connector keeps idle
connections per engine in a deque (taking one is O(1)) and drops them after 2 s idle, before engines
(vLLM's and the simulator's uvicorn) close theirs at 5 s: a connection reused just as the engine
closes it breaks before any answer, with nothing to retry on a one-engine pool.

Bodies are sent as they are given (bytes, already encoded by the caller); `accept-encoding:
identity` keeps the bytes we relay identical to the bytes the engine wrote (the session does not
decompress).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from tandem.router.errors import (
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from tandem.router.settings import ProxySettings
from tandem.router.types import Endpoint

#: Seconds an idle upstream connection is kept (engines close theirs after 5 s).
KEEPALIVE_S = 2.0
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


def translate(endpoint: Endpoint, exc: BaseException) -> UpstreamError | None:
    """The `UpstreamError` for a client exception, naming the endpoint; None for anything else."""
    name = endpoint.name
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamConnectTimeout(f"{name}: connect timeout")
    if isinstance(exc, TimeoutError):  # aiohttp's socket timeouts are TimeoutErrors too
        return UpstreamTimeout(f"{name}: {type(exc).__name__}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamConnectError(f"{name}: cannot connect ({exc.os_error})")
    if isinstance(exc, aiohttp.ClientError | OSError):
        detail = str(exc) or type(exc).__name__
        return UpstreamBroken(f"{name}: connection broke ({detail})")
    return None


@contextmanager
def translate_errors(endpoint: Endpoint) -> Iterator[None]:
    """Re-raise client transport errors as `UpstreamError`s naming the endpoint."""
    try:
        yield
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        error = translate(endpoint, exc)
        if error is None:
            raise
        try:
            raise error from exc
        finally:
            del error  # see `UpstreamReply.read`


class UpstreamReply:
    """An engine's answer whose status and first bytes have arrived.

    Buffered (`streaming` False: a non-streaming call, or any status >= 400): `head` is the whole
    body and the connection is already back in the pool. Streaming: `head` is the first chunk (b""
    for an empty body) and each `read()` returns what has arrived since (b"" at the end).
    `close()` is idempotent and synchronous; closing a stream before its end closes its
    connection, which is how the engine learns the client went away.
    """

    __slots__ = ("_response", "content_type", "endpoint", "head", "status", "streaming")

    def __init__(
        self, *, endpoint: Endpoint, response: aiohttp.ClientResponse, head: bytes, streaming: bool
    ) -> None:
        self.endpoint = endpoint
        self.status = response.status
        self.content_type = response.headers.get("content-type", "application/json")
        self.head = head
        self.streaming = streaming
        self._response = response

    async def read(self) -> bytes:
        """The next bytes of the body after `head`, b"" at its end; raises `UpstreamError` if the
        engine fails. (A loop of `read` rather than an async iterator: it runs per streamed chunk.)"""
        if not self.streaming:
            return b""
        try:
            return await self._response.content.readany()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            error = translate(self.endpoint, exc)
            if error is None:
                raise
            try:
                raise error from exc
            finally:
                # aiohttp keeps `exc` on the response, and `exc`'s traceback holds this frame: with
                # `error` left in it, the request's objects would be a reference cycle.
                del error

    def ended(self) -> bool:
        """Whether the whole body has been read (the connection can be reused)."""
        return not self.streaming or self._response.content.at_eof()

    def close(self) -> None:
        response = self._response
        if self.ended():
            response.release()
        else:
            response.close()


class Upstream(Protocol):
    """What the dispatcher needs from the engines' HTTP side (a test may script it)."""

    async def open(self, endpoint: Endpoint, call: UpstreamCall) -> UpstreamReply: ...


class HTTPUpstream:
    """Sends calls to engines through one shared `aiohttp.ClientSession`."""

    def __init__(self, session: aiohttp.ClientSession, settings: ProxySettings) -> None:
        self._session = session
        self._settings = settings
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}

    def _timeout(self, read: float | None) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(read)
        if timeout is None:
            connect = self._settings.connect_timeout_seconds
            timeout = self._timeouts[read] = aiohttp.ClientTimeout(
                total=None, connect=connect, sock_read=read or self._settings.read_timeout_seconds
            )
        return timeout

    async def open(self, endpoint: Endpoint, call: UpstreamCall) -> UpstreamReply:
        """POST `call` to `endpoint` and wait for the head of the answer (see `UpstreamReply`).

        Raises `UpstreamStatusError` for a 5xx (nothing was relayed yet, so the caller may retry)
        and the other `UpstreamError`s for transport failures; in every error case the connection
        is closed before raising.
        """
        headers = {"content-type": "application/json", "accept-encoding": "identity", **call.headers}
        with translate_errors(endpoint):
            response = await self._session.post(
                endpoint.url + call.path,
                data=call.body,
                headers=headers,
                timeout=self._timeout(call.read_timeout_s),
            )
        try:
            reply = await self._read_head(endpoint, response, stream=call.stream)
        except BaseException:
            response.close()
            raise
        if reply.status >= 500:
            response.close()
            snippet = reply.head[:SNIPPET].decode("utf-8", errors="replace")
            raise UpstreamStatusError(
                f"{endpoint.name}: answered {reply.status}: {snippet}", upstream_status=reply.status
            )
        return reply

    async def _read_head(
        self, endpoint: Endpoint, response: aiohttp.ClientResponse, *, stream: bool
    ) -> UpstreamReply:
        with translate_errors(endpoint):
            if stream and response.status < 400:
                head = await response.content.readany()
                return UpstreamReply(endpoint=endpoint, response=response, head=head, streaming=True)
            body = await response.read()
        response.release()
        return UpstreamReply(endpoint=endpoint, response=response, head=body, streaming=False)

    async def get_json(self, endpoint: Endpoint, path: str, *, timeout_s: float) -> Any:
        """GET `path` and parse JSON; raises `UpstreamError` (transport or non-2xx) or ValueError."""
        with translate_errors(endpoint):
            async with asyncio.timeout(timeout_s):
                async with self._session.get(endpoint.url + path) as response:
                    body = await response.read()
        if not 200 <= response.status < 300:
            raise UpstreamStatusError(
                f"{endpoint.name}: answered {response.status}", upstream_status=response.status
            )
        return orjson.loads(body)


def new_session() -> aiohttp.ClientSession:
    """The upstream session the gateway makes: no proxies from the environment, no cookies, no
    decompression, no pool cap below what long streams need, idle connections kept `KEEPALIVE_S`.
    Create it inside the running event loop (the app's lifespan)."""
    connector = aiohttp.TCPConnector(
        limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_S, ttl_dns_cache=None, use_dns_cache=True
    )
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        trust_env=False,
        skip_auto_headers=("User-Agent",),
        timeout=aiohttp.ClientTimeout(total=None),
    )
