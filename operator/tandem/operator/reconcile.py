"""One level-triggered, idempotent reconcile of an InferenceService: the thin apply layer.

Given the InferenceService as stored, it builds the desired children (pure builders), then for each:
create it if missing; if it exists but is controlled by someone else, leave it alone and report it;
otherwise patch only the fields that differ (`diff.update_patch`). Children that are no longer
desired (the managed Redis once an external URL is given) are deleted if they are ours. Finally it
derives the status from the Deployments as observed. Running it twice in a row changes nothing the
second time. It never raises for API errors: they end up in the outcome (status, events, `error`).

A spec that the CRD schema accepts but the model rejects (a cross-field rule) is reported with
Ready=False/InvalidSpec and a Warning event, and no child is created, patched or deleted. So is a spec
that names a Secret it may not use (`resources.secrets.refusal`: absent, or without the label
`tandem.dev/usable: "true"`), with Ready=False/SecretRefused.

Each declared LoRA adapter gets a state in `status.adapters` (`adapterstatus`), with the condition
`AdaptersReady`, a `ready/declared` count and an Event when its state changes. The adapters are
observed once per reconcile, before the children are built: the engine pods' sidecar reports give
both those states and the catalog's names that the gateway's `<name>-adapter-names` lists
(`adapter_catalog`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tandem.core.spec import InferenceService, InferenceServiceSpec
from tandem.core.specrules import SpecInvalid, cluster_adapter_rules, parse_inference_service
from tandem.operator import adapterstatus
from tandem.operator.cluster import Cluster, ClusterError
from tandem.operator.diff import update_patch
from tandem.operator.gateway_status import served_by_condition
from tandem.operator.objects import Child, ObjectRef
from tandem.operator.resources import Images, Owner, Role, desired_children, managed_refs
from tandem.operator.resources.engine import pool_spec
from tandem.operator.resources.lora import (
    ADAPTER_NAMES_SUFFIX,
    NAMES_CONFIGMAP_BYTES,
    extra_catalog_names,
    fit_catalog,
    live_catalog,
)
from tandem.operator.resources.meta import child_name
from tandem.operator.resources.multinode import LWS_API_VERSION, LWS_KIND
from tandem.operator.resources.secrets import USABLE_LABEL, named_secrets, new_secret, refusal
from tandem.operator.resources.services import router_endpoint, service_name
from tandem.operator.selection import serving_gateway
from tandem.operator.sidecars import ReportReader
from tandem.operator.status import (
    ConditionType,
    InferenceServiceStatus,
    Verdict,
    Workload,
    derive_status,
    invalid_status,
)

log = logging.getLogger("tandem.operator")

Verb = Literal["created", "patched", "deleted", "unchanged", "skipped"]
_WORKLOAD_ROLES: dict[ConditionType, Role] = {
    "PrefillReady": Role.PREFILL,
    "DecodeReady": Role.DECODE,
    "KVPoolReady": Role.KV_POOL,
    "RouterReady": Role.ROUTER,
}
#: Ready reasons that deserve a Warning event (once per distinct message).
WARNING_REASONS = ("InvalidSpec", "SecretRefused", "ApplyBlocked")


@dataclass(frozen=True)
class Action:
    """What happened to one child in this reconcile."""

    verb: Verb
    ref: ObjectRef
    detail: str = ""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the InferenceService."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Outcome:
    """Result of one reconcile: the status to write, what was done, events to post, and the API
    error that stopped it early (None when every request succeeded)."""

    status: InferenceServiceStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    error: ClusterError | None = None


def reconcile(
    body: Mapping[str, Any],
    *,
    cluster: Cluster,
    images: Images,
    now: str,
    metrics_namespaces: Sequence[str] = (),
    new_value: Callable[[], str] = new_secret,
    gateways: Sequence[Mapping[str, Any]] = (),
    read_report: ReportReader | None = None,
) -> Outcome:
    """Drive the children of the InferenceService `body` towards its spec and report its status.

    `now` (RFC 3339) stamps conditions that change; `images` are the Tandem and Redis images;
    `metrics_namespaces` and `new_value` as in `desired_children`; `gateways`: the InferenceGateways
    of its namespace, one of which may serve it (`tandem.operator.gateways.serving_gateway`): then it
    has no gateway of its own, and its status names the one serving it. `read_report` reads an
    engine pod's adapter-sidecar report (`tandem.operator.sidecars`; None: over HTTP).
    """
    meta = body["metadata"]
    generation = meta.get("generation")
    previous: Mapping[str, Any] = body.get("status") or {}
    try:
        isvc = _servable(body)
    except SpecInvalid as exc:
        errors = [str(e) for e in exc.errors]
        status = invalid_status(errors=errors, generation=generation, previous=previous, now=now)
        return Outcome(status=status, events=_warnings(previous, status))
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    gateway = serving_gateway(body, gateways)
    outcome = Outcome(status=InferenceServiceStatus())
    live: dict[ObjectRef, dict[str, Any]] = {}
    problems: list[str] = []
    seen = _AdaptersSeen()
    try:
        refused = refused_secrets(isvc.spec, namespace=owner.namespace, cluster=cluster)
        if refused:
            return _blocked(refused, generation=generation, previous=previous, now=now)
        catalog = _observe_adapters(isvc.spec, seen, owner=owner, cluster=cluster, read_report=read_report)
        children = desired_children(
            isvc.spec,
            owner=owner,
            images=images,
            metrics_namespaces=metrics_namespaces,
            new_value=new_value,
            gateway=gateway,
            adapter_catalog=catalog,
        )
        _apply_all(children, owner=owner, cluster=cluster, outcome=outcome, live=live)
    except ClusterError as exc:
        outcome.error = exc
        problems.append(str(exc))
    problems += [f"{a.ref} {a.detail}" for a in outcome.actions if a.verb == "skipped"]
    outcome.status = _observed_status(
        isvc.spec,
        owner=owner,
        live=live,
        problems=problems,
        generation=generation,
        previous=previous,
        now=now,
        gateway=gateway,
    )
    _report_adapters(
        isvc.spec,
        outcome,
        seen,
        owner=owner,
        cluster=cluster,
        read_report=read_report,
        previous=previous,
        now=now,
    )
    return outcome


def _servable(body: Mapping[str, Any]) -> InferenceService:
    """The InferenceService `body` parsed and checked against the rules a cluster adds (local adapter
    paths are for `tandem up` only); raises SpecInvalid with every problem found."""
    isvc = parse_inference_service(body)
    unservable = cluster_adapter_rules(isvc.spec)  # local adapter paths: for tandem up only
    if unservable:
        raise SpecInvalid(unservable)
    return isvc


@dataclass
class _AdaptersSeen:
    """What a reconcile has read of the adapters so far (None: not read yet): filled in as it goes, so
    that an API error midway keeps what was read and `_report_adapters` reads only what is missing."""

    observed: adapterstatus.Observed | None = None
    catalog: tuple[str, ...] | None = None
    left_out: list[str] = field(default_factory=list)


def _observe_adapters(
    spec: InferenceServiceSpec,
    seen: _AdaptersSeen,
    *,
    owner: Owner,
    cluster: Cluster,
    read_report: ReportReader | None,
) -> tuple[str, ...]:
    """Reads the adapters once (the sidecars over HTTP), for the gateway's adapter names and for the
    status, and returns the catalog's names that `<name>-adapter-names` can hold; records both in
    `seen` as they are read. Raises ClusterError."""
    seen.observed = adapterstatus.observe(spec, owner=owner, cluster=cluster, read_report=read_report)
    kept, seen.left_out = fit_catalog(
        spec, adapter_catalog(spec, seen.observed, owner=owner, cluster=cluster)
    )
    seen.catalog = tuple(kept)
    return seen.catalog


def _report_adapters(
    spec: InferenceServiceSpec,
    outcome: Outcome,
    seen: _AdaptersSeen,
    *,
    owner: Owner,
    cluster: Cluster,
    read_report: ReportReader | None,
    previous: Mapping[str, Any],
    now: str,
) -> None:
    """Adds the adapters' states to `outcome.status` and sets `outcome.events` (the Ready warnings, then
    the adapters' events); reads the adapters now if the apply stopped before it read them."""
    observed = seen.observed
    if observed is None:  # the Secrets could not be read: the adapters are observed all the same
        observed = adapterstatus.observe(spec, owner=owner, cluster=cluster, read_report=read_report)
    catalog = seen.catalog
    if catalog is None:  # not reached: the catalog's names as the sidecars report them, if any
        catalog = (adapterstatus.reported_catalog(observed) or ()) if spec.adapter_catalog else ()
    outcome.status, adapter_events = _with_adapters(
        spec,
        outcome.status,
        observed,
        owner=owner,
        previous=previous,
        now=now,
        catalog=catalog,
        left_out=seen.left_out,
    )
    outcome.events = _warnings(previous, outcome.status) + adapter_events


def _blocked(refused: list[str], *, generation: int | None, previous: Mapping[str, Any], now: str) -> Outcome:
    """Ready=False/SecretRefused, phase Blocked, for Secrets the spec may not use; nothing applied."""
    status = invalid_status(
        errors=refused,
        generation=generation,
        previous=previous,
        now=now,
        reason="SecretRefused",
        phase="Blocked",
    )
    return Outcome(status=status, events=_warnings(previous, status))


def adapter_catalog(
    spec: InferenceServiceSpec, observed: adapterstatus.Observed, *, owner: Owner, cluster: Cluster
) -> tuple[str, ...]:
    """The catalog's adapter names for `<name>-adapter-names`: () without LoRA or a catalog; else the
    union of the sidecars' reports (`adapterstatus.reported_catalog`) or, when no report could be
    read this pass (no engine pod yet, none answering), the names the live ConfigMap holds
    (`lora.live_catalog`), so that the gateway's list does not flap to empty. Raises ClusterError."""
    if spec.engine.lora is None or spec.adapter_catalog is None:
        return ()
    reported = adapterstatus.reported_catalog(observed)
    if reported is not None:
        return reported
    ref = ObjectRef("v1", "ConfigMap", owner.namespace, child_name(owner, ADAPTER_NAMES_SUFFIX))
    return live_catalog(cluster.get(ref))


def _with_adapters(
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    observed: adapterstatus.Observed,
    *,
    owner: Owner,
    previous: Mapping[str, Any],
    now: str,
    catalog: Sequence[str] = (),
    left_out: Sequence[str] = (),
) -> tuple[InferenceServiceStatus, list[Event]]:
    """`status` with each adapter's state as `observed`, their count (with the `catalog`'s names
    the gateway serves besides, when the spec has a catalog, and how many it does not because
    `<name>-adapter-names` cannot hold them: `left_out`) and `AdaptersReady` (`adapterstatus`), an
    Event per adapter that changed state, and a Warning when the names left out change."""
    adapters = adapterstatus.judge(spec, observed, owner=owner)
    conditions = adapterstatus.conditions_with(
        status.conditions,
        adapters,
        previous=previous.get("conditions") or [],
        generation=status.observed_generation,
        now=now,
    )
    update = {
        "conditions": conditions,
        "adapters": adapters or None,
        "adapter_summary": adapterstatus.summary(
            adapters,
            catalog=len(extra_catalog_names(spec, catalog)) if spec.adapter_catalog else None,
            left_out=len(left_out),
        ),
    }
    changes = [
        Event(e.type, e.reason, e.message)
        for e in adapterstatus.events(previous.get("adapters") or [], adapters)
    ]
    if left_out and previous.get("adapterSummary") != update["adapter_summary"]:
        changes.append(
            Event(
                "Warning",
                "AdapterNamesOverLimit",
                f"{len(left_out)} catalog adapters are not served ({left_out[0]!r} and after, by name): "
                f"ConfigMap {child_name(owner, ADAPTER_NAMES_SUFFIX)} holds at most "
                f"{NAMES_CONFIGMAP_BYTES:,} bytes of names",
            )
        )
    return status.model_copy(update=update), changes


def refused_secrets(spec: InferenceServiceSpec, *, namespace: str, cluster: Cluster) -> list[str]:
    """Why each Secret the spec names may not be used (empty: all may); raises ClusterError."""
    reasons = []
    for path, ref in named_secrets(spec):
        reason = refusal(path, ref, cluster.get(ObjectRef("v1", "Secret", namespace, ref.name)))
        if reason is not None:
            reasons.append(reason)
    cache = spec.adapter_cache
    if cache is not None and cache.credentials_secret is not None:
        # The fetch reads the keys it knows (each optional), so only existence and the label count.
        name, at = cache.credentials_secret, "spec.adapterCache.credentialsSecret"
        secret = cluster.get(ObjectRef("v1", "Secret", namespace, name))
        labels = ((secret or {}).get("metadata") or {}).get("labels") or {}
        if secret is None:
            reasons.append(f"{at}: Secret {name!r} does not exist")
        elif labels.get(USABLE_LABEL) != "true":
            reasons.append(f'{at}: Secret {name!r} lacks the label {USABLE_LABEL}: "true"')
    return reasons


def _apply_all(
    children: list[Child],
    *,
    owner: Owner,
    cluster: Cluster,
    outcome: Outcome,
    live: dict[ObjectRef, dict[str, Any]],
) -> None:
    for child in children:
        action, obj = apply_child(cluster, child, owner=owner)
        outcome.actions.append(action)
        if obj is not None and action.verb != "skipped":
            live[child.ref] = obj
    wanted = {child.ref for child in children}
    for ref in managed_refs(owner):
        if ref not in wanted:
            pruned = prune(cluster, ref, owner=owner)
            if pruned is not None:
                outcome.actions.append(pruned)


def apply_child(cluster: Cluster, child: Child, *, owner: Owner) -> tuple[Action, dict[str, Any] | None]:
    """Create `child` if missing, else patch the fields that differ; never touch a foreign object."""
    ref = child.ref
    current = cluster.get(ref)
    if current is None:
        log.info("creating %s", ref)
        return Action("created", ref), cluster.create(child.manifest)
    if not controlled_by(current, owner):
        detail = "exists and is not controlled by this InferenceService; left untouched"
        return Action("skipped", ref, detail), current
    patch = update_patch(current, child.manifest, create_only=child.create_only, owned=child.owned)
    if not patch:
        return Action("unchanged", ref), current
    log.info("patching %s: %s", ref, sorted(_paths(patch)))
    return Action("patched", ref, ", ".join(sorted(_paths(patch)))), cluster.patch(ref, patch)


def prune(cluster: Cluster, ref: ObjectRef, *, owner: Owner) -> Action | None:
    """Delete a no-longer-desired child if it exists and is ours; None when there is nothing to do."""
    current = cluster.get(ref)
    if current is None or not controlled_by(current, owner):
        return None
    log.info("deleting %s (no longer desired)", ref)
    cluster.delete(ref)
    return Action("deleted", ref)


def controlled_by(obj: Mapping[str, Any], owner: Owner) -> bool:
    """Whether `obj`'s controller owner reference is the InferenceService `owner` (by uid)."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == owner.uid and r.get("controller") for r in refs)


def _observed_status(
    spec: InferenceServiceSpec,
    *,
    owner: Owner,
    live: Mapping[ObjectRef, dict[str, Any]],
    problems: list[str],
    generation: int | None,
    previous: Mapping[str, Any],
    now: str,
    gateway: Owner | None = None,
) -> InferenceServiceStatus:
    workloads: dict[ConditionType, Workload | None] = {}
    names: dict[ConditionType, str] = {}
    for ctype, role in _WORKLOAD_ROLES.items():
        names[ctype] = service_name(owner, role)  # each Deployment is named as its Service
        if role is Role.KV_POOL and spec.kv_pool.redis.url is not None:
            workloads[ctype] = None
            continue
        ref = ObjectRef("apps/v1", "Deployment", owner.namespace, names[ctype])
        if role in (Role.PREFILL, Role.DECODE) and pool_spec(spec, role).multinode:
            ref = ObjectRef(LWS_API_VERSION, LWS_KIND, owner.namespace, names[ctype])
        workloads[ctype] = Workload.observe(live.get(ref))
    if gateway is None:
        return derive_status(
            workloads=workloads,
            names=names,
            problems=problems,
            endpoint=router_endpoint(owner),
            generation=generation,
            previous=previous,
            now=now,
        )
    endpoint = router_endpoint(gateway, Role.GATEWAY)
    served = Verdict("True", "ServedByGateway", f"InferenceGateway {gateway.name} routes its requests")
    status = derive_status(
        workloads=workloads,
        names=names,
        problems=problems,
        endpoint=endpoint,
        generation=generation,
        previous=previous,
        now=now,
        overrides={"RouterReady": served},
    )
    condition = served_by_condition(
        previous.get("conditions") or [],
        gateway=gateway.name,
        endpoint=endpoint,
        generation=generation,
        now=now,
    )
    return status.model_copy(update={"conditions": [*status.conditions, condition], "gateway": gateway.name})


def _warnings(previous: Mapping[str, Any], status: InferenceServiceStatus) -> list[Event]:
    """A Warning event when Ready turns to a warning reason or its message changes; posting it on
    every periodic reconcile would flood the namespace's events."""
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    if ready is None or ready.reason not in WARNING_REASONS:
        return []
    conditions: list[dict[str, Any]] = previous.get("conditions") or []
    before = next((c for c in conditions if c.get("type") == "Ready"), {})
    if before.get("reason") == ready.reason and before.get("message") == ready.message:
        return []
    return [Event("Warning", ready.reason, ready.message)]


def _paths(patch: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted leaf paths of a patch, for logs: {"spec": {"replicas": 2}} → ["spec.replicas"]."""
    paths: list[str] = []
    for key, value in patch.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            paths += _paths(value, f"{path}.")
        else:
            paths.append(path)
    return paths
