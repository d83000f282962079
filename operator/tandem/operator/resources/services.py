"""Services: a headless one per engine pool, the KV pool's Redis, and the router (the endpoint).

The pool Services are headless (`clusterIP: None`): nothing load-balances through them; they exist
so that Kubernetes maintains EndpointSlices of the ready engine pods, which the router watches to
pick a prefill and a decode endpoint per request. Pure builders.
"""

from __future__ import annotations

from typing import Any

from tandem.operator.resources.meta import (
    ENGINE_PORT,
    METRICS_PORT,
    REDIS_PORT,
    ROUTER_PORT,
    Owner,
    Role,
    child_name,
    object_meta,
    selector_labels,
)
from tandem.operator.resources.multinode import WORKER_INDEX_LABEL

#: Name suffix of each Service (equal to its Deployment's).
SERVICE_SUFFIX = {
    Role.PREFILL: "prefill",
    Role.DECODE: "decode",
    Role.KV_POOL: "kv",
    Role.ROUTER: "router",
    Role.GATEWAY: "gateway",
}
_PORTS = {
    Role.PREFILL: ("http", ENGINE_PORT),
    Role.DECODE: ("http", ENGINE_PORT),
    Role.KV_POOL: ("redis", REDIS_PORT),
    Role.ROUTER: ("http", ROUTER_PORT),
    Role.GATEWAY: ("http", ROUTER_PORT),
}


def service_name(owner: Owner, role: Role) -> str:
    """Name of a role's Service, e.g. `demo-decode`."""
    return child_name(owner, SERVICE_SUFFIX[role])


def build_service(owner: Owner, *, role: Role, leaders_only: bool = False) -> dict[str, Any]:
    """The Service of one role: headless for the engine pools, ClusterIP for Redis and the router.
    `leaders_only`: a multi-node pool's, selecting the LeaderWorkerSet's leaders (worker index 0),
    the pods that serve HTTP, so that the gateway's EndpointSlices list only them."""
    port_name, port = _PORTS[role]
    selector = selector_labels(owner, role)
    if leaders_only:
        selector[WORKER_INDEX_LABEL] = "0"
    spec: dict[str, Any] = {
        "selector": selector,
        "ports": [{"name": port_name, "port": port, "targetPort": port_name, "protocol": "TCP"}],
    }
    if role in (Role.ROUTER, Role.GATEWAY):  # the diagnostics port: /metrics, for the metrics namespaces
        spec["ports"].append(
            {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}
        )
    if role in (Role.PREFILL, Role.DECODE):
        spec |= {"clusterIP": "None", "publishNotReadyAddresses": False}
    else:
        spec["type"] = "ClusterIP"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(owner, name=service_name(owner, role), role=role),
        "spec": spec,
    }


def build_disruption_budget(owner: Owner, *, role: Role, max_unavailable: int) -> dict[str, Any]:
    """PodDisruptionBudget `<name>-<role>`: voluntary disruptions (node drains, evictions) take down at
    most `max_unavailable` of the pool's pods at once (every pod of a multi-node group counts: losing
    one recreates its group)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(owner, name=service_name(owner, role), role=role),
        "spec": {
            "maxUnavailable": max_unavailable,
            "selector": {"matchLabels": selector_labels(owner, role)},
        },
    }


def router_endpoint(owner: Owner, role: Role = Role.ROUTER) -> str:
    """The in-cluster OpenAI base URL of the service, e.g. `http://demo-router.ns.svc:8080/v1` (of an
    InferenceGateway with `role` GATEWAY: `http://fleet-gateway.ns.svc:8080/v1`)."""
    return f"http://{service_name(owner, role)}.{owner.namespace}.svc:{ROUTER_PORT}/v1"
