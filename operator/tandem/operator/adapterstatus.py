"""Per-adapter status: each adapter of `spec.adapters` judged Ready, Pending or Failed from what the
operator can see, the `AdaptersReady` condition over them, and an Event on each adapter's transition.

What is judged, by source:

- `pvc://claim/path`: the claim. Absent or `Lost`: Failed; `Bound`: Ready (the engines mount it; that
  the path in it holds an adapter is not checked here); otherwise Pending.
- `hf://` and `s3://`: the report of each running engine pod's `adapters-sync` sidecar
  (`tandem adapters sync`, `GET /adapters` on its port `adapter-sync`), read over HTTP
  (`tandem.operator.sidecars`); an entry counts only when its source is the declared one (a pod
  still acting on an older list does not). Ready once one pod has it installed; Failed when one
  names it failed (and none has it); Pending while no running pod lists it yet (the kubelet updates
  the mounted list within about a minute) or is still installing it.

A claim, the pods or a sidecar that cannot be read (an API error, missing RBAC, a pod not answering)
leave the adapters Pending with that reason; the reconcile goes on. Catalog adapters get no state
here: the operator cannot read the catalog itself, but each sidecar's report lists the catalog's names
it found, and `reported_catalog` joins them for the gateway's list of names
(`resources.lora.build_adapter_names_configmap`). Pure apart from `observe`, which reads through the
`Cluster` protocol and the sidecars' `ReportReader`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tandem.core.adapters import (
    MAX_CATALOG_ENTRIES,
    HfSource,
    PvcSource,
    S3Source,
    name_problem,
    parse_source,
)
from tandem.core.spec import InferenceServiceSpec
from tandem.operator.cluster import Cluster, ClusterError
from tandem.operator.objects import ObjectRef
from tandem.operator.resources.meta import Owner, Role, selector_labels
from tandem.operator.sidecars import ReportReader, read_reports
from tandem.operator.status import AdapterStatus, Condition, Verdict, merge_typed

State = Literal["Ready", "Pending", "Failed"]
#: Longest reason kept per adapter (a termination message is at most 4096 bytes for all of them).
MAX_REASON = 512


@dataclass(frozen=True)
class Observed:
    """What the operator read for the adapters: the engine pods (None: not read, with `pods_error`)
    and each claim a `pvc://` adapter names (None: it does not exist; absent: not read)."""

    pods: Sequence[Mapping[str, Any]] | None = ()
    pods_error: str = ""
    #: Each running engine pod's sidecar report by pod name, or why it could not be read.
    reports: Mapping[str, Mapping[str, Any] | str] = field(default_factory=dict)
    claims: Mapping[str, Mapping[str, Any] | None] | None = None
    claims_error: str = ""


@dataclass(frozen=True)
class AdapterEvent:
    """An Event to post on the InferenceService for one adapter's transition."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def observe(
    spec: InferenceServiceSpec,
    *,
    owner: Owner,
    cluster: Cluster,
    read_report: ReportReader | None = None,
) -> Observed:
    """Read what `judge` and `reported_catalog` need: the claims of `pvc://` adapters (by name)
    and, with `hf://` or `s3://` adapters or a catalog, the namespace's pods (only when `cluster`
    can list) and the sidecar reports of this service's running engine pods (`read_report`, default
    over HTTP; each pod once)."""
    sources = [parse_source(a.source) for a in spec.adapters]
    claims: dict[str, Mapping[str, Any] | None] = {}
    claims_error = ""
    for source in sources:
        if isinstance(source, PvcSource) and source.claim not in claims:
            ref = ObjectRef("v1", "PersistentVolumeClaim", owner.namespace, source.claim)
            try:
                claims[source.claim] = cluster.get(ref)
            except ClusterError as exc:
                claims_error = f"cannot read PersistentVolumeClaim {source.claim}: {exc}"
                break
    remote = any(isinstance(s, HfSource | S3Source) for s in sources)
    if not remote and spec.adapter_catalog is None:
        return Observed(claims=None if claims_error else claims, claims_error=claims_error)
    # The handlers' cluster lists; a Cluster that cannot (tests' in-memory ones) leaves them Pending.
    lister: Callable[[str, str, str], list[dict[str, Any]]] | None = getattr(cluster, "list", None)
    if lister is None:
        pods: list[dict[str, Any]] | None = None
        pods_error = "the engine pods cannot be listed here"
    else:
        try:
            pods, pods_error = lister("v1", "Pod", owner.namespace), ""
        except ClusterError as exc:
            pods, pods_error = None, f"cannot list the engine pods: {exc}"
    reports = read_reports(_engine_pods(pods, owner), read=read_report) if pods is not None else {}
    return Observed(
        pods=pods,
        pods_error=pods_error,
        reports=reports,
        claims=None if claims_error else claims,
        claims_error=claims_error,
    )


def reported_catalog(observed: Observed) -> tuple[str, ...] | None:
    """The catalog's adapter names the engine pods' sidecars report (each report's `catalog`):
    their union, sorted, without what cannot name an adapter, at most `MAX_CATALOG_ENTRIES` (the
    first in order). None when no report with a `catalog` list could be read (no pod running yet,
    none answering, a sidecar that has not scanned its catalog yet (`catalog: null`), an older
    sidecar): the caller then keeps the names it had, so that the list does not flap to empty.

    >>> reported_catalog(Observed(reports={"d-1": {"catalog": ["b", "a"]}, "d-2": {"catalog": ["c"]}}))
    ('a', 'b', 'c')
    >>> reported_catalog(Observed(reports={"d-1": "timed out"})) is None
    True
    """
    lists = [
        report["catalog"]
        for report in observed.reports.values()
        if isinstance(report, Mapping) and isinstance(report.get("catalog"), list)
    ]
    if not lists:
        return None
    names = {n for found in lists for n in found if isinstance(n, str) and name_problem(n) is None}
    return tuple(sorted(names)[:MAX_CATALOG_ENTRIES])


def judge(spec: InferenceServiceSpec, observed: Observed, *, owner: Owner) -> list[AdapterStatus]:
    """Each declared adapter's state and reason, in spec order (module docstring)."""
    engine_pods = _engine_pods(observed.pods or [], owner)
    out = []
    for adapter in spec.adapters:
        source = parse_source(adapter.source)
        if isinstance(source, PvcSource):
            state, reason = _claim_state(source.claim, observed)
        elif isinstance(source, HfSource | S3Source):
            if observed.pods is None:
                state, reason = "Pending", observed.pods_error
            else:
                state, reason = _sync_state(adapter.name, adapter.source, engine_pods, observed.reports)
        else:  # a local path: refused for a cluster before this runs
            state, reason = "Failed", "a local path works with tandem up only"
        out.append(
            AdapterStatus(name=adapter.name, source=adapter.source, state=state, reason=reason[:MAX_REASON])
        )
    return out


def _engine_pods(pods: Sequence[Mapping[str, Any]], owner: Owner) -> list[Mapping[str, Any]]:
    """The pods of this service's engine pools that are not being deleted."""
    selectors = [selector_labels(owner, role) for role in (Role.PREFILL, Role.DECODE)]
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        pod_labels = meta.get("labels") or {}
        if meta.get("deletionTimestamp") is None and any(
            all(pod_labels.get(k) == v for k, v in selector.items()) for selector in selectors
        ):
            out.append(pod)
    return out


def _claim_state(claim: str, observed: Observed) -> tuple[State, str]:
    if observed.claims is None or claim not in observed.claims:
        return "Pending", observed.claims_error or f"PersistentVolumeClaim {claim} not read yet"
    found = observed.claims[claim]
    if found is None:
        return "Failed", f"PersistentVolumeClaim {claim} does not exist"
    phase = (found.get("status") or {}).get("phase", "Pending")
    if phase == "Bound":
        return "Ready", f"PersistentVolumeClaim {claim} is Bound"
    if phase == "Lost":
        return "Failed", f"PersistentVolumeClaim {claim} is Lost (its volume is gone)"
    return "Pending", f"PersistentVolumeClaim {claim} is {phase}"


def _sync_state(
    name: str, source: str, pods: Sequence[Mapping[str, Any]], reports: Mapping[str, Mapping[str, Any] | str]
) -> tuple[State, str]:
    """The state of one remote adapter from the engine pods' sidecar reports (module docstring)."""
    if not pods:
        return "Pending", "no engine pod is running yet"
    ready, failures, installing, unread = 0, [], 0, []
    for pod in pods:
        report = reports.get(str((pod.get("metadata") or {}).get("name")))
        if report is None:
            continue
        if isinstance(report, str):
            unread.append(report)
            continue
        entry = (report.get("adapters") or {}).get(name)
        if not isinstance(entry, Mapping) or entry.get("source") != source:
            continue
        if entry.get("state") == "Ready":
            ready += 1
        elif entry.get("state") == "Failed":
            failures.append(str(entry.get("reason") or "failed"))
        else:
            installing += 1
    if ready:
        return "Ready", f"installed on {ready}/{len(pods)} engine pods"
    if failures:
        return "Failed", failures[0]
    if installing:
        return "Pending", f"being installed on {installing} engine pods"
    if unread:
        return "Pending", f"cannot read the adapters-sync report of {len(unread)} engine pods: {unread[0]}"
    return "Pending", "no engine pod's sidecar lists it yet (the kubelet updates their list within a minute)"


def condition(adapters: Sequence[AdapterStatus]) -> Verdict:
    """`AdaptersReady` over the declared adapters: True when every one is Ready."""
    ready = sum(a.state == "Ready" for a in adapters)
    failed = [a for a in adapters if a.state == "Failed"]
    if failed:
        names = ", ".join(a.name for a in failed)
        return Verdict("False", "AdaptersFailed", f"{ready}/{len(adapters)} ready; failed: {names}")
    if ready < len(adapters):
        pending = ", ".join(a.name for a in adapters if a.state != "Ready")
        return Verdict("False", "AdaptersPending", f"{ready}/{len(adapters)} ready; pending: {pending}")
    return Verdict("True", "AdaptersReady", f"{ready}/{len(adapters)} ready")


def conditions_with(
    conditions: Sequence[Condition],
    adapters: Sequence[AdapterStatus],
    *,
    previous: Sequence[Mapping[str, Any]],
    generation: int | None,
    now: str,
) -> list[Condition]:
    """`conditions` with `AdaptersReady` appended (or without it when no adapter is declared)."""
    kept = [c for c in conditions if c.type != "AdaptersReady"]
    if not adapters:
        return kept
    verdict = {"AdaptersReady": condition(adapters)}
    return kept + merge_typed(
        Condition, ("AdaptersReady",), previous, verdict, generation=generation, now=now
    )


def summary(
    adapters: Sequence[AdapterStatus], *, catalog: int | None = None, left_out: int = 0
) -> str | None:
    """`ready/declared` for `kubectl get`, and with a catalog (`catalog`: how many of its adapters the
    gateway serves besides the declared ones) `+N catalog`, with `(M not served)` when the gateway's
    names ConfigMap could not hold `left_out` more; None without either.

    >>> summary([], catalog=480), summary([], catalog=None), summary([], catalog=3787, left_out=1213)
    ('480 catalog', None, '3787 catalog (1213 not served)')
    """
    parts = []
    if adapters:
        parts.append(f"{sum(a.state == 'Ready' for a in adapters)}/{len(adapters)}")
    if catalog is not None:
        parts.append(f"{'+' if parts else ''}{catalog} catalog")
        if left_out:
            parts.append(f"({left_out} not served)")
    return " ".join(parts) or None


def events(previous: Sequence[Mapping[str, Any]], adapters: Sequence[AdapterStatus]) -> list[AdapterEvent]:
    """One Event per adapter whose state (or, when Failed, reason) changed since `previous` (the
    status as last written), and one per adapter no longer declared."""
    before = {str(a.get("name")): a for a in previous if isinstance(a, Mapping)}
    out: list[AdapterEvent] = []
    for adapter in adapters:
        old = before.pop(adapter.name, None)
        if old is not None and _unchanged(old, adapter):
            continue
        text = f"adapter {adapter.name!r} ({adapter.source}) is {adapter.state}"
        text += f": {adapter.reason}" if adapter.reason else ""
        kind: Literal["Normal", "Warning"] = "Warning" if adapter.state == "Failed" else "Normal"
        out.append(AdapterEvent(kind, f"Adapter{adapter.state}", text))
    for name, old in sorted(before.items()):
        out.append(
            AdapterEvent("Normal", "AdapterRemoved", f"adapter {name!r} ({old.get('source')}) removed")
        )
    return out


def _unchanged(old: Mapping[str, Any], adapter: AdapterStatus) -> bool:
    """Same state and source (and, when Failed, the same reason): no Event."""
    same = old.get("state") == adapter.state and old.get("source") == adapter.source
    return same and (adapter.state != "Failed" or old.get("reason") == adapter.reason)
