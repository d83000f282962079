"""One level-triggered reconcile of an InferenceGateway, and what an InferenceService reads of the
gateways of its namespace. The thin apply layer, as `tandem.operator.reconcile`.

**Membership.** A gateway serves the InferenceServices of its namespace that its selector selects, that
are valid and not being deleted. It refuses them all, changes no child, and says why (Ready=False, a
Warning Event on the gateway and on each service involved), when:

- two of them claim one served name, or an alias is a served name (`NamesConflict`, condition
  `NamesConflict`=True, `tandem.core.gateway.name_conflicts`);
- one of them is selected by an older gateway too (by creationTimestamp, then name): the older one
  keeps it, the later one is refused, as for a name (`NamesConflict`);
- an alias targets a service it does not serve (`AliasTargetNotServed`);
- it selects none (`NoServices`).

**Who serves a service.** The gateway's `status.services` lists what it serves; a service is served
by the gateway that lists it and whose selector still selects it (`serving_gateway`). So a service
drops its own gateway only once the InferenceGateway has taken it over, and gets it back as soon as
its labels no longer match, before the gateway has even reconciled.

**Who reconciles when.** Both kinds reconcile on their own events and timer. Each also tells the
other kind when the other's view of it is out of date (`gateways_to_touch`, `services_to_touch`):
the handlers then patch an annotation (`TOUCH_ANNOTATION`), which is an update to kopf, so the stale
object reconciles at once instead of at its next timer. Each touch names a view that the touched
object's reconcile corrects, so they stop as soon as both sides agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.core.gateway import (
    InferenceGatewaySpec,
    name_conflicts,
    parse_inference_gateway,
    served_names,
    service_names,
)
from tandem.core.specrules import SpecInvalid, parse_inference_service
from tandem.operator.cluster import Cluster, ClusterError
from tandem.operator.gateway_status import (
    GatewayConditionType,
    GatewayServiceStatus,
    InferenceGatewayStatus,
    gateway_conditions,
)
from tandem.operator.objects import ObjectRef
from tandem.operator.reconcile import Action, Event, apply_child, prune
from tandem.operator.resources import Images, Owner, Role
from tandem.operator.resources.gateway import Member, gateway_children, gateway_owner, gateway_refs
from tandem.operator.resources.secrets import new_secret, refusal
from tandem.operator.resources.services import router_endpoint, service_name
from tandem.operator.selection import age_of, is_ready, meta_of, selects, services_to_touch
from tandem.operator.status import Verdict, Workload, judge_workload

#: The annotation one kind patches on the other to have it reconcile now (module docstring); outside
#: the `tandem.dev/` prefix, whose annotations kopf keeps out of its diffs.
TOUCH_ANNOTATION = "sync.tandem.dev/changed"
#: Ready reasons that deserve a Warning event on the gateway (once per distinct message).
WARNING_REASONS = ("InvalidSpec", "SecretRefused", "ApplyBlocked", "NamesConflict", "AliasTargetNotServed")


@dataclass
class GatewayOutcome:
    """Result of one reconcile of a gateway: its status, what was done, Events for the gateway and
    for services (by name), the services whose view of the gateway is stale, the API error."""

    status: InferenceGatewayStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    service_events: list[tuple[str, Event]] = field(default_factory=list)
    touch: list[str] = field(default_factory=list)
    error: ClusterError | None = None


def reconcile_gateway(
    body: Mapping[str, Any],
    *,
    cluster: Cluster,
    services: Sequence[Mapping[str, Any]],
    gateways: Sequence[Mapping[str, Any]],
    images: Images,
    now: str,
    metrics_namespaces: Sequence[str] = (),
    new_value: Callable[[], str] = new_secret,
) -> GatewayOutcome:
    """Drive the InferenceGateway `body`'s children towards its spec and the `services` of its
    namespace, and report its status; `gateways`: every InferenceGateway of the namespace (itself
    included). Never raises for API errors: they end up in the outcome."""
    meta, previous = meta_of(body), body.get("status") or {}
    owner = gateway_owner(name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", ""))
    report = _Report(previous=previous, generation=meta.get("generation"), now=now)
    outcome = _decide(body, report, services=services, gateways=gateways)
    if isinstance(outcome, GatewayOutcome):
        outcome.touch = services_to_touch(owner.name, [s.name for s in outcome.status.services], services)
        return outcome
    spec, members, bodies = outcome
    return _apply(
        owner,
        spec,
        members,
        bodies,
        report=report,
        cluster=cluster,
        services=services,
        images=images,
        metrics_namespaces=metrics_namespaces,
        new_value=new_value,
    )


def _decide(
    body: Mapping[str, Any],
    report: _Report,
    *,
    services: Sequence[Mapping[str, Any]],
    gateways: Sequence[Mapping[str, Any]],
) -> GatewayOutcome | tuple[InferenceGatewaySpec, list[Member], dict[str, Mapping[str, Any]]]:
    """The spec and the members to serve, or the outcome of a refusal (module docstring)."""
    try:
        spec = parse_inference_gateway(body).spec
    except SpecInvalid as exc:
        return report.refused("InvalidSpec", "; ".join(str(e) for e in exc.errors))
    members, bodies = _members(body, services)
    still = {m.owner.name for m in members}
    refusal_ = _refusal(body, spec, members, bodies, gateways)
    if refusal_ is not None:
        return report.refused(*refusal_, still=still)
    served_models = {m.owner.name for m in members}
    missing = [
        f"alias {a.name!r} targets {t.service}, which this gateway does not serve"
        for a in spec.aliases
        for t in a.targets
        if t.service not in served_models
    ]
    if missing:
        return report.refused("AliasTargetNotServed", "; ".join(missing), still=still)
    if not members:
        return report.refused("NoServices", "the selector selects no valid InferenceService", still=still)
    return spec, members, bodies


def _apply(
    owner: Owner,
    spec: InferenceGatewaySpec,
    members: Sequence[Member],
    bodies: Mapping[str, Mapping[str, Any]],
    *,
    report: _Report,
    cluster: Cluster,
    services: Sequence[Mapping[str, Any]],
    images: Images,
    metrics_namespaces: Sequence[str],
    new_value: Callable[[], str],
) -> GatewayOutcome:
    """Apply the gateway's children for `members` and observe its status."""
    models_by_service = {m.owner.name: m.spec.model.public_name for m in members}
    outcome = GatewayOutcome(status=InferenceGatewayStatus())
    deployment: dict[str, Any] | None = None
    try:
        secret = spec.auth.api_keys_secret if spec.auth.enabled else None
        if secret is not None:
            reason = refusal(
                "spec.auth.apiKeysSecret",
                secret,
                cluster.get(ObjectRef("v1", "Secret", owner.namespace, secret.name)),
            )
            if reason is not None:
                return report.refused("SecretRefused", reason)
        children = gateway_children(
            owner, spec, members, images=images, metrics_namespaces=metrics_namespaces, new_value=new_value
        )
        for child in children:
            action, obj = apply_child(cluster, child, owner=owner)
            outcome.actions.append(action)
            if child.ref.kind == "Deployment" and action.verb != "skipped":
                deployment = obj
        wanted = {c.ref for c in children}
        outcome.actions += [
            a for r in gateway_refs(owner) if r not in wanted if (a := prune(cluster, r, owner=owner))
        ]
    except ClusterError as exc:
        outcome.error = exc
    skipped = [f"{a.ref} {a.detail}" for a in outcome.actions if a.verb == "skipped"]
    problems = [*skipped, *([str(outcome.error)] if outcome.error else [])]
    served = [
        GatewayServiceStatus(name=n, model=models_by_service[n], ready=is_ready(bodies[n]))
        for n in sorted(models_by_service)
    ]
    outcome.status = report.observed(owner, spec.aliases, served, deployment, problems)
    outcome.events = report.warnings(outcome.status)
    outcome.touch = services_to_touch(owner.name, [s.name for s in served], services)
    return outcome


def _members(
    gateway: Mapping[str, Any], services: Sequence[Mapping[str, Any]]
) -> tuple[list[Member], dict[str, Mapping[str, Any]]]:
    """The valid, live services the gateway selects, and their bodies by name."""
    members, bodies = [], {}
    for service in sorted(services, key=lambda s: str(meta_of(s).get("name"))):
        if not selects(gateway, service):
            continue
        try:
            isvc = parse_inference_service(service)
        except SpecInvalid:
            continue  # its own status says why; it is not served until it is valid
        meta = meta_of(service)
        owner = Owner(name=isvc.metadata.name, namespace=isvc.metadata.namespace, uid=meta.get("uid", ""))
        members.append(Member(owner=owner, spec=isvc.spec))
        bodies[owner.name] = service
    return members, bodies


def _refusal(
    gateway: Mapping[str, Any],
    spec: InferenceGatewaySpec,
    members: Sequence[Member],
    bodies: Mapping[str, Mapping[str, Any]],
    gateways: Sequence[Mapping[str, Any]],
) -> tuple[str, str, list[str]] | None:
    """(reason, message, services involved) when the members cannot be served together."""
    me = meta_of(gateway).get("name")
    lines: list[str] = []
    involved: set[str] = set()
    for member in members:
        older = [
            g
            for g in gateways
            if meta_of(g).get("name") != me
            and age_of(g) < age_of(gateway)
            and selects(g, bodies[member.owner.name])
        ]
        for other in older:
            lines.append(
                f"service {member.owner.name} is already served by InferenceGateway {meta_of(other)['name']}"
            )
            involved.add(member.owner.name)
    models = {m.owner.name: service_names(m.spec) for m in members}
    conflicts = name_conflicts(models, spec.aliases)
    if conflicts:
        lines += conflicts
        every = [n for names in models.values() for n in names]
        clashing = {n for n in every if every.count(n) > 1}
        clashing |= {a.name for a in spec.aliases if a.name in every}
        involved |= {s for s, names in models.items() if clashing.intersection(names)}
    return ("NamesConflict", "; ".join(lines), sorted(involved)) if lines else None


@dataclass(frozen=True)
class _Report:
    """Builds the gateway's status and events from what a reconcile found."""

    previous: Mapping[str, Any]
    generation: int | None
    now: str

    def status(
        self, verdicts: Mapping[GatewayConditionType, Verdict], **fields: Any
    ) -> InferenceGatewayStatus:
        conditions = gateway_conditions(
            self.previous.get("conditions") or [], verdicts, generation=self.generation, now=self.now
        )
        kept = {
            k: self.previous.get(k) for k in ("models", "modelNames", "services", "readyServices", "endpoint")
        }
        values = {k: v for k, v in kept.items() if v is not None} | fields
        return InferenceGatewayStatus.model_validate(
            {"observedGeneration": self.generation, "conditions": conditions, **values}
        )

    def refused(
        self, reason: str, message: str, involved: Sequence[str] = (), *, still: set[str] | None = None
    ) -> GatewayOutcome:
        """Nothing applied: Ready=False with `reason`; what is served stays as last reported, less the
        services no longer selected (`still`: those selected; None: unknown, an invalid spec), which
        have their own gateway back."""
        conflict = (
            Verdict("True", reason, message) if reason == "NamesConflict" else Verdict("False", "NoConflict")
        )
        status = self.status({"Ready": Verdict("False", reason, message), "NamesConflict": conflict})
        if still is not None:
            kept = [s for s in status.services if s.name in still]
            dropped = {s.model for s in status.services if s.name not in still}
            models = [m for m in status.models if m not in dropped]
            ready = f"{sum(s.ready for s in kept)}/{len(kept)}"
            update = {
                "services": kept,
                "models": models,
                "model_names": ", ".join(models),
                "ready_services": ready,
            }
            status = status.model_copy(update=update)
        events = self.warnings(status)
        per_service = [(name, Event("Warning", reason, message)) for name in involved] if events else []
        return GatewayOutcome(status=status, events=events, service_events=per_service)

    def observed(
        self,
        owner: Owner,
        aliases: Sequence[Any],
        served: Sequence[GatewayServiceStatus],
        deployment: Mapping[str, Any] | None,
        problems: Sequence[str],
    ) -> InferenceGatewayStatus:
        name = service_name(owner, Role.GATEWAY)
        verdict = judge_workload(Workload.observe(deployment), kind="Deployment", name=name)
        waiting = [s.name for s in served if not s.ready]
        if problems:
            ready = Verdict("False", "ApplyBlocked", "; ".join(problems))
        elif verdict.status != "True":
            ready = Verdict("False", "GatewayNotReady", verdict.message)
        elif waiting:
            ready = Verdict("False", "ServicesNotReady", f"not ready: {', '.join(waiting)}")
        else:
            ready = Verdict("True", "AllServicesReady", f"{len(served)} services ready")
        models = served_names({s.name: s.model for s in served}, aliases)
        return self.status(
            {"Ready": ready, "NamesConflict": Verdict("False", "NoConflict", "every name has one owner")},
            models=models,
            modelNames=", ".join(models),
            services=[s.model_dump(by_alias=True) for s in served],
            readyServices=f"{len(served) - len(waiting)}/{len(served)}",
            endpoint=router_endpoint(owner, Role.GATEWAY),
        )

    def warnings(self, status: InferenceGatewayStatus) -> list[Event]:
        """A Warning when Ready turns to a warning reason or its message changes (not every resync)."""
        ready = next((c for c in status.conditions if c.type == "Ready"), None)
        if ready is None or ready.reason not in WARNING_REASONS:
            return []
        conditions: list[dict[str, Any]] = self.previous.get("conditions") or []
        before = next((c for c in conditions if c.get("type") == "Ready"), {})
        if before.get("reason") == ready.reason and before.get("message") == ready.message:
            return []
        return [Event("Warning", ready.reason, ready.message)]
