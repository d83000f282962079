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
from tandem.operator.resources.engine import build_engine_workload, pool_spec
from tandem.operator.resources.kvpool import (
    KV_SUFFIX,
    LMCACHE_SUFFIX,
    build_lmcache_configmap,
    build_redis_deployment,
    uses_lmcache,
)
from tandem.operator.resources.lora import (
    ADAPTER_NAMES_SUFFIX,
    ADAPTERS_SUFFIX,
    build_adapter_names_configmap,
    build_adapters_configmap,
)
from tandem.operator.resources.meta import Images, Owner, Role, child_name
from tandem.operator.resources.multinode import LWS_API_VERSION, LWS_KIND
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
from tandem.operator.resources.services import build_disruption_budget, build_service

__all__ = ["Images", "Owner", "Role", "desired_children", "managed_refs"]

REPLICAS: FieldPath = ("spec", "replicas")
#: A pool Service's selector: the leaders' label comes and goes with `nodesPerReplica`.
SELECTOR: FieldPath = ("spec", "selector")
#: Where a Deployment's and a LeaderWorkerSet's pod templates are.
POD: FieldPath = ("spec", "template")
GROUP_PODS: tuple[FieldPath, ...] = (
    ("spec", "leaderWorkerTemplate", "leaderTemplate"),
    ("spec", "leaderWorkerTemplate", "workerTemplate"),
)
#: What a user's pod template may set and later take back, so that the operator owns it whole: the
#: pods' labels (keys dropped), placement and pull secrets (removed). Not schedulerName and
#: serviceAccountName, which the API server may default in templates (removing them from a
#: template leaves the live value), nor annotations (`kubectl rollout restart` writes one).
TEMPLATE_OWNED: tuple[FieldPath, ...] = (
    ("metadata", "labels"),
    ("spec", "nodeSelector"),
    ("spec", "tolerations"),
    ("spec", "affinity"),
    ("spec", "topologySpreadConstraints"),
    ("spec", "priorityClassName"),
    ("spec", "runtimeClassName"),
    ("spec", "imagePullSecrets"),
    ("spec", "initContainers"),
)


def pod_owned(*pods: FieldPath) -> tuple[FieldPath, ...]:
    """The fields the operator owns whole in the pod templates at `pods` (`TEMPLATE_OWNED`)."""
    return tuple((*pod, *field) for pod in pods for field in TEMPLATE_OWNED)


def desired_children(
    spec: InferenceServiceSpec,
    *,
    owner: Owner,
    images: Images,
    metrics_namespaces: Sequence[str] = (),
    new_value: Callable[[], str] = new_secret,
    gateway: Owner | None = None,
    adapter_catalog: Sequence[str] = (),
) -> list[Child]:
    """Every child the spec asks for, in a creation order where dependencies come first
    (Secrets and NetworkPolicies, configuration and identity, then the KV pool, then Services, then
    the workloads). `metrics_namespaces`: namespaces whose pods may scrape the engines and gateways
    (the autoscaler's, Prometheus'); `new_value` draws a generated Secret's value (used only when
    the Secret is created). `gateway`: the InferenceGateway serving the service, if one does: then
    the service has no gateway Deployment and Service of its own, and its NetworkPolicies admit that
    gateway's pods (its router ConfigMap, identity and policy stay, so that it comes back at once).
    `adapter_catalog`: the catalog's adapter names the engine pods report (with LoRA on, written to
    `<name>-adapter-names` after the declared ones: `lora.build_adapter_names_configmap`)."""
    children: list[Child] = secret_children(spec, owner, new_value=new_value)
    spec = with_generated_secrets(spec, owner)
    policies = build_network_policies(
        spec, owner=owner, metrics_namespaces=metrics_namespaces, gateway=gateway
    )
    children += [Child(policy) for policy in policies]
    lmcache = build_lmcache_configmap(spec, owner=owner) if uses_lmcache(spec) else None
    if lmcache is not None:
        children.append(Child(lmcache))
    adapter_list = build_adapters_configmap(spec, owner=owner)
    if adapter_list is not None:
        children.append(Child(adapter_list))
    # Before the gateway Deployment, which mounts it (whether or not that gateway is this service's).
    adapter_names = build_adapter_names_configmap(spec, owner=owner, catalog=adapter_catalog)
    if adapter_names is not None:
        children.append(Child(adapter_names))
    router_config = build_router_configmap(spec, owner=owner)
    children += [
        Child(router_config),
        Child(build_router_service_account(owner)),
        Child(build_router_role(owner)),
        Child(build_router_role_binding(owner)),
    ]
    if spec.kv_pool.redis.url is None:
        children += [
            Child(build_redis_deployment(spec, owner=owner, images=images), owned=pod_owned(POD)),
            Child(build_service(owner, role=Role.KV_POOL)),
        ]
    for role in (Role.PREFILL, Role.DECODE):
        pool = pool_spec(spec, role)
        service = build_service(owner, role=role, leaders_only=pool.multinode)
        children.append(Child(service, owned=(SELECTOR,)))
        children.append(
            Child(build_disruption_budget(owner, role=role, max_unavailable=pool.max_unavailable))
        )
        workload = build_engine_workload(spec, owner=owner, role=role, images=images, lmcache=lmcache)
        # With autoscaling on, the autoscaler owns the replica count after creation.
        owned = pod_owned(*GROUP_PODS) if pool.multinode else pod_owned(POD)
        children.append(
            Child(workload, create_only=(REPLICAS,) if pool.autoscaling.enabled else (), owned=owned)
        )
    if gateway is None:
        children += [
            Child(build_service(owner, role=Role.ROUTER)),
            Child(
                build_router_deployment(spec, owner=owner, images=images, config=router_config),
                owned=pod_owned(POD),
            ),
        ]
    # Builders may share sub-dicts (labels, probes): give every manifest a tree of its own. A JSON
    # round trip is several times faster than deepcopy and proves the manifests are plain JSON.
    return [Child(json.loads(json.dumps(c.manifest)), c.create_only, c.owned) for c in children]


def managed_refs(owner: Owner) -> list[ObjectRef]:
    """Every object this operator may create for the InferenceService `owner`."""
    ns = owner.namespace
    config_maps = [
        child_name(owner, s) for s in (LMCACHE_SUFFIX, ROUTER_SUFFIX, ADAPTERS_SUFFIX, ADAPTER_NAMES_SUFFIX)
    ]
    workloads = [child_name(owner, s) for s in (KV_SUFFIX, "prefill", "decode", ROUTER_SUFFIX)]
    router = child_name(owner, ROUTER_SUFFIX)
    pools = [child_name(owner, s) for s in ("prefill", "decode")]
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
        *(ObjectRef(LWS_API_VERSION, LWS_KIND, ns, name) for name in pools),
        *(ObjectRef("policy/v1", "PodDisruptionBudget", ns, name) for name in pools),
    ]
