"""kopf wiring: one registry whose handlers all call the same level-triggered reconcile.

create, update and resume (operator start) run it at once; a timer runs it every `resync_seconds`
to repair drift and refresh the status from the children. Handlers only fetch, reconcile, write
the status and post events; everything they share (the API client, images, clock) comes from
kopf's `memo`, filled once by `run_operator`. No module-level state: the registry is built per call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from tandem.core.spec import GROUP, PLURAL, VERSION
from tandem.operator.cluster import Cluster
from tandem.operator.reconcile import reconcile
from tandem.operator.resources import Images
from tandem.operator.settings import OperatorSettings
from tandem.operator.status import as_patch

#: Retry delay after a transient API error (seconds).
RETRY_DELAY = 10.0


@dataclass(frozen=True)
class Context:
    """What every handler needs, shared by all objects (kopf copies the memo per object)."""

    cluster: Cluster
    images: Images
    metrics_namespaces: tuple[str, ...] = ()
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Credentials for kopf's own client, read now (not at import time): an explicit $KUBECONFIG
    first, else the pod's service account, else ~/.kube/config (the same order as `kube.connect`)."""
    if os.environ.get("KUBECONFIG"):
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def reconcile_handler(
    *, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Reconcile one InferenceService; one at a time per object (timer and events may overlap)."""
    context: Context = memo["tandem"]
    lock: threading.Lock = memo.setdefault("reconcile_lock", threading.Lock())
    with lock:
        now = context.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        outcome = reconcile(
            dict(body),
            cluster=context.cluster,
            images=context.images,
            now=now,
            metrics_namespaces=context.metrics_namespaces,
        )
    patch.status.update(as_patch(outcome.status, body.get("status") or {}))
    for event in outcome.events:
        # `body` may predate the status a concurrent handler just wrote; remember what this
        # process posted so that one problem makes one event.
        if memo.get("last_event") != event:
            memo["last_event"] = event
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    changes = [f"{a.verb} {a.ref}" for a in outcome.actions if a.verb != "unchanged"]
    if changes:
        logger.info("reconciled: %s", "; ".join(changes))
    error = outcome.error
    if error is not None and error.transient:
        raise kopf.TemporaryError(f"Kubernetes API: {error}", delay=RETRY_DELAY)
    if error is not None:
        # The timer tries again; the status and a Warning event already say what failed.
        raise kopf.PermanentError(f"Kubernetes API: {error}")


def build_registry(*, resync_seconds: float) -> kopf.OperatorRegistry:
    """A fresh registry with the login handler and the reconcile on every cause and a timer."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login)
    for on in (kopf.on.create, kopf.on.update, kopf.on.resume):
        on(GROUP, VERSION, PLURAL, registry=registry)(reconcile_handler)
    kopf.timer(
        GROUP, VERSION, PLURAL, registry=registry, interval=resync_seconds, initial_delay=resync_seconds
    )(reconcile_handler)
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
    cluster: Cluster,
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
