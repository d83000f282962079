"""The Kubernetes API with Tandem's client (`tandem.core.kubeaccess`, httpx), as the router's
EndpointSlice discovery talks to it; every failure is `tandem.core.kubeerror.KubeError` (`ClusterError`).

- `KubeAccess` (`tandem.core.kubeaccess`, shared with the gateway): where the API server is and how to
  authenticate.
- `Informer`: one collection (InferenceServices, EndpointSlices), listed then watched
  (`?watch=true&resourceVersion=<list's>&allowWatchBookmarks=true`), kept in memory by (namespace, name);
  `on_change(kind, object)` for every ADDED / MODIFIED / DELETED. The watch resumes from the last
  resourceVersion when the server ends it; `410 Gone` relists (objects gone since are reported
  DELETED); any other failure relists after a backoff of 0.5 s doubling to 30 s. `synced` is set once
  the first list is in.
- `HttpCluster`: `tandem.autoscaler.cluster.ClusterAPI`: ready engine URLs from the EndpointSlice
  informers' caches, one per namespace watched or one for all (the same rule as the router,
  `tandem.core.endpointslices.ready_urls`), the scale subresource of Deployments and LeaderWorkerSets
  (and the workload itself: its ownerReferences, a LeaderWorkerSet's ready groups), Events, and the
  InferenceService's status subresource (merge patches).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from tandem.autoscaler.cluster import DEPLOYMENT, ScaleView, ServiceRef, WorkloadKind, scale_patch
from tandem.core.endpointslices import ready_urls
from tandem.core.kubeaccess import KubeAccess, list_and_watch, request_json, watch_events
from tandem.core.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)
OnChange = Callable[[str, Mapping[str, Any]], None]


def collection(group_version: str, plural: str, namespace: str | None) -> str:
    """`/apis/g/v[/namespaces/ns]/plural` (`/api/v1/...` for the core group)."""
    root = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{root}{scope}/{plural}"


def services_path(namespace: str | None) -> str:
    return collection(f"{GROUP}/{VERSION}", PLURAL, namespace)


def slices_path(namespace: str | None) -> str:
    return collection("discovery.k8s.io/v1", "endpointslices", namespace)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta["name"])


class Informer:
    """A collection listed, then watched (module docstring)."""

    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        access: KubeAccess,
        path: str,
        on_change: OnChange | None = None,
    ) -> None:
        self._client = client
        self._access = access
        self.path = path
        self._on_change = on_change or (lambda kind, obj: None)
        self.objects: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.synced = asyncio.Event()

    async def list(self) -> str:
        """Replace the known objects with a fresh list; returns its resourceVersion."""
        body = await request_json(self._client, self._access, "GET", self.path)
        fresh = {_key(item): item for item in body.get("items") or ()}
        gone = [obj for key, obj in self.objects.items() if key not in fresh]
        self.objects = fresh
        self.synced.set()
        for obj in gone:
            self._on_change("DELETED", obj)
        for obj in fresh.values():
            self._on_change("MODIFIED", obj)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    async def run(self) -> None:
        """List and watch until cancelled."""
        await list_and_watch(self.list, self._watch, on_retry=self._retrying)

    def _retrying(self, exc: BaseException, backoff_s: float) -> None:
        log.warning(
            "list/watch failed; retrying", extra={"path": self.path, "error": repr(exc), "retry_s": backoff_s}
        )

    async def _watch(self, resource_version: str) -> str:
        async for event in watch_events(
            self._client, self._access, self.path, resource_version=resource_version
        ):
            resource_version = self._apply(event) or resource_version
        return resource_version

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind in ("ADDED", "MODIFIED"):
            self.objects[_key(obj)] = obj
            self._on_change(str(kind), obj)
        elif kind == "DELETED":
            self.objects.pop(_key(obj), None)
            self._on_change("DELETED", obj)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        return str(rv) if rv else None


class HttpCluster:
    """`ClusterAPI` over one httpx client; EndpointSlices come from `slices` (informers' caches, one
    per namespace watched or one for every namespace)."""

    def __init__(self, *, client: httpx.AsyncClient, access: KubeAccess, slices: Sequence[Informer]) -> None:
        self._client = client
        self._access = access
        self._slices = slices

    async def ready_urls(self, namespace: str, service: str, port: int) -> list[str]:
        mine = [s for slices in self._slices for (ns, _), s in slices.objects.items() if ns == namespace]
        return ready_urls(mine, service=service, port=port)

    async def get_scale(self, namespace: str, name: str, *, kind: WorkloadKind = DEPLOYMENT) -> ScaleView:
        body = await self._call("GET", self._scale_path(namespace, name, kind))
        replicas = int((body.get("spec") or {}).get("replicas") or 0)
        return ScaleView(replicas=replicas, uid=str((body.get("metadata") or {}).get("uid") or ""))

    async def get_workload(
        self, namespace: str, name: str, *, kind: WorkloadKind = DEPLOYMENT
    ) -> dict[str, Any]:
        return await self._call("GET", f"{collection(kind.group_version, kind.plural, namespace)}/{name}")

    async def patch_scale(
        self, namespace: str, name: str, replicas: int, *, uid: str, kind: WorkloadKind = DEPLOYMENT
    ) -> None:
        body = scale_patch(replicas, uid=uid)
        await self._call("PATCH", self._scale_path(namespace, name, kind), body=body)

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        await self._call("POST", collection("v1", "events", namespace), body=event)

    async def patch_status(self, ref: ServiceRef, patch: Mapping[str, Any]) -> None:
        path = f"{services_path(ref.namespace)}/{ref.name}/status"
        await self._call("PATCH", path, body={"status": patch})

    @staticmethod
    def _scale_path(namespace: str, name: str, kind: WorkloadKind) -> str:
        return f"{collection(kind.group_version, kind.plural, namespace)}/{name}/scale"

    async def _call(self, method: str, path: str, *, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return await request_json(self._client, self._access, method, path, body=body)
