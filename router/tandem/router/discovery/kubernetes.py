"""Kubernetes discovery: each pool's members are the ready addresses of its Service's EndpointSlices.

For `discovery: {kind: kubernetes, namespace, prefillService, decodeService, port}` the router lists and
then watches `discovery.k8s.io/v1` EndpointSlices labelled `kubernetes.io/service-name=<service>` in
the namespace, one watch per pool, with Tandem's Kubernetes client (`tandem.core.kubeaccess`, httpx):

- **Members**: every address of every endpoint whose `conditions.ready` is not false (Kubernetes:
  "nil should be interpreted as ready"), as `http://<address>:<port>` with the config's `port`
  (IPv6 addresses in brackets), deduplicated and sorted. Terminating and not-ready pods leave at once.
- **Watch**: `?watch=true&resourceVersion=<list's>&allowWatchBookmarks=true&timeoutSeconds=300`,
  one JSON event per line; ADDED/MODIFIED store the slice, DELETED drops it, BOOKMARK moves the
  resourceVersion on. When the server ends the watch it is resumed from the last resourceVersion;
  `410 Gone` (or an ERROR event with code 410) relists; any other failure relists after a backoff of
  0.5 s doubling to 30 s. The pool is rewritten only when its member set changes.
- **Start**: both pools are listed before `start` returns, so the first request finds endpoints; a
  failed first list is logged and leaves the pool empty (`/health` says 503) while the watch keeps
  retrying in the background.
- **Label filter**: slices are also checked client-side, so an API server (or an emulator) that
  ignores `labelSelector` cannot add another Service's pods.

Credentials (`KubeAccess.in_cluster`): the service account's token (re-read on every connect, since
bound tokens rotate) and CA from `/var/run/secrets/kubernetes.io/serviceaccount/`, the server from
`KUBERNETES_SERVICE_HOST`/`_PORT`. `KubeAccess.plain(url)` is for an unauthenticated endpoint such as
`kubectl proxy` or a test emulator. The router's ServiceAccount needs `list` and `watch` on
`endpointslices.discovery.k8s.io` in the namespace.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from tandem.core.endpointslices import SERVICE_NAME_LABEL, ready_urls
from tandem.core.kubeaccess import KubeAccess, list_and_watch, request_json, watch_events
from tandem.core.kubeerror import KubeError
from tandem.core.routerconfig import KubernetesDiscovery
from tandem.core.tasks import stop_tasks
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.types import Pool

log = logging.getLogger(__name__)


class SliceWatch:
    """One Service's EndpointSlices, listed then watched; `on_change(urls)` on every membership change."""

    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        api: KubeAccess,
        namespace: str,
        service: str,
        port: int,
        on_change: Callable[[list[str]], None],
    ) -> None:
        self._client = client
        self._api = api
        self.service = service
        self._port = port
        self._on_change = on_change
        self._path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        self._selector = f"{SERVICE_NAME_LABEL}={service}"
        self._slices: dict[str, Mapping[str, Any]] = {}
        self._published: list[str] | None = None

    async def list(self) -> str:
        """Replace the known slices with a fresh list; returns its resourceVersion."""
        body = await request_json(
            self._client, self._api, "GET", self._path, params={"labelSelector": self._selector}
        )
        self._slices = {item["metadata"]["name"]: item for item in body.get("items") or ()}
        self._publish()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    async def run(self, resource_version: str | None) -> None:
        """Watch forever (until cancelled); `resource_version` from a successful `list`, or None."""
        await list_and_watch(
            self.list, self._watch, on_retry=self._retrying, resource_version=resource_version
        )

    def _retrying(self, exc: BaseException, backoff_s: float) -> None:
        log.warning(
            "endpointslice watch failed; retrying",
            extra={"service": self.service, "error": repr(exc), "retry_s": backoff_s},
        )

    async def _watch(self, resource_version: str) -> str:
        async for event in watch_events(
            self._client,
            self._api,
            self._path,
            resource_version=resource_version,
            params={"labelSelector": self._selector},
        ):
            resource_version = self._apply(event) or resource_version
        return resource_version

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        """Apply one watch event; returns its resourceVersion (None when it has none)."""
        kind, obj = event.get("type"), event.get("object") or {}
        metadata = obj.get("metadata") or {}
        if kind in ("ADDED", "MODIFIED"):
            self._slices[metadata["name"]] = obj
        elif kind == "DELETED":
            self._slices.pop(metadata["name"], None)
        if kind != "BOOKMARK":
            self._publish()
        rv = metadata.get("resourceVersion")
        return str(rv) if rv else None

    def _publish(self) -> None:
        urls = ready_urls(self._slices.values(), service=self.service, port=self._port)
        if urls != self._published:
            self._published = urls
            self._on_change(urls)


class KubernetesEndpoints:
    """The `Discovery` for `kind: kubernetes` (module docstring). `client`: injected for tests;
    otherwise one is made from `api` and closed by `stop`."""

    def __init__(
        self, config: KubernetesDiscovery, *, api: KubeAccess, client: httpx.AsyncClient | None = None
    ) -> None:
        self._config = config
        self._api = api
        self._client = client
        self._owns_client = client is None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, registry: EndpointRegistry) -> None:
        client = self._client = self._client or self._api.client()
        services: dict[Pool, str] = {
            "prefill": self._config.prefill_service,
            "decode": self._config.decode_service,
        }
        for pool, service in services.items():
            watch = SliceWatch(
                client=client,
                api=self._api,
                namespace=self._config.namespace,
                service=service,
                port=self._config.port,
                on_change=_updater(registry, pool, service),
            )
            resource_version: str | None
            try:
                resource_version = await watch.list()
            except (KubeError, KeyError, TypeError, ValueError) as exc:
                log.warning(
                    "cannot list endpointslices; the pool stays empty until the watch succeeds",
                    extra={"service": service, "error": repr(exc)},
                )
                resource_version = None
            self._tasks.append(asyncio.create_task(watch.run(resource_version), name=f"watch-{service}"))

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        self._tasks.clear()
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None


def _updater(registry: EndpointRegistry, pool: Pool, service: str) -> Callable[[list[str]], None]:
    def update(urls: list[str]) -> None:
        registry.set_pool(pool, urls)
        log.info("pool members changed", extra={"pool": pool, "service": service, "endpoints": urls})

    return update
