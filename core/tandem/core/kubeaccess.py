"""How a Tandem process reaches the Kubernetes API over HTTP: the gateway's EndpointSlice discovery and
the autoscaler share it.

`KubeAccess.in_cluster(environ)`: the pod's service-account token (re-read on every request, since bound
tokens rotate) and CA from `/var/run/secrets/kubernetes.io/serviceaccount/`, the server from
`KUBERNETES_SERVICE_HOST`/`_PORT` (IPv6 hosts bracketed). `KubeAccess.plain(url)`: an unauthenticated
endpoint such as `kubectl proxy` or a test's emulated API server.

`watch_events(client, access, path, resource_version=...)`: one watch of a collection (bookmarks on,
ended by the server after `WATCH_TIMEOUT_S`), yielding its events; `WatchGone` when the
resourceVersion is too old (an HTTP 410 or an ERROR event with code 410: the caller lists again).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
WATCH_TIMEOUT_S = 300
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.5, 30.0
#: What a list or a watch may fail with: transport and status errors, malformed documents.
LIST_WATCH_ERRORS = (httpx.HTTPError, OSError, ValueError, KeyError, TypeError)


class KubeAccessError(ValueError):
    """No way to reach the API server: not in a cluster, and no `--kube-api-server` given."""


class WatchGone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


@dataclass(frozen=True, slots=True)
class KubeAccess:
    """The API server's URL, a bearer token read from `token_file` per request (None: no auth), and the
    CA bundle to verify TLS with (None: the system CAs)."""

    server: str
    token_file: Path | None = None
    ca_file: Path | None = None

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str]) -> KubeAccess:
        """The pod's own API access; raises `KubeAccessError` outside a cluster."""
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeAccessError(
                "not in a cluster (KUBERNETES_SERVICE_HOST/_PORT are unset); outside one, "
                "pass --kube-api-server (e.g. the URL of `kubectl proxy`)"
            )
        host = f"[{host}]" if ":" in host else host
        return cls(
            server=f"https://{host}:{port}",
            token_file=SERVICE_ACCOUNT_DIR / "token",
            ca_file=SERVICE_ACCOUNT_DIR / "ca.crt",
        )

    @classmethod
    def plain(cls, url: str) -> KubeAccess:
        return cls(server=url.rstrip("/"))

    def headers(self) -> dict[str, str]:
        if self.token_file is None:
            return {}
        return {"authorization": f"Bearer {self.token_file.read_text().strip()}"}

    def client(self) -> httpx.AsyncClient:
        verify: str | bool = str(self.ca_file) if self.ca_file is not None else True
        return httpx.AsyncClient(
            base_url=self.server, verify=verify, trust_env=False, timeout=httpx.Timeout(10.0)
        )


async def watch_events(
    client: httpx.AsyncClient,
    access: KubeAccess,
    path: str,
    *,
    resource_version: str,
    params: Mapping[str, str] | None = None,
) -> AsyncIterator[Mapping[str, Any]]:
    """The events of one watch of `path` from `resource_version` (module docstring); raises `WatchGone`,
    `ValueError` for another ERROR event, and httpx's errors for transport or status failures."""
    query = {
        **(params or {}),
        "watch": "true",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(WATCH_TIMEOUT_S),
    }
    if resource_version:
        query["resourceVersion"] = resource_version
    timeout = httpx.Timeout(10.0, read=WATCH_TIMEOUT_S + 30)
    async with client.stream(
        "GET", path, params=query, headers=access.headers(), timeout=timeout
    ) as response:
        if response.status_code == 410:
            raise WatchGone
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("type") == "ERROR":
                obj = event.get("object") or {}
                if obj.get("code") == 410:
                    raise WatchGone
                raise ValueError(f"watch error: {obj.get('message', obj)}")
            yield event


async def list_and_watch(
    list_: Callable[[], Awaitable[str]],
    watch: Callable[[str], Awaitable[str]],
    *,
    on_retry: Callable[[BaseException, float], None],
    resource_version: str | None = None,
) -> None:
    """List (when there is no resourceVersion yet), then watch from it, until cancelled: a watch the
    server ends resumes from its last resourceVersion, `WatchGone` lists again, and any other failure is
    reported to `on_retry(error, backoff_s)` and lists again after a backoff of 0.5 s doubling to 30 s."""
    backoff = FIRST_BACKOFF_S
    while True:
        try:
            if resource_version is None:
                resource_version = await list_()
            resource_version = await watch(resource_version)
            backoff = FIRST_BACKOFF_S
        except WatchGone:
            resource_version = None
        except LIST_WATCH_ERRORS as exc:
            on_retry(exc, backoff)
            resource_version = None
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)
