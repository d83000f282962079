"""Pure builders: an InferenceService spec in, the manifests of its children out.

`desired_children` is the whole desired state of one InferenceService; `managed_refs` names every
object the operator could ever create for it (so that objects no longer desired, such as the
managed Redis after switching to an external URL, can be found and removed). The builders see the
spec with the generated Secrets filled in (`secrets.with_generated_secrets`): the pool's password and
the engines' API key always name a Secret; the cache keys are always the generated `<name>-cache-keys`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from tandem.core.spec import InferenceServiceSpec
from tandem.operator.objects import Child, FieldPath, ObjectRef
from tandem.operator.resources.engine import build_engine_deployment, pool_spec
from tandem.operator.resources.kvpool import (
    KV_SUFFIX,
    LMCACHE_SUFFIX,
    build_lmcache_configmap,
    build_redis_deployment,
    uses_lmcache,
)
from tandem.operator.resources.meta import Images, Owner, Role, child_name
from tandem.operator.resources.netpol import build_network_policies, policy_name
from tandem.operator.resources.router import (
    ROUTER_SUFFIX,
    build_router_configmap,
    build_router_deployment,
    build_router_role,
    build_router_role_binding,
    build_router_service_account,
)
from tandem.operator.resources.secrets import (
    CACHE_KEYS_SUFFIX,
    ENGINE_KEY_SUFFIX,
    KV_AUTH_SUFFIX,
    METRICS_TOKEN_SUFFIX,
    new_secret,
    secret_children,
    with_generated_secrets,
)
from tandem.operator.resources.services import build_service

__all__ = ["Images", "Owner", "Role", "desired_children", "managed_refs"]

REPLICAS: FieldPath = ("spec", "replicas")
#: An engine pod's init containers (the LMCache check): removed when a spec no longer needs them.
INIT_CONTAINERS: FieldPath = ("spec", "template", "spec", "initContainers")


def desired_children(
    spec: InferenceServiceSpec,
    *,
    owner: Owner,
    images: Images,
    metrics_namespaces: Sequence[str] = (),
    new_value: Callable[[], str] = new_secret,
    gateway: Owner | None = None,
) -> list[Child]:
    """Every child the spec asks for, in a creation order where dependencies come first
    (Secrets and NetworkPolicies, configuration and identity, then the KV pool, then Services, then
    the workloads). `metrics_namespaces`: namespaces whose pods may scrape the engines and gateways
    (the autoscaler's, Prometheus'); `new_value` draws a generated Secret's value (used only when
    the Secret is created). `gateway`: the InferenceGateway serving the service, if one does: then
    the service has no gateway Deployment and Service of its own, and its NetworkPolicies admit that
    gateway's pods (its router ConfigMap, identity and policy stay, so that it comes back at once)."""
    children: list[Child] = secret_children(spec, owner, new_value=new_value)
    spec = with_generated_secrets(spec, owner)
    policies = build_network_policies(
        spec, owner=owner, metrics_namespaces=metrics_namespaces, gateway=gateway
    )
    children += [Child(policy) for policy in policies]
    lmcache = build_lmcache_configmap(spec, owner=owner) if uses_lmcache(spec) else None
    if lmcache is not None:
        children.append(Child(lmcache))
    router_config = build_router_configmap(spec, owner=owner)
    children += [
        Child(router_config),
        Child(build_router_service_account(owner)),
        Child(build_router_role(owner)),
        Child(build_router_role_binding(owner)),
    ]
    if spec.kv_pool.redis.url is None:
        children += [
            Child(build_redis_deployment(spec, owner=owner, images=images)),
            Child(build_service(owner, role=Role.KV_POOL)),
        ]
    for role in (Role.PREFILL, Role.DECODE):
        children.append(Child(build_service(owner, role=role)))
        deployment = build_engine_deployment(spec, owner=owner, role=role, images=images, lmcache=lmcache)
        # With autoscaling on, the autoscaler owns the replica count after creation.
        autoscaled = pool_spec(spec, role).autoscaling.enabled
        children.append(
            Child(deployment, create_only=(REPLICAS,) if autoscaled else (), owned=(INIT_CONTAINERS,))
        )
    if gateway is None:
        children += [
            Child(build_service(owner, role=Role.ROUTER)),
            Child(build_router_deployment(spec, owner=owner, images=images, config=router_config)),
        ]
    # Builders may share sub-dicts (labels, probes): give every manifest a tree of its own. A JSON
    # round trip is several times faster than deepcopy and proves the manifests are plain JSON.
    return [Child(json.loads(json.dumps(c.manifest)), c.create_only, c.owned) for c in children]


def managed_refs(owner: Owner) -> list[ObjectRef]:
    """Every object this operator may create for the InferenceService `owner`."""
    ns = owner.namespace
    config_maps = [child_name(owner, LMCACHE_SUFFIX), child_name(owner, ROUTER_SUFFIX)]
    workloads = [child_name(owner, s) for s in (KV_SUFFIX, "prefill", "decode", ROUTER_SUFFIX)]
    router = child_name(owner, ROUTER_SUFFIX)
    rbac = "rbac.authorization.k8s.io/v1"
    secrets = [
        child_name(owner, s)
        for s in (KV_AUTH_SUFFIX, ENGINE_KEY_SUFFIX, CACHE_KEYS_SUFFIX, METRICS_TOKEN_SUFFIX)
    ]
    policies = [policy_name(owner, role) for role in (Role.ROUTER, Role.PREFILL, Role.DECODE, Role.KV_POOL)]
    return [
        *(ObjectRef("v1", "Secret", ns, name) for name in secrets),
        *(ObjectRef("networking.k8s.io/v1", "NetworkPolicy", ns, name) for name in policies),
        *(ObjectRef("v1", "ConfigMap", ns, name) for name in config_maps),
        ObjectRef("v1", "ServiceAccount", ns, router),
        ObjectRef(rbac, "Role", ns, router),
        ObjectRef(rbac, "RoleBinding", ns, router),
        *(ObjectRef("v1", "Service", ns, name) for name in workloads),
        *(ObjectRef("apps/v1", "Deployment", ns, name) for name in workloads),
    ]
