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

- **KV layouts**: EndpointSlices do not carry pod labels, so the router also lists and watches the
  namespace's Pods labelled `tandem.dev/kv-layout` (every engine pod the operator renders) and maps
  each pod IP to its label's value; a member takes the layout of the pod at its address
  (`Endpoint.layout`), and the P/D step pairs prefill and decode engines only of one layout
  (`tandem.router.pd.disagg`). A member whose pod is not known (no label: an older operator, or its
  pod not yet seen) has no layout and pairs with any other. The pods' watch follows the slices'
  rules (resume, relist on 410, backoff); a pod change rewrites a pool only when a member's layout
  changed. Pods are checked for the label client-side too. A failed pods list (say, a Role from
  before pods were granted) is logged and leaves layouts unknown: discovery itself goes on.

Credentials (`KubeAccess.in_cluster`): the service account's token (re-read on every connect, since
bound tokens rotate) and CA from `/var/run/secrets/kubernetes.io/serviceaccount/`, the server from
`KUBERNETES_SERVICE_HOST`/`_PORT`. `KubeAccess.plain(url)` is for an unauthenticated endpoint such as
`kubectl proxy` or a test emulator. The router's ServiceAccount needs `list` and `watch` on
`endpointslices.discovery.k8s.io` and on `pods` in the namespace.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from tandem.core.endpointslices import SERVICE_NAME_LABEL, ready_urls
from tandem.core.kubeaccess import KubeAccess, list_and_watch, request_json, watch_events
from tandem.core.kubeerror import KubeError
from tandem.core.routerconfig import KubernetesDiscovery
from tandem.core.tasks import stop_tasks
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.types import Pool

log = logging.getLogger(__name__)

#: The label of every engine pod: its KV layout (`tandem.operator.resources.kvlayout`).
KV_LAYOUT_LABEL = "tandem.dev/kv-layout"


class _Watch:
    """Objects of one collection, listed then watched (module docstring); `_publish` after changes."""

    def __init__(self, *, client: httpx.AsyncClient, api: KubeAccess, path: str, selector: str) -> None:
        self._client = client
        self._api = api
        self._path = path
        self._selector = selector
        self._objects: dict[str, Mapping[str, Any]] = {}

    @property
    def name(self) -> str:
        return self._selector

    async def list(self) -> str:
        """Replace the known objects with a fresh list; returns its resourceVersion."""
        body = await request_json(
            self._client, self._api, "GET", self._path, params={"labelSelector": self._selector}
        )
        self._objects = {item["metadata"]["name"]: item for item in body.get("items") or ()}
        self._publish()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    async def run(self, resource_version: str | None) -> None:
        """Watch forever (until cancelled); `resource_version` from a successful `list`, or None."""
        await list_and_watch(
            self.list, self._watch, on_retry=self._retrying, resource_version=resource_version
        )

    def _retrying(self, exc: BaseException, backoff_s: float) -> None:
        log.warning(
            "kubernetes watch failed; retrying",
            extra={"watch": self.name, "error": repr(exc), "retry_s": backoff_s},
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
            self._objects[metadata["name"]] = obj
        elif kind == "DELETED":
            self._objects.pop(metadata["name"], None)
        if kind != "BOOKMARK":
            self._publish()
        rv = metadata.get("resourceVersion")
        return str(rv) if rv else None

    def _publish(self) -> None:
        raise NotImplementedError


class SliceWatch(_Watch):
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
        path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        super().__init__(client=client, api=api, path=path, selector=f"{SERVICE_NAME_LABEL}={service}")
        self.service = service
        self._port = port
        self._on_change = on_change
        self._published: list[str] | None = None

    @property
    def name(self) -> str:
        return self.service

    def _publish(self) -> None:
        urls = ready_urls(self._objects.values(), service=self.service, port=self._port)
        if urls != self._published:
            self._published = urls
            self._on_change(urls)


class PodLayouts(_Watch):
    """The namespace's engine pods, listed then watched: their KV layout by pod IP (`layouts`);
    `on_change()` whenever that map changes."""

    def __init__(
        self, *, client: httpx.AsyncClient, api: KubeAccess, namespace: str, on_change: Callable[[], None]
    ) -> None:
        path = f"/api/v1/namespaces/{namespace}/pods"
        super().__init__(client=client, api=api, path=path, selector=KV_LAYOUT_LABEL)
        self._on_change = on_change
        self.layouts: dict[str, str] = {}

    def _publish(self) -> None:
        layouts = pod_layouts(self._objects.values())
        if layouts != self.layouts:
            self.layouts = layouts
            self._on_change()


def pod_layouts(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Each labelled pod's IPs (`status.podIP`, `status.podIPs`) → its `tandem.dev/kv-layout`.
    Example: a pod with IP 10.0.0.7 labelled `3f1c0a9e5b7d2c41` → {"10.0.0.7": "3f1c0a9e5b7d2c41"}."""
    layouts: dict[str, str] = {}
    for pod in pods:
        layout = ((pod.get("metadata") or {}).get("labels") or {}).get(KV_LAYOUT_LABEL)
        if not layout:
            continue
        status = pod.get("status") or {}
        ips = [status.get("podIP")] + [entry.get("ip") for entry in status.get("podIPs") or ()]
        layouts.update({ip: str(layout) for ip in ips if ip})
    return layouts


def layouts_of(urls: Iterable[str], by_ip: Mapping[str, str]) -> dict[str, str]:
    """The layouts of the members at `urls` whose address has a known pod: `http://[fd00::7]:8000`
    takes the layout of pod IP `fd00::7`."""
    found: dict[str, str] = {}
    for url in urls:
        layout = by_ip.get(urlsplit(url).hostname or "")
        if layout is not None:
            found[url] = layout
    return found


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
        self._registry: EndpointRegistry | None = None
        self._pods: PodLayouts | None = None
        self._urls: dict[Pool, list[str]] = {}
        self._published: dict[Pool, tuple[list[str], dict[str, str]]] = {}

    async def start(self, registry: EndpointRegistry) -> None:
        client = self._client = self._client or self._api.client()
        self._registry = registry
        self._pods = PodLayouts(
            client=client, api=self._api, namespace=self._config.namespace, on_change=self._republish
        )
        await self._begin(
            self._pods, "cannot list pods; engines' KV layouts unknown until the watch succeeds"
        )
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
                on_change=self._updater(pool, service),
            )
            await self._begin(
                watch, "cannot list endpointslices; the pool stays empty until the watch succeeds"
            )

    async def _begin(self, watch: _Watch, failure: str) -> None:
        """List `watch`'s objects (a failure is logged), then watch them in the background."""
        resource_version: str | None
        try:
            resource_version = await watch.list()
        except (KubeError, KeyError, TypeError, ValueError) as exc:
            log.warning(failure, extra={"watch": watch.name, "error": repr(exc)})
            resource_version = None
        self._tasks.append(asyncio.create_task(watch.run(resource_version), name=f"watch-{watch.name}"))

    def _updater(self, pool: Pool, service: str) -> Callable[[list[str]], None]:
        def update(urls: list[str]) -> None:
            self._urls[pool] = urls
            self._set(pool, service=service)

        return update

    def _republish(self) -> None:
        """The pods' layouts changed: rewrite each pool whose members' layouts did."""
        for pool in list(self._urls):
            self._set(pool, service=None)

    def _set(self, pool: Pool, *, service: str | None) -> None:
        urls, by_ip = self._urls[pool], self._pods.layouts if self._pods is not None else {}
        layouts = layouts_of(urls, by_ip)
        if service is None and self._published.get(pool) == (urls, layouts):
            return
        self._published[pool] = (urls, layouts)
        if self._registry is not None:
            self._registry.set_pool(pool, urls, layouts=layouts)
        log.info(
            "pool members changed",
            extra={"pool": pool, "service": service, "endpoints": urls, "layouts": layouts},
        )

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        self._tasks.clear()
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None
