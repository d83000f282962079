"""NetworkPolicies: only the documented paths into a service's pods are open. Pure builders.

One ingress policy per role, selecting that role's pods (`spec.networkPolicy.enabled`, on by default):

- into the gateway (`<name>-router`), port 8080: from every pod of the service's namespace, and
  pods of `spec.networkPolicy.clientNamespaces`; port 9090 (the diagnostics port, `/metrics`, behind
  a token with `router.metricsToken`): from pods of the operator's metrics namespaces only;
- into the prefill and decode engines (`<name>-prefill`, `<name>-decode`), port 8000: from the
  gateway's pods, and pods of the operator's metrics namespaces (for `/metrics`: `/v1/*` needs the
  engine key, which only the gateway holds);
- into the engines, port 8095 (the `adapters-sync` sidecar's report, with LoRA on): from pods of the
  metrics namespaces, where the operator runs (the chart always lists the release's namespace);
- into the engines, ports 5557 and 5558 (KV events and their replay, `router.prefixSource:
  precise` only): from the gateway's pods;
- into the managed Redis (`<name>-kv`), port 6379: from the gateway's and the engines' pods;
- into the engines of a multi-node pool (`nodesPerReplica` > 1), every port: from the same pool's
  pods (vLLM's data-parallel RPC, NCCL and the connector between a LeaderWorkerSet's leader and
  workers use ports chosen at run time).

A service that an InferenceGateway serves admits that gateway's pods wherever it admits its own
gateway's (engines, KV events, Redis); the InferenceGateway's own policy (`build_gateway_policy`) opens
its port 8080 as a service's gateway policy does.

A selected pod accepts nothing else, from anyone: NetworkPolicies are additive allow-lists, so a
pod that some policy selects for ingress refuses every connection no policy allows. Same-namespace
peers are named by their labels; other namespaces by `kubernetes.io/metadata.name`, which the API
server sets on every namespace and nobody can change. Egress is not restricted (the engines
download weights, the gateway calls the Kubernetes API). Kubelet probes come from the node, which
most network plugins always allow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.core.adaptersync import SYNC_PORT
from tandem.core.kvevents import KV_EVENTS_PORT, KV_EVENTS_REPLAY_PORT
from tandem.core.spec import InferenceServiceSpec
from tandem.operator.resources.meta import (
    ENGINE_PORT,
    METRICS_PORT,
    REDIS_PORT,
    ROUTER_PORT,
    Owner,
    Role,
    object_meta,
    selector_labels,
)
from tandem.operator.resources.services import service_name

#: The label the API server puts on every namespace, holding its name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
ENGINE_ROLES = (Role.PREFILL, Role.DECODE)


def policy_name(owner: Owner, role: Role) -> str:
    """A role's NetworkPolicy is named as its Service and Deployment, e.g. `demo-decode`."""
    return service_name(owner, role)


def _ports(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _namespaces(names: Sequence[str]) -> list[dict[str, Any]]:
    return [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}} for name in names]


def _pods(owner: Owner, *roles: Role) -> list[dict[str, Any]]:
    return [{"podSelector": {"matchLabels": selector_labels(owner, role)}} for role in roles]


def _gateways(owner: Owner, gateway: Owner | None) -> list[dict[str, Any]]:
    """The service's own gateway pods, and those of the InferenceGateway serving it, if any."""
    return [*_pods(owner, Role.ROUTER), *(_pods(gateway, Role.GATEWAY) if gateway is not None else [])]


def client_rules(client_namespaces: Sequence[str], metrics_namespaces: Sequence[str]) -> list[dict[str, Any]]:
    """Into a gateway's client port: every pod of its namespace, and pods of the client namespaces;
    into its diagnostics port: pods of the metrics namespaces only (none listed: nobody)."""
    clients = [{"podSelector": {}}, *_namespaces(client_namespaces)]
    rules = [{"from": clients, "ports": _ports(ROUTER_PORT)}]
    if metrics_namespaces:
        rules.append({"from": _namespaces(metrics_namespaces), "ports": _ports(METRICS_PORT)})
    return rules


def ingress_rules(
    spec: InferenceServiceSpec,
    owner: Owner,
    role: Role,
    *,
    metrics_namespaces: Sequence[str] = (),
    gateway: Owner | None = None,
) -> list[dict[str, Any]]:
    """The ingress rules into `role`'s pods (module docstring's table); `gateway`: the
    InferenceGateway serving the service."""
    if role is Role.ROUTER:
        return client_rules(spec.network_policy.client_namespaces, metrics_namespaces)
    gateways = _gateways(owner, gateway)
    if role is Role.KV_POOL:
        return [{"from": [*gateways, *_pods(owner, *ENGINE_ROLES)], "ports": _ports(REDIS_PORT)}]
    rules = [{"from": [*gateways, *_namespaces(metrics_namespaces)], "ports": _ports(ENGINE_PORT)}]
    if spec.engine.lora is not None and metrics_namespaces:
        rules.append({"from": _namespaces(metrics_namespaces), "ports": _ports(SYNC_PORT)})
    if spec.router.prefix_source == "precise":
        rules.append({"from": gateways, "ports": _ports(KV_EVENTS_PORT, KV_EVENTS_REPLAY_PORT)})
    pool = spec.prefill if role is Role.PREFILL else spec.decode
    if pool.multinode:
        rules.append({"from": _pods(owner, role)})
    return rules


def _policy(owner: Owner, role: Role, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(owner, name=policy_name(owner, role), role=role),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(owner, role)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def build_network_policy(
    spec: InferenceServiceSpec,
    *,
    owner: Owner,
    role: Role,
    metrics_namespaces: Sequence[str] = (),
    gateway: Owner | None = None,
) -> dict[str, Any]:
    """The ingress NetworkPolicy of one role's pods."""
    rules = ingress_rules(spec, owner, role, metrics_namespaces=metrics_namespaces, gateway=gateway)
    return _policy(owner, role, rules)


def build_network_policies(
    spec: InferenceServiceSpec,
    *,
    owner: Owner,
    metrics_namespaces: Sequence[str] = (),
    gateway: Owner | None = None,
) -> list[dict[str, Any]]:
    """Every NetworkPolicy of the service: none when `spec.networkPolicy.enabled` is off; the KV
    pool's only for the managed Redis; `gateway` as in `ingress_rules`."""
    if not spec.network_policy.enabled:
        return []
    roles = [Role.ROUTER, *ENGINE_ROLES]
    if spec.kv_pool.redis.url is None:
        roles.append(Role.KV_POOL)
    return [
        build_network_policy(
            spec, owner=owner, role=role, metrics_namespaces=metrics_namespaces, gateway=gateway
        )
        for role in roles
    ]


def build_gateway_policy(
    owner: Owner, *, client_namespaces: Sequence[str], metrics_namespaces: Sequence[str] = ()
) -> dict[str, Any]:
    """The ingress NetworkPolicy of an InferenceGateway's pods (`<name>-gateway`), port 8080."""
    return _policy(owner, Role.GATEWAY, client_rules(client_namespaces, metrics_namespaces))
