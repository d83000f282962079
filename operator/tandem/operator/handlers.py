"""kopf wiring: one registry whose handlers call the level-triggered reconciles, one per kind.

create, update and resume (operator start) run it at once; a timer runs it every `resync_seconds`
to repair drift and refresh the status from the children. Handlers only fetch, reconcile, write
the status and post events; everything they share (the API client, images, clock) comes from
kopf's `memo`, filled once by `run_operator`. No module-level state: the registry is built per call.

InferenceServices and InferenceGateways read each other: a service's reconcile lists the gateways of
its namespace (one may serve it), a gateway's lists the services and gateways. When one's view of the
other is stale, its handler patches `gateways.TOUCH_ANNOTATION` on the other, so that it reconciles
now rather than at its next timer (`tandem.operator.gateways`, "Who reconciles when"); a deleted
object's watch event does the same for whoever still names it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from tandem.core.gateway import GATEWAY_KIND, GATEWAY_PLURAL
from tandem.core.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from tandem.operator.cluster import ClusterError, ListingCluster
from tandem.operator.gateways import TOUCH_ANNOTATION, reconcile_gateway
from tandem.operator.objects import ObjectRef
from tandem.operator.reconcile import Event, reconcile
from tandem.operator.resources import Images
from tandem.operator.selection import gateways_to_touch, services_to_touch
from tandem.operator.settings import OperatorSettings
from tandem.operator.status import as_patch

#: Retry delay after a transient API error (seconds).
RETRY_DELAY = 10.0


@dataclass(frozen=True)
class Context:
    """What every handler needs, shared by all objects (kopf copies the memo per object)."""

    cluster: ListingCluster
    images: Images
    metrics_namespaces: tuple[str, ...] = ()
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Credentials for kopf's own client, read now (not at import time): an explicit $KUBECONFIG
    first, else the pod's service account, else ~/.kube/config (the same order as `kube.connect`)."""
    if os.environ.get("KUBECONFIG"):
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def reconcile_timer(
    *, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """The periodic reconcile of one InferenceService (nothing about it changed)."""
    reconcile_handler(body=body, patch=patch, memo=memo, logger=logger, changed=False)


def reconcile_handler(
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    changed: bool = True,
    **_: Any,
) -> None:
    """Reconcile one InferenceService; one at a time per object (timer and events may overlap)."""
    context: Context = memo["tandem"]
    lock: threading.Lock = memo.setdefault("reconcile_lock", threading.Lock())
    namespace = body["metadata"]["namespace"]
    with lock:
        gateways = _listed(context.cluster, GATEWAY_KIND, namespace, logger=logger)
        now = context.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        outcome = reconcile(
            dict(body),
            cluster=context.cluster,
            images=context.images,
            now=now,
            metrics_namespaces=context.metrics_namespaces,
            gateways=gateways,
        )
    status = as_patch(outcome.status, body.get("status") or {})
    patch.status.update(status)
    ready = any(c.type == "Ready" and c.status == "True" for c in outcome.status.conditions)
    stale = gateways_to_touch(body, gateways, ready=ready, changed=changed)
    _touch(context.cluster, GATEWAY_KIND, namespace, stale, why=body, logger=logger)
    _post(memo, body, outcome.events)
    changes = [f"{a.verb} {a.ref}" for a in outcome.actions if a.verb != "unchanged"]
    if changes:
        logger.info("reconciled: %s", "; ".join(changes))
    error = outcome.error
    if error is not None and error.transient:
        raise kopf.TemporaryError(f"Kubernetes API: {error}", delay=RETRY_DELAY)
    if error is not None:
        # The timer tries again; the status and a Warning event already say what failed.
        raise kopf.PermanentError(f"Kubernetes API: {error}")


def gateway_handler(
    *, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Reconcile one InferenceGateway; one at a time per object."""
    context: Context = memo["tandem"]
    lock: threading.Lock = memo.setdefault("reconcile_lock", threading.Lock())
    namespace = body["metadata"]["namespace"]
    with lock:
        services = _listed(context.cluster, KIND, namespace, logger=logger)
        gateways = _listed(context.cluster, GATEWAY_KIND, namespace, logger=logger)
        outcome = reconcile_gateway(
            dict(body),
            cluster=context.cluster,
            services=services,
            gateways=gateways,
            images=context.images,
            now=context.clock().strftime("%Y-%m-%dT%H:%M:%SZ"),
            metrics_namespaces=context.metrics_namespaces,
        )
    patch.status.update(as_patch(outcome.status, body.get("status") or {}))
    _touch(context.cluster, KIND, namespace, outcome.touch, why=body, logger=logger)
    _post(memo, body, outcome.events)
    by_name = {s["metadata"]["name"]: s for s in services}
    for name, event in outcome.service_events:
        if name in by_name:
            kopf.event(
                cast(kopf.Body, by_name[name]), type=event.type, reason=event.reason, message=event.message
            )
    changes = [f"{a.verb} {a.ref}" for a in outcome.actions if a.verb != "unchanged"]
    if changes:
        logger.info("reconciled: %s", "; ".join(changes))
    if outcome.error is not None:
        if outcome.error.transient:
            raise kopf.TemporaryError(f"Kubernetes API: {outcome.error}", delay=RETRY_DELAY)
        raise kopf.PermanentError(f"Kubernetes API: {outcome.error}")


def service_gone(*, event: kopf.RawEvent, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """An InferenceService was deleted: the gateways that still list it reconcile now."""
    if event["type"] != "DELETED":
        return
    context: Context = memo["tandem"]
    body = event["object"]
    namespace = body["metadata"]["namespace"]
    gateways = _listed(context.cluster, GATEWAY_KIND, namespace, logger=logger)
    stale = gateways_to_touch(body, gateways, ready=False, deleted=True)
    _touch(context.cluster, GATEWAY_KIND, namespace, stale, why=body, logger=logger)


def gateway_gone(*, event: kopf.RawEvent, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """An InferenceGateway was deleted: the services it served get their own gateway back now."""
    if event["type"] != "DELETED":
        return
    context: Context = memo["tandem"]
    body = event["object"]
    namespace = body["metadata"]["namespace"]
    services = _listed(context.cluster, KIND, namespace, logger=logger)
    stale = services_to_touch(body["metadata"]["name"], [], services)
    _touch(context.cluster, KIND, namespace, stale, why=body, logger=logger)


def _listed(
    cluster: ListingCluster, kind: str, namespace: str, *, logger: kopf.Logger
) -> list[dict[str, Any]]:
    """Every object of `kind` in `namespace`. A kind the API server does not serve (its CRD is not
    installed: 404) or may not be listed (403: RBAC from before the kind existed) has none, so
    services work as they did before gateways; other errors are retried."""
    try:
        return cluster.list(API_VERSION, kind, namespace)
    except ClusterError as exc:
        if exc.status in (403, 404):
            logger.debug("cannot list %s in %s (%s): taken as none", kind, namespace, exc)
            return []
        raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=RETRY_DELAY) from None


def _touch(
    cluster: ListingCluster,
    kind: str,
    namespace: str,
    names: list[str],
    *,
    why: Mapping[str, Any],
    logger: kopf.Logger,
) -> None:
    """Patch `TOUCH_ANNOTATION` on each named object, valued after the object `why` that changed."""
    meta = why["metadata"]
    value = f"{why.get('kind', '')}/{meta['name']}@{meta.get('resourceVersion', '')}"
    for name in names:
        try:
            patch = {"metadata": {"annotations": {TOUCH_ANNOTATION: value}}}
            cluster.patch(ObjectRef(API_VERSION, kind, namespace, name), patch)
        except ClusterError as exc:
            # The touched object's timer reconciles it anyway; the touch only makes it sooner.
            logger.warning("could not touch %s %s/%s: %s", kind, namespace, name, exc)


def _post(memo: kopf.Memo, body: kopf.Body, events: list[Event]) -> None:
    for event in events:
        # `body` may predate the status a concurrent handler just wrote; remember what this
        # process posted so that one problem makes one event.
        if memo.get("last_event") != event:
            memo["last_event"] = event
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def build_registry(*, resync_seconds: float) -> kopf.OperatorRegistry:
    """A fresh registry with the login handler, and for each kind the reconcile on every cause and a
    timer, and a watch for deletions."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login)
    kinds = ((PLURAL, reconcile_handler, reconcile_timer), (GATEWAY_PLURAL, gateway_handler, gateway_handler))
    for plural, handler, timer in kinds:
        for on in (kopf.on.create, kopf.on.update, kopf.on.resume):
            on(GROUP, VERSION, plural, registry=registry)(handler)
        kopf.timer(
            GROUP, VERSION, plural, registry=registry, interval=resync_seconds, initial_delay=resync_seconds
        )(timer)
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)(service_gone)
    kopf.on.event(GROUP, VERSION, GATEWAY_PLURAL, registry=registry)(gateway_gone)
    return registry


def kopf_settings(*, namespaced: bool) -> kopf.OperatorSettings:
    """kopf's settings: our annotation prefix and finalizer; only warnings become Events. With
    `namespaced` (explicit namespaces), no cluster scanning: the operator then needs no right outside
    its namespaces (docs/security.md)."""
    settings = kopf.OperatorSettings()
    settings.posting.level = logging.WARNING
    # A timer's reconcile runs in a worker thread, which cannot be cancelled: on shutdown or
    # deletion, wait for an in-flight one to finish instead of orphaning it half-way.
    settings.background.instant_exit_timeout = 10.0
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # kopf watches CustomResourceDefinitions (and, given namespaces, lists Namespaces to expand
    # patterns): both cluster-scoped reads. Namespaces are exact DNS labels here, and the
    # InferenceService CRD exists before the operator starts (Helm installs crds/ first), so a
    # namespaced operator skips both and serves what discovery shows at start-up.
    settings.scanning.disabled = namespaced
    return settings


async def run_operator(
    settings: OperatorSettings,
    *,
    cluster: ListingCluster,
    stop_flag: threading.Event | asyncio.Event | None = None,
    ready_flag: threading.Event | asyncio.Event | None = None,
) -> None:
    """Run the operator until stopped: cluster-wide, or only in `settings.namespaces`."""
    context = Context(
        cluster=cluster,
        images=Images(tandem=settings.tandem_image, redis=settings.redis_image),
        metrics_namespaces=settings.metrics_namespaces,
    )
    await kopf.operator(
        registry=build_registry(resync_seconds=settings.resync_seconds),
        settings=kopf_settings(namespaced=bool(settings.namespaces)),
        memo=kopf.Memo(tandem=context),
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=True,
        liveness_endpoint=settings.liveness_endpoint,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
