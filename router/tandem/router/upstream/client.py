"""Upstream HTTP: the only module that talks to engines, and the one place where httpx exceptions
become router errors (`translate_errors`), mapped to the most specific `UpstreamError`.

The `httpx.AsyncClient` is injected (tests pass `httpx.MockTransport` or a real client); this
module never creates one. Bodies are sent as compact JSON; `accept-encoding: identity` keeps the
bytes we relay identical to the bytes the engine wrote.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tandem.router.errors import (
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamStatusError,
    UpstreamTimeout,
)
from tandem.router.settings import ProxySettings
from tandem.router.types import Endpoint


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamCall:
    """One POST to an engine. `read_timeout_s` (seconds) overrides the proxy's default silence limit."""

    path: str
    body: Mapping[str, Any]
    headers: Mapping[str, str]
    stream: bool
    read_timeout_s: float | None = None


@contextmanager
def translate_errors(endpoint: Endpoint) -> Iterator[None]:
    """Re-raise httpx transport errors as `UpstreamError`s naming the endpoint."""
    try:
        yield
    except (httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        raise UpstreamConnectTimeout(f"{endpoint.name}: {type(exc).__name__}") from exc
    except httpx.TimeoutException as exc:
        raise UpstreamTimeout(f"{endpoint.name}: {type(exc).__name__}") from exc
    except httpx.ConnectError as exc:
        raise UpstreamConnectError(f"{endpoint.name}: cannot connect ({exc})") from exc
    except httpx.TransportError as exc:
        raise UpstreamBroken(f"{endpoint.name}: connection broke ({exc})") from exc


class UpstreamReply:
    """An engine's answer whose status and first bytes have arrived.

    Buffered (`streaming` False: a non-streaming call, or any status >= 400): `head` is the whole
    body and the connection is already released. Streaming: `head` is the first chunk (b"" for an
    empty body) and `rest()` yields the others as they arrive. `aclose()` is idempotent; closing a
    stream early closes its connection, which is how the engine learns the client went away.
    """

    def __init__(
        self, *, endpoint: Endpoint, response: httpx.Response, head: bytes, rest: AsyncIterator[bytes] | None
    ) -> None:
        self.endpoint = endpoint
        self.status = response.status_code
        self.content_type = response.headers.get("content-type", "application/json")
        self.head = head
        self._response = response
        self._rest = rest

    @property
    def streaming(self) -> bool:
        return self._rest is not None

    async def rest(self) -> AsyncIterator[bytes]:
        """The body after `head`, chunk by chunk; raises `UpstreamError` if the engine fails."""
        if self._rest is None:
            return
        with translate_errors(self.endpoint):
            async for chunk in self._rest:
                yield chunk

    async def aclose(self) -> None:
        if self._rest is not None and hasattr(self._rest, "aclose"):
            await self._rest.aclose()  # finalise httpx's chunk generator before its response
        await self._response.aclose()


class Upstream:
    """Sends calls to engines through one shared `httpx.AsyncClient`."""

    def __init__(self, client: httpx.AsyncClient, settings: ProxySettings) -> None:
        self._client = client
        self._settings = settings

    def _timeout(self, read: float | None = None) -> httpx.Timeout:
        connect = self._settings.connect_timeout_seconds
        return httpx.Timeout(
            connect=connect, read=read or self._settings.read_timeout_seconds, write=connect, pool=connect
        )

    async def open(self, endpoint: Endpoint, call: UpstreamCall) -> UpstreamReply:
        """POST `call` to `endpoint` and wait for the head of the answer (see `UpstreamReply`).

        Raises `UpstreamStatusError` for a 5xx (nothing was relayed yet, so the caller may retry)
        and the other `UpstreamError`s for transport failures; in every error case the connection
        is closed before raising.
        """
        request = self._client.build_request(
            "POST",
            endpoint.url + call.path,
            content=json.dumps(call.body, separators=(",", ":"), ensure_ascii=False).encode(),
            headers={
                "content-type": "application/json",
                "accept-encoding": "identity",
                **call.headers,
            },
            timeout=self._timeout(call.read_timeout_s),
        )
        with translate_errors(endpoint):
            response = await self._client.send(request, stream=True)
        try:
            reply = await self._read_head(endpoint, response, stream=call.stream)
        except BaseException:
            await response.aclose()
            raise
        if reply.status >= 500:
            await response.aclose()
            snippet = reply.head[:200].decode("utf-8", errors="replace")
            raise UpstreamStatusError(
                f"{endpoint.name}: answered {reply.status}: {snippet}", upstream_status=reply.status
            )
        return reply

    async def _read_head(
        self, endpoint: Endpoint, response: httpx.Response, *, stream: bool
    ) -> UpstreamReply:
        with translate_errors(endpoint):
            if stream and response.status_code < 400:
                chunks = response.aiter_raw()
                head = await anext(chunks, b"")
                return UpstreamReply(endpoint=endpoint, response=response, head=head, rest=chunks)
            body = await response.aread()
        await response.aclose()
        return UpstreamReply(endpoint=endpoint, response=response, head=body, rest=None)

    async def get_json(self, endpoint: Endpoint, path: str, *, timeout_s: float) -> Any:
        """GET `path` and parse JSON; raises `UpstreamError` (transport or non-2xx) or ValueError."""
        with translate_errors(endpoint):
            response = await self._client.get(endpoint.url + path, timeout=timeout_s)
        if not response.is_success:
            raise UpstreamStatusError(
                f"{endpoint.name}: answered {response.status_code}",
                upstream_status=response.status_code,
            )
        return response.json()
