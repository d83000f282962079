"""How a Tandem process reaches the Kubernetes API over HTTP: the gateway's EndpointSlice discovery and
the autoscaler share it.

`KubeAccess.in_cluster(environ)`: the pod's service-account token (re-read on every request, since bound
tokens rotate) and CA from `/var/run/secrets/kubernetes.io/serviceaccount/`, the server from
`KUBERNETES_SERVICE_HOST`/`_PORT` (IPv6 hosts bracketed). `KubeAccess.plain(url)`: an unauthenticated
endpoint such as `kubectl proxy` or a test's emulated API server. A kubeconfig's fixed `token` and
`tls` context (its CA, client certificate, insecure flag) are filled by the operator's kubeconfig reader.

`request_json(client, access, method, path, ...)`: one request, its JSON object back (`send_json`: the
same over a synchronous client, for the operator's handlers in kopf's thread pool).
`watch_events(client, access, path, resource_version=...)`: one watch of a collection (bookmarks on,
ended by the server after `WATCH_TIMEOUT_S`), yielding its events; `WatchGone` when the
resourceVersion is too old (an HTTP 410 or an ERROR event with code 410: the caller lists again).
`list_and_watch` is the loop around them.

Every failure is a `tandem.core.kubeerror.KubeError` (`WatchGone` is one, status 410): httpx's errors,
non-2xx answers and malformed documents are translated here, at the boundary. This module and httpx are
Tandem's one Kubernetes client family (docs/decisions.md, "One Kubernetes client family").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tandem.core.kubeerror import KubeError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
WATCH_TIMEOUT_S = 300
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.5, 30.0
MERGE_PATCH = "application/merge-patch+json"


class KubeAccessError(ValueError):
    """No way to reach the API server: not in a cluster, and no `--kube-api-server` given."""


class WatchGone(KubeError):
    """The watch's resourceVersion is too old (410): list again."""

    def __init__(self, message: str = "the watch's resourceVersion is gone") -> None:
        super().__init__(410, message)


@dataclass(frozen=True, slots=True)
class KubeAccess:
    """The API server's URL, a bearer token read from `token_file` per request (else the fixed `token`;
    neither: no auth), and how to verify TLS: the `tls` context when given, else the CA bundle
    `ca_file` (None: the system CAs)."""

    server: str
    token_file: Path | None = None
    ca_file: Path | None = None
    token: str | None = None
    tls: ssl.SSLContext | None = None

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
        if self.token_file is not None:
            return {"authorization": f"Bearer {self.token_file.read_text().strip()}"}
        if self.token:
            return {"authorization": f"Bearer {self.token}"}
        return {}

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.server, verify=self._verify(), trust_env=False, timeout=httpx.Timeout(10.0)
        )

    def sync_client(self, *, timeout_s: float = 30.0) -> httpx.Client:
        """A synchronous client (for code that runs in threads); `timeout_s` per request."""
        return httpx.Client(
            base_url=self.server, verify=self._verify(), trust_env=False, timeout=httpx.Timeout(timeout_s)
        )

    def _verify(self) -> ssl.SSLContext | str | bool:
        if self.tls is not None:
            return self.tls
        return str(self.ca_file) if self.ca_file is not None else True


async def request_json(
    client: httpx.AsyncClient,
    access: KubeAccess,
    method: str,
    path: str,
    *,
    params: Mapping[str, str] | None = None,
    body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One request; its answer's JSON object. A body is sent as JSON, or as a JSON merge patch for
    PATCH. Raises `KubeError` with the answer's status and message (0: no answer)."""
    with _translated(method, path):
        response = await client.send(_request(client, access, method, path, params=params, body=body))
    return _answer(method, path, response.status_code, response.content, response.reason_phrase)


def send_json(
    client: httpx.Client,
    access: KubeAccess,
    method: str,
    path: str,
    *,
    params: Mapping[str, str] | None = None,
    body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`request_json` over a synchronous client."""
    with _translated(method, path):
        response = client.send(_request(client, access, method, path, params=params, body=body))
    return _answer(method, path, response.status_code, response.content, response.reason_phrase)


@contextlib.contextmanager
def _translated(method: str, path: str) -> Iterator[None]:
    """Sending a request: a transport failure, or a token file that cannot be read, is a `KubeError`
    with status 0 (no answer)."""
    try:
        yield
    except httpx.HTTPError as exc:
        raise KubeError(0, f"{method} {path}: {exc!r}") from None
    except OSError as exc:  # reading the token file
        raise KubeError(0, f"{method} {path}: {exc}") from None


def _request(
    client: httpx.Client | httpx.AsyncClient,
    access: KubeAccess,
    method: str,
    path: str,
    *,
    params: Mapping[str, str] | None,
    body: Mapping[str, Any] | None,
) -> httpx.Request:
    headers = {"accept": "application/json", **access.headers()}
    if body is not None:
        headers["content-type"] = MERGE_PATCH if method == "PATCH" else "application/json"
    content = json.dumps(body) if body is not None else None
    return client.build_request(method, path, params=params, headers=headers, content=content)


def _answer(method: str, path: str, status: int, content: bytes, reason: str) -> dict[str, Any]:
    """The JSON object of an answer, or `KubeError` for a failed or malformed one."""
    try:
        data = json.loads(content or b"{}")
    except ValueError:
        data = {"message": content[:200].decode(errors="replace")}
    if not 200 <= status <= 299:
        message = data.get("message") if isinstance(data, dict) else None
        raise KubeError(status, f"{method} {path}: {message or reason}")
    if not isinstance(data, dict):
        raise KubeError(0, f"{method} {path}: the answer is not a JSON object")
    return data


async def watch_events(
    client: httpx.AsyncClient,
    access: KubeAccess,
    path: str,
    *,
    resource_version: str,
    params: Mapping[str, str] | None = None,
) -> AsyncIterator[Mapping[str, Any]]:
    """The events of one watch of `path` from `resource_version` (module docstring); raises `WatchGone`,
    and `KubeError` for another ERROR event, a failed answer, a lost connection or a malformed line."""
    query = {
        **(params or {}),
        "watch": "true",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(WATCH_TIMEOUT_S),
    }
    if resource_version:
        query["resourceVersion"] = resource_version
    timeout = httpx.Timeout(10.0, read=WATCH_TIMEOUT_S + 30)
    try:
        async with client.stream(
            "GET", path, params=query, headers=access.headers(), timeout=timeout
        ) as response:
            if response.status_code == 410:
                raise WatchGone
            if not response.is_success:
                await response.aread()
                _answer("WATCH", path, response.status_code, response.content, response.reason_phrase)
            async for line in response.aiter_lines():
                if line.strip():
                    yield _event(path, line)
    except httpx.HTTPError as exc:
        raise KubeError(0, f"WATCH {path}: {exc!r}") from None
    except OSError as exc:  # reading the token file
        raise KubeError(0, f"WATCH {path}: {exc}") from None


def _event(path: str, line: str) -> Mapping[str, Any]:
    """One watch line as an event; `WatchGone` or `KubeError` for an ERROR event or a malformed line."""
    try:
        event = json.loads(line)
    except ValueError:
        raise KubeError(0, f"WATCH {path}: not a JSON event: {line[:200]!r}") from None
    if not isinstance(event, dict):
        raise KubeError(0, f"WATCH {path}: not a JSON event: {line[:200]!r}")
    if event.get("type") == "ERROR":
        obj = event.get("object") or {}
        if obj.get("code") == 410:
            raise WatchGone(str(obj.get("message") or "the watch's resourceVersion is gone"))
        raise KubeError(int(obj.get("code") or 0), f"WATCH {path}: {obj.get('message', obj)}")
    return event


async def list_and_watch(
    list_: Callable[[], Awaitable[str]],
    watch: Callable[[str], Awaitable[str]],
    *,
    on_retry: Callable[[BaseException, float], None],
    resource_version: str | None = None,
) -> None:
    """List (when there is no resourceVersion yet), then watch from it, until cancelled: a watch the
    server ends resumes from its last resourceVersion, `WatchGone` lists again, and any other
    `KubeError` (and a malformed object: `KeyError`, `TypeError`, `ValueError`) is reported to
    `on_retry(error, backoff_s)` and lists again after a backoff of 0.5 s doubling to 30 s."""
    backoff = FIRST_BACKOFF_S
    while True:
        try:
            if resource_version is None:
                resource_version = await list_()
            resource_version = await watch(resource_version)
            backoff = FIRST_BACKOFF_S
        except WatchGone:
            resource_version = None
        except (KubeError, KeyError, TypeError, ValueError) as exc:
            on_retry(exc, backoff)
            resource_version = None
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)
