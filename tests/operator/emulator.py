"""kmock's Kubernetes emulator, completed with what the operator and kopf rely on.

kmock 0.8 (pinned: this uses its internals) is an in-memory Kubernetes API over HTTP on 127.0.0.1.
This subclass adds, as a real API server does (see shared research/k8s-lab.md):
- server-side metadata: uid, creationTimestamp, generation and resourceVersion on create;
  resourceVersion bumped on every write; generation bumped when a write changes `spec`;
- lists that report the current resourceVersion, and watches that replay only newer objects, with
  the snapshot and the event-bus subscription taken atomically (no lost events);
- HTTP 422 for a failed JSON-patch `test` op (kopf's optimistic concurrency), not 500;
- the garbage collector: once an object is gone, objects whose every owner reference names a uid
  that no longer exists are deleted too (background cascading deletion);
- an authorizer, when a test sets `authorize`: a resource request it refuses is answered 403
  Forbidden, as an API server's RBAC authorizer would (the request stays in the log);
- `/api/v1/namespaces[/<name>]` read as the Namespace resource (`parse_namespace_paths`, which the
  `api` fixtures call): kmock takes `namespaces` there for the start of a namespaced path and answers 500;
- a request matched to its reaction in constant time (`match_requests_by_index`, also called by the
  `api` fixtures): kmock asks each reaction whether its filter view sees the request by walking every
  request the server ever got, so a test's cost grew with the square of its requests (an operator test
  of 1,700 requests spent 40% of a minute of CPU there).
Not emulated: schema validation, defaulting, label selectors, server-side apply, controllers (tests
play the Deployment controller by writing `status` themselves).
"""

from __future__ import annotations

import copy
import datetime
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import attrs
import jsonpatch
import kmock
import pytest
from kmock._internal import dsl, enums, parsing, rendering

from tandem.core.gateway import GATEWAY_KIND, GATEWAY_PLURAL

_kmock_parse_path = parsing.parse_path


def parse_path(path: str) -> parsing.ParsedPath:
    """kmock's URL parsing, except that `/api/v1/namespaces` and `/api/v1/namespaces/<name>` are the
    cluster-scoped Namespace resource (a namespaced path has at least a plural after the name)."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        name = parts[3] if len(parts) == 4 else None
        return parsing.ParsedPath(group="", version="v1", plural="namespaces", name=name)
    return _kmock_parse_path(path)


def parse_namespace_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use `parse_path` for the rest of the test (kmock calls it by its module attribute)."""
    monkeypatch.setattr(parsing, "parse_path", parse_path)


_kmock_contains: Callable[[dsl.View, Any], bool] = dsl.View.__contains__


def _sees(view: dsl.View, item: Any) -> bool:
    """`item in view`, kmock's own answer, except for a request against a chain of plain filters and
    priorities over the root it arrived at (every reaction the emulator declares): the request is the
    root's `id`-th (kmock numbers them so) and passes every filter's criteria. Anything else (slices,
    groups, a request of another root) gets kmock's walk over every request."""
    if not isinstance(item, rendering.Request):
        return _kmock_contains(view, item)
    node, criteria = view, []
    while isinstance(node, dsl.Chained) and type(node) in (dsl.Filter, dsl.Priority):
        if isinstance(node, dsl.Filter):
            criteria.append(node.criteria)
        node = node._source
    if not isinstance(node, dsl.Root):
        return _kmock_contains(view, item)
    log = node._requests
    if not (0 <= item.id < len(log) and log[item.id] is item):
        return _kmock_contains(view, item)
    return all(check(item) for check in criteria)


def match_requests_by_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use `_sees` for `request in view` for the rest of the test (module docstring)."""
    monkeypatch.setattr(dsl.View, "__contains__", _sees)


def merged(base: Any, patch: Any) -> Any:
    """RFC 7386 merge patch of `patch` onto a copy of `base`."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = copy.deepcopy(dict(base)) if isinstance(base, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result


@attrs.define(kw_only=True)
class StampingEmulator(kmock.KubernetesEmulator):
    """The emulator described in the module docstring."""

    _rv: int = 0
    #: The authorizer: False refuses a resource request with 403 Forbidden. None: everything allowed.
    authorize: Callable[[rendering.Request], bool] | None = None

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    async def _handle(self, request: rendering.Request) -> Any:
        if request.resource is not None and self.authorize is not None and not self.authorize(request):
            raise kmock.KubernetesError(
                status=403,
                reason="Forbidden",
                message=f"{request.method.value} {request.url.path}: forbidden",
            )
        if request.resource is not None and isinstance(request.data, dict | list):
            if request.action == enums.action.CREATE and isinstance(request.data, dict):
                meta = request.data.setdefault("metadata", {})
                meta.setdefault("uid", str(uuid.uuid4()))
                now = datetime.datetime.now(datetime.UTC)
                meta.setdefault("creationTimestamp", now.strftime("%Y-%m-%dT%H:%M:%SZ"))
                meta.setdefault("generation", 1)
                meta["resourceVersion"] = self._next_rv()
            elif request.action == enums.action.UPDATE:
                rv = self._next_rv()
                if isinstance(request.data, dict):  # merge patch
                    meta = request.data.setdefault("metadata", {})
                    meta["resourceVersion"] = rv
                    generation = self._bumped_generation(request)
                    if generation is not None:
                        meta["generation"] = generation
                else:  # JSON patch: bump after kopf's `test` op
                    request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": rv})
        try:
            return await super()._handle(request)
        finally:
            if request.action in (enums.action.DELETE, enums.action.UPDATE):
                await self._collect_garbage()

    def _bumped_generation(self, request: rendering.Request) -> int | None:
        """The next generation when this merge patch changes the object's spec, else None."""
        if request.subresource is not None or "spec" not in request.data:
            return None
        if request.resource is None or request.name is None:
            return None
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        current = self._objects[key].raw
        if merged(current.get("spec"), request.data["spec"]) == current.get("spec"):
            return None
        return int(current.get("metadata", {}).get("generation", 1)) + 1

    async def _collect_garbage(self) -> None:
        async with self._lock:
            live = {k: o for k, o in self._objects.items() if not o.deleted}
            uids = {o.get("metadata", {}).get("uid") for o in live.values()}
            for (resource, _, _), obj in live.items():
                owners = obj.get("metadata", {}).get("ownerReferences") or []
                if owners and not any(ref.get("uid") in uids for ref in owners):
                    raw = obj.raw
                    obj.delete()
                    await self._buses[resource].put({"type": "DELETED", "object": raw})

    async def _serve_list(self, request: rendering.Request) -> Any:
        result = await super()._serve_list(request)
        assert isinstance(result, dict)
        result["metadata"]["resourceVersion"] = str(self._rv)
        return result

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        yield b""  # send the headers now
        rv = request.params.get("resourceVersion", "")
        since = int(rv) if rv.isdigit() else 0
        assert request.resource is not None
        bus = self._buses[request.resource]
        async with self._lock:  # snapshot and subscribe atomically
            mark = await bus.mark()
            objs = self._KubernetesEmulator__get_objs(request, strict=False)  # type: ignore[attr-defined]
            events = [
                {"type": "ADDED", "object": o.raw}
                for o in objs
                if not o.deleted and int(o.raw["metadata"].get("resourceVersion", 0)) > since
            ]
        try:
            for event in events:
                yield event
            async for event in bus.stream(since=mark):
                meta = event.get("object", {}).get("metadata", {})
                check = self._KubernetesEmulator__check  # type: ignore[attr-defined]
                if check(request, request.resource, meta.get("namespace"), meta.get("name"), strict=False):
                    yield event
        finally:
            await bus.unmark(mark)

    async def _render_error(self, exc: Exception) -> Any:
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):
            exc = kmock.KubernetesError(status=422, reason="Invalid", message=str(exc))
        return await super()._render_error(exc)


def know_inference_services(api: kmock.KubernetesEmulator, *, resource: str) -> kmock.KubernetesEmulator:
    """Teach the emulated API server the built-in kinds, the InferenceService `resource`
    (`group/version/plural`) and the InferenceGateway beside it, with their status subresources;
    returns it."""
    with warnings.catch_warnings():
        # kmock 0.8 reads its bundled resource list with the legacy importlib.resources API.
        warnings.filterwarnings("ignore", "read_binary is deprecated", DeprecationWarning)
        api.resources.load_bundled()
    api.resources[resource] = kmock.ResourceInfo(
        kind="InferenceService",
        singular="inferenceservice",
        namespaced=True,
        verbs={"list", "watch", "get", "patch", "create", "delete"},
        subresources={"status"},
    )
    api.resources[f"{resource.rsplit('/', 1)[0]}/{GATEWAY_PLURAL}"] = kmock.ResourceInfo(
        kind=GATEWAY_KIND,
        singular=GATEWAY_KIND.lower(),
        namespaced=True,
        verbs={"list", "watch", "get", "patch", "create", "delete"},
        subresources={"status"},
    )
    return api
