"""Which InferenceGateway serves which InferenceService, read from the objects as stored. Pure.

A gateway's `status.services` lists what it serves; a service is served by the gateway that lists it
and whose selector still selects it (the oldest, should two). The `*_to_touch` functions name the
objects whose view of the other kind is stale (`tandem.operator.gateways`, "Who reconciles when").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from tandem.core.gateway import LabelSelector
from tandem.operator.resources.gateway import gateway_owner
from tandem.operator.resources.meta import Owner

#: A gateway's Ready reasons when it applies nothing (`tandem.operator.gateways`).
REFUSAL_REASONS = (
    "InvalidSpec",
    "SecretRefused",
    "NamesConflict",
    "AliasTargetNotServed",
    "NoServices",
)


def selector_of(gateway: Mapping[str, Any]) -> LabelSelector | None:
    """The gateway's selector as stored, None when it is not a valid one."""
    try:
        return LabelSelector.model_validate((gateway.get("spec") or {}).get("selector") or {})
    except ValidationError:
        return None


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def selects(gateway: Mapping[str, Any], service: Mapping[str, Any]) -> bool:
    selector = selector_of(gateway)
    live = not meta_of(gateway).get("deletionTimestamp") and not meta_of(service).get("deletionTimestamp")
    return live and selector is not None and selector.matches(meta_of(service).get("labels") or {})


def age_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    return (str(meta_of(obj).get("creationTimestamp", "")), str(meta_of(obj).get("name", "")))


def listed_services(gateway: Mapping[str, Any]) -> dict[str, bool]:
    """The services the gateway's status says it serves, with their readiness."""
    entries = (gateway.get("status") or {}).get("services") or []
    return {str(e.get("name")): bool(e.get("ready")) for e in entries if isinstance(e, Mapping)}


def is_ready(service: Mapping[str, Any]) -> bool:
    conditions = (service.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def serving_gateway(service: Mapping[str, Any], gateways: Sequence[Mapping[str, Any]]) -> Owner | None:
    """The InferenceGateway serving `service` (module docstring), None when none does."""
    name = meta_of(service).get("name")
    serving = [g for g in gateways if name in listed_services(g) and selects(g, service)]
    if not serving:
        return None
    meta = meta_of(min(serving, key=age_of))
    return gateway_owner(name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", ""))


def gateways_to_touch(
    service: Mapping[str, Any],
    gateways: Sequence[Mapping[str, Any]],
    *,
    ready: bool,
    deleted: bool = False,
    changed: bool = True,
) -> list[str]:
    """Gateways whose status is stale about `service` (now `ready`, or `deleted`): they select it
    and do not list it, list it and no longer select it, or list it with another readiness. A gateway
    that refuses what it selects (a conflict) reconciles again only when the service `changed` (not
    on its timer), since nothing else could lift the refusal."""
    stale = []
    name = str(meta_of(service).get("name"))
    for gateway in gateways:
        listed = listed_services(gateway)
        selected = not deleted and selects(gateway, service)
        if selected and name not in listed and not changed and refusing(gateway):
            continue
        if selected != (name in listed) or (selected and listed.get(name) != ready):
            stale.append(str(meta_of(gateway)["name"]))
    return stale


def refusing(gateway: Mapping[str, Any]) -> bool:
    """Whether the gateway's Ready says it refuses its services (a conflict, an invalid spec)."""
    conditions: list[dict[str, Any]] = (gateway.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), {})
    return ready.get("status") == "False" and ready.get("reason") in REFUSAL_REASONS


def services_to_touch(
    gateway: str, served: Sequence[str], services: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Services whose `status.gateway` disagrees with the gateway `gateway` now serving `served`."""
    stale = []
    for service in services:
        name = str(meta_of(service).get("name"))
        said = (service.get("status") or {}).get("gateway")
        if (name in served) != (said == gateway):
            stale.append(name)
    return stale
