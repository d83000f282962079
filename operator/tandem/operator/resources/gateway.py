"""The children of an InferenceGateway: one gateway in front of several InferenceServices. Pure builders.

For a gateway `fleet` serving services `a` and `b` (each a `Member`), in creation order:

- Secret `fleet-metrics-token` (`token`), with `spec.metricsToken` only: the bearer token of the
  gateway's diagnostics port (9090, `/metrics`), as a service's `<name>-metrics-token`;
- Secret `fleet-gateway-keys` (`salt-key`): the gateway's key of its tenants' `cache_salt`
  (`TANDEM_CACHE_KEY`), generated once as a service's `<name>-cache-keys` is; tenants are the gateway's;
- NetworkPolicy `fleet-gateway`: port 8080 from every pod of the namespace and of
  `spec.networkPolicy.clientNamespaces` and the metrics namespaces (each service's own policies admit
  the gateway's pods: `netpol.ingress_rules(gateway=...)`);
- ConfigMap `fleet-gateway`, key `router.yaml`: a `GatewayFile`; each service's `config` is the
  `RouterConfig` its own gateway would read (`router.router_config`, after
  `secrets.with_generated_secrets`), except that `apiKeysFile` is unset (the keys are the gateway's,
  `GatewayFile.apiKeysFile`), `tokenizerPath` points where this pod mounts that service's files, and
  `adapterNamesFile` (a service with LoRA on) where it mounts that service's ConfigMap
  `<svc>-adapter-names` (`/etc/tandem/adapter-names-<svc>`, volume `lora-names-<svc>`, optional),
  which the service's own reconcile writes: the gateway only mounts it (until it exists the gateway
  serves none of that service's adapters), and its config carries no adapters;
- ServiceAccount, Role, RoleBinding `fleet-gateway` (read EndpointSlices), as a service's router has;
- Service `fleet-gateway` (ClusterIP, port 8080) and Deployment `fleet-gateway`: the service's gateway
  pod (`router.build_gateway_deployment`: same image, command, probes, hardening), whose credentials
  are per service:

| Variable | From | Read as |
| --- | --- | --- |
| `TANDEM_CACHE_KEY` | `fleet-gateway-keys` / `salt-key` | the gateway's salt key |
| `TANDEM_KV_POOL_KEY_<SVC>` | `<svc>-cache-keys` / `pool-key` | `services[].poolKeyEnv` |
| `TANDEM_KVPOOL_PASSWORD_<SVC>` | its Redis password Secret (if any) | `services[].kvPoolPasswordEnv` |
| `TANDEM_ENGINE_API_KEY_<SVC>` | the service's engine key Secret | `services[].engineApiKeyEnv` |

`<SVC>` is the service's name upper-cased with `-` → `_` (`tandem.core.gateway.service_env`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.core.gateway import GatewayFile, GatewayService, InferenceGatewaySpec, service_env
from tandem.core.spec import InferenceServiceSpec
from tandem.kvpool.engine_config import PASSWORD_ENV, POOL_KEY_ENV
from tandem.operator.objects import Child, ObjectRef
from tandem.operator.resources.meta import Images, Owner, Role, object_meta, to_yaml
from tandem.operator.resources.netpol import build_gateway_policy
from tandem.operator.resources.router import (
    API_KEYS_FILE,
    AUTH_DIR,
    CONFIG_FILE,
    GatewayPod,
    adapter_names_volume,
    build_gateway_deployment,
    build_router_role,
    build_router_role_binding,
    build_router_service_account,
    config_document,
    router_config,
    tokenizer_volume,
)
from tandem.operator.resources.secrets import (
    SALT_KEY_KEY,
    SECRET_DATA,
    build_metrics_token_secret,
    build_secret,
    cache_keys_refs,
    metrics_token_ref,
    new_secret,
    with_generated_secrets,
)
from tandem.operator.resources.security import (
    CACHE_KEY_ENV,
    GATEWAY_ENGINE_KEY_ENV,
    engine_key_env,
    password_env,
)
from tandem.operator.resources.services import build_service, service_name

KEYS_SUFFIX = "gateway-keys"
#: Where a served service's tokenizer files are mounted: `<dir>/<service>`.
TOKENIZERS_DIR = "/etc/tandem/tokenizers"
#: Where a served service's `<svc>-adapter-names` is mounted: `<prefix><service>`.
ADAPTER_NAMES_PREFIX = "/etc/tandem/adapter-names-"


@dataclass(frozen=True)
class Member:
    """One InferenceService the gateway serves: its identity and its spec as stored."""

    owner: Owner
    spec: InferenceServiceSpec


def gateway_owner(*, name: str, namespace: str, uid: str) -> Owner:
    """The InferenceGateway as its children's owner."""
    return Owner(name=name, namespace=namespace, uid=uid, kind="InferenceGateway")


def keys_secret_name(gateway: Owner) -> str:
    return f"{gateway.name}-{KEYS_SUFFIX}"


def member_service(member: Member) -> GatewayService:
    """The `GatewayFile` entry of one service (module docstring)."""
    spec = with_generated_secrets(member.spec, member.owner)
    config = router_config(spec, owner=member.owner)
    tokenizer = config.tokenizer_path
    if tokenizer is not None:
        _, mount = tokenizer_volume(spec)[0]
        tokenizer = f"{TOKENIZERS_DIR}/{member.owner.name}{tokenizer.removeprefix(mount)}"
    name = member.owner.name
    names_file = config.adapter_names_file
    if names_file is not None:
        _, mount = adapter_names_volume(spec, owner=member.owner)[0]
        names_file = f"{ADAPTER_NAMES_PREFIX}{name}{names_file.removeprefix(mount)}"
    update = {"api_keys_file": None, "tokenizer_path": tokenizer, "adapter_names_file": names_file}
    return GatewayService(
        name=name,
        config=config.model_copy(update=update),
        pool_key_env=service_env(POOL_KEY_ENV, name),
        kv_pool_password_env=service_env(PASSWORD_ENV, name) if password_env(spec) else None,
        engine_api_key_env=service_env(GATEWAY_ENGINE_KEY_ENV, name),
    )


def gateway_file(gateway: Owner, spec: InferenceGatewaySpec, members: Sequence[Member]) -> GatewayFile:
    """What the gateway process reads (`tandem router --config`); ValueError from `GatewayFile`'s own
    checks (name conflicts, alias targets) when `members` cannot be served together."""
    api_keys = f"{AUTH_DIR}/{API_KEYS_FILE}" if spec.auth.enabled else None
    services = [member_service(m) for m in sorted(members, key=lambda m: m.owner.name)]
    return GatewayFile(gateway=gateway.name, spec=spec, services=services, api_keys_file=api_keys)


def gateway_pod(gateway: Owner, spec: InferenceGatewaySpec, members: Sequence[Member]) -> GatewayPod:
    """The pod's credentials (module docstring's table), API keys, and each service's tokenizer and
    adapter-names volumes."""
    env: list[dict[str, Any]] = [
        {
            "name": CACHE_KEY_ENV,
            "valueFrom": {"secretKeyRef": {"name": keys_secret_name(gateway), "key": SALT_KEY_KEY}},
        }
    ]
    mounts: list[tuple[dict[str, Any], str]] = []
    for member in sorted(members, key=lambda m: m.owner.name):
        name = member.owner.name
        spec_ = with_generated_secrets(member.spec, member.owner)
        pool_key = cache_keys_refs(member.owner).pool_key
        env += [
            *password_env(spec_, service_env(PASSWORD_ENV, name)),
            *engine_key_env(spec_, service_env(GATEWAY_ENGINE_KEY_ENV, name)),
            {
                "name": service_env(POOL_KEY_ENV, name),
                "valueFrom": {"secretKeyRef": {"name": pool_key.name, "key": pool_key.key}},
            },
        ]
        mounts += [
            (volume, f"{TOKENIZERS_DIR}/{name}") for volume, _ in tokenizer_volume(spec_, suffix=f"-{name}")
        ]
        # Optional: a member whose own reconcile has not written its names yet (an invalid spec)
        # must not keep the shared gateway's pods from starting; the gateway serves no adapters of
        # it until the file appears.
        names = adapter_names_volume(spec_, owner=member.owner, suffix=f"-{name}")
        mounts += [
            (
                {**volume, "configMap": {**volume["configMap"], "optional": True}},
                f"{ADAPTER_NAMES_PREFIX}{name}",
            )
            for volume, _ in names
        ]
    secret = spec.auth.api_keys_secret if spec.auth.enabled else None
    token = metrics_token_ref(gateway) if spec.metrics_token else None
    return GatewayPod(env=env, api_keys=secret, mounts=mounts, metrics_token=token)


def build_gateway_configmap(gateway: Owner, document: GatewayFile) -> dict[str, Any]:
    """ConfigMap `<name>-gateway` holding `router.yaml` (a GatewayFile; each service's config as
    `router.config_document` writes it)."""
    data = document.model_dump(mode="json", by_alias=True)
    data["services"] = [
        entry | {"config": config_document(service.config)}
        for entry, service in zip(data["services"], document.services, strict=True)
    ]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(gateway, name=service_name(gateway, Role.GATEWAY), role=Role.GATEWAY),
        "data": {CONFIG_FILE: to_yaml(data)},
    }


def gateway_children(
    gateway: Owner,
    spec: InferenceGatewaySpec,
    members: Sequence[Member],
    *,
    images: Images,
    metrics_namespaces: Sequence[str] = (),
    new_value: Callable[[], str] = new_secret,
) -> list[Child]:
    """Every child of the gateway (module docstring), dependencies first; ValueError as `gateway_file`."""
    config = build_gateway_configmap(gateway, gateway_file(gateway, spec, members))
    keys = build_secret(
        gateway, name=keys_secret_name(gateway), role=Role.GATEWAY, values={SALT_KEY_KEY: new_value()}
    )
    children = [Child(keys, create_only=(SECRET_DATA,))]
    if spec.metrics_token:
        token = build_metrics_token_secret(gateway, role=Role.GATEWAY, new_value=new_value)
        children.append(Child(token, create_only=(SECRET_DATA,)))
    if spec.network_policy.enabled:
        policy = build_gateway_policy(
            gateway,
            client_namespaces=spec.network_policy.client_namespaces,
            metrics_namespaces=metrics_namespaces,
        )
        children.append(Child(policy))
    pod = gateway_pod(gateway, spec, members)
    deployment = build_gateway_deployment(
        pod, owner=gateway, role=Role.GATEWAY, replicas=spec.replicas, images=images, config=config
    )
    children += [
        Child(config),
        Child(build_router_service_account(gateway, Role.GATEWAY)),
        Child(build_router_role(gateway, Role.GATEWAY)),
        Child(build_router_role_binding(gateway, Role.GATEWAY)),
        Child(build_service(gateway, role=Role.GATEWAY)),
        Child(deployment),
    ]
    # As `desired_children`: every manifest gets a tree of its own (builders share sub-dicts).
    return [Child(json.loads(json.dumps(c.manifest)), c.create_only, c.owned) for c in children]


def gateway_refs(gateway: Owner) -> list[ObjectRef]:
    """Every object the operator may create for the InferenceGateway `gateway`."""
    ns, name = gateway.namespace, service_name(gateway, Role.GATEWAY)
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        ObjectRef("v1", "Secret", ns, keys_secret_name(gateway)),
        ObjectRef("v1", "Secret", ns, metrics_token_ref(gateway).name),
        ObjectRef("networking.k8s.io/v1", "NetworkPolicy", ns, name),
        ObjectRef("v1", "ConfigMap", ns, name),
        ObjectRef("v1", "ServiceAccount", ns, name),
        ObjectRef(rbac, "Role", ns, name),
        ObjectRef(rbac, "RoleBinding", ns, name),
        ObjectRef("v1", "Service", ns, name),
        ObjectRef("apps/v1", "Deployment", ns, name),
    ]
