"""Pod templates a user merges onto the pods Tandem builds, and what they may not change.

`PodTemplate` is a subset of Kubernetes' `PodTemplateSpec`: metadata (labels, annotations) and the
pod-spec fields users place and equip pods with (nodeSelector, tolerations, affinity, topology
spread, priority and runtime classes, scheduler, service account, image pull secrets, volumes,
containers and init containers). Everything else a pod spec has (hostNetwork, hostPID, ...) is an
unknown field. Cheap fields are typed; nested Kubernetes structures (affinity, tolerations, volumes,
probes of a sidecar) stay `dict[str, Any]`, checked by the API server as it checks any pod.

`template_rules` refuses what the operator must own, each with its field path and a one-line
reason (docs/operator.md, "Refused template fields"):
- in the main container (`engine`, `router` or `redis`): `command`, `args`, `image`, `ports`,
  the three probes; env variables carrying credentials (`OWNED_ENV`); for engines also the env that
  makes KV (in)compatible (`KV_ENV`), which belongs in `spec.engine.env` so both pools agree;
- init containers named as the operator's (`lmcache-check`, `adapters-sync`);
- labels under `app.kubernetes.io/`, `tandem.dev/`, `leaderworkerset.sigs.k8s.io/`, annotations
  under `tandem.dev/`;
- security weakening in any container or the pod: `privileged: true`, `allowPrivilegeEscalation:
  true`, `runAsNonRoot: false`, `runAsUser: 0`, `readOnlyRootFilesystem: false`, an `Unconfined`
  seccomp profile, `procMount: Unmasked`, added capabilities other than `IPC_LOCK` (RDMA needs to
  pin memory);
- for the gateway: `serviceAccountName` (its account is the one allowed to read EndpointSlices).
Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

#: Label prefixes the operator owns (selectors, role, LeaderWorkerSet's own labels).
OWNED_LABEL_PREFIXES = ("app.kubernetes.io/", "tandem.dev/", "leaderworkerset.sigs.k8s.io/")
OWNED_ANNOTATION_PREFIXES = ("tandem.dev/",)
#: Fields of the main container the operator owns.
OWNED_CONTAINER_FIELDS = (
    "command",
    "args",
    "image",
    "ports",
    "startupProbe",
    "readinessProbe",
    "livenessProbe",
)
#: Variables carrying credentials from Secrets (the engines' API key, the pool's password and key).
OWNED_ENV = frozenset({"VLLM_API_KEY", "TANDEM_KVPOOL_PASSWORD", "TANDEM_KV_POOL_KEY", "REDISCLI_AUTH"})
#: Engine variables that change the KV layout or its keys: set once, in spec.engine.env.
KV_ENV = frozenset({"PYTHONHASHSEED", "VLLM_ATTENTION_BACKEND", "VLLM_MLA_DISABLE"})
KV_ENV_PREFIXES = ("LMCACHE_",)
#: Init containers the operator adds to engine pods.
OWNED_INIT_CONTAINERS = frozenset({"lmcache-check", "adapters-sync"})
#: The one capability a template may add: RDMA (NCCL over InfiniBand, NIXL) pins memory.
ALLOWED_CAPABILITIES = frozenset({"IPC_LOCK"})


class _Open(BaseModel):
    """A Kubernetes structure of which some fields are typed and the rest kept as given."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True)


class _Closed(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class TemplateContainer(_Open):
    """A container: the main one's name (engine, router, redis) merges onto it; others are sidecars."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    env: list[dict[str, Any]] | None = Field(default=None, description="Merged by name.")
    volume_mounts: list[dict[str, Any]] | None = Field(default=None, description="Merged by name.")
    resources: dict[str, Any] | None = Field(default=None, description="Requests and limits, merged.")
    security_context: dict[str, Any] | None = None


class LocalObjectReference(_Closed):
    """A Secret in the pod's namespace (image pull secrets)."""

    name: str = Field(min_length=1, max_length=253)


class TemplateMetadata(_Closed):
    """Labels and annotations added to the pods."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class TemplatePodSpec(_Closed):
    """The pod-spec fields a template may set: placement, identity, volumes and containers."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] | None = Field(default=None, description="Replaces the list.")
    affinity: dict[str, Any] | None = None
    topology_spread_constraints: list[dict[str, Any]] | None = None
    priority_class_name: str | None = None
    runtime_class_name: str | None = None
    scheduler_name: str | None = None
    service_account_name: str | None = None
    image_pull_secrets: list[LocalObjectReference] | None = None
    termination_grace_period_seconds: int | None = Field(default=None, ge=0, le=86400)
    volumes: list[dict[str, Any]] | None = Field(default=None, description="Merged by name.")
    containers: list[TemplateContainer] | None = Field(
        default=None, description="The main container's name merges onto it; others are sidecars."
    )
    init_containers: list[TemplateContainer] | None = None
    security_context: dict[str, Any] | None = Field(default=None, description="Pod security context, merged.")


class PodTemplate(_Closed):
    """A pod template merged onto the pods the operator builds: maps merged, lists of named items
    (containers, volumes, env, volumeMounts) merged by name, anything else replaced."""

    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    spec: TemplatePodSpec = Field(default_factory=TemplatePodSpec)

    def document(self) -> dict[str, Any]:
        """The template as Kubernetes JSON (camelCase, unset fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)


def template_rules(
    template: PodTemplate | None, *, at: str, main: str, engine: bool = False
) -> list[tuple[str, str]]:
    """(field path, reason) for every field of `template` the operator owns (module docstring).
    `at`: the template's path (`spec.decode.template`); `main`: the main container's name;
    `engine`: an engine pod's template (KV env, the operator's init containers)."""
    if template is None:
        return []
    errors: list[tuple[str, str]] = []
    meta = template.metadata
    for kind, values, prefixes in (
        ("labels", meta.labels, OWNED_LABEL_PREFIXES),
        ("annotations", meta.annotations, OWNED_ANNOTATION_PREFIXES),
    ):
        for key in values:
            if key.startswith(prefixes):
                errors.append(
                    (f"{at}.metadata.{kind}[{key}]", f"the operator owns {kind} under {key.split('/')[0]}/")
                )
    spec = template.spec
    if main == "router" and spec.service_account_name is not None:
        errors.append(
            (f"{at}.spec.serviceAccountName", "the gateway runs as its own account (EndpointSlice reader)")
        )
    errors += [(f"{at}.spec.securityContext.{k}", why) for k, why in weakening(spec.security_context or {})]
    for group in ("containers", "initContainers"):
        for i, container in enumerate(
            getattr(spec, "containers" if group == "containers" else "init_containers") or []
        ):
            path = f"{at}.spec.{group}[{i}]"
            raw = container.model_dump(mode="json", by_alias=True, exclude_none=True)
            errors += [
                (f"{path}.securityContext.{k}", why) for k, why in weakening(raw.get("securityContext") or {})
            ]
            if group == "initContainers" and engine and container.name in OWNED_INIT_CONTAINERS:
                errors.append((f"{path}.name", f"{container.name!r} is the operator's init container"))
            if group == "containers" and container.name == main:
                errors += _main_container(raw, path=path, main=main, engine=engine)
    return errors


def _main_container(raw: Mapping[str, Any], *, path: str, main: str, engine: bool) -> list[tuple[str, str]]:
    errors = [
        (f"{path}.{name}", f"the operator owns the {main} container's {name}" + _hint(name, engine))
        for name in OWNED_CONTAINER_FIELDS
        if name in raw
    ]
    for j, var in enumerate(raw.get("env") or []):
        name = str(var.get("name", ""))
        if name in OWNED_ENV:
            errors.append((f"{path}.env[{j}].name", f"{name} carries a credential from its Secret"))
        elif engine and (name in KV_ENV or name.startswith(KV_ENV_PREFIXES)):
            errors.append(
                (f"{path}.env[{j}].name", f"{name} changes the KV layout: set it in spec.engine.env")
            )
    return errors


def _hint(name: str, engine: bool) -> str:
    if engine and name in ("args", "image"):
        return f" (use spec.engine.{name} or spec.<pool>.engine.{name})"
    return ""


def weakening(context: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) for each setting of a (pod or container) security context that weakens what
    the operator sets: every pod runs non-root, unprivileged, read-only, RuntimeDefault seccomp."""
    bad: dict[str, bool | int | str] = {
        "privileged": True,
        "allowPrivilegeEscalation": True,
        "runAsNonRoot": False,
        "readOnlyRootFilesystem": False,
        "runAsUser": 0,
        "procMount": "Unmasked",
    }
    found = [
        (key, f"{key}: {_yaml(value)} weakens the pod's security")
        for key, value in bad.items()
        if key in context and context[key] == value and type(context[key]) is type(value)
    ]
    seccomp = context.get("seccompProfile") or {}
    if isinstance(seccomp, Mapping) and seccomp.get("type") == "Unconfined":
        found.append(("seccompProfile.type", "an Unconfined seccomp profile weakens the pod's security"))
    added = (context.get("capabilities") or {}).get("add") or []
    extra = [c for c in added if str(c).upper().removeprefix("CAP_") not in ALLOWED_CAPABILITIES]
    if extra:
        found.append(("capabilities.add", f"adds {', '.join(map(str, extra))}: only IPC_LOCK may be added"))
    return found


def _yaml(value: bool | int | str) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


#: vLLM flags the operator sets or derives (normalised: `--flag`, dashes); `-tp` is the short form.
OWNED_FLAGS = {
    "--kv-transfer-config": "the operator configures the KV connector (spec.kvPool)",
    "--port": "the engine listens on the operator's port 8000",
    "--host": "the engine listens on the operator's address",
    "--tensor-parallel-size": "use spec.<pool>.tensorParallel",
    "-tp": "use spec.<pool>.tensorParallel",
    "--api-key": "the engines' API key comes from its Secret (spec.engine.apiKeySecret)",
    "--served-model-name": "use spec.model.servedName",
}
#: Flags the operator sets on multi-node pools (vLLM data parallel over a LeaderWorkerSet).
MULTINODE_FLAGS = (
    "--data-parallel-size",
    "--data-parallel-size-local",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--data-parallel-start-rank",
    "--headless",
    "-dp",
)
#: Flags that change the KV layout or its keys: set once, in spec.engine.args, so both pools agree.
KV_FLAGS = (
    "--dtype",
    "--kv-cache-dtype",
    "--block-size",
    "--quantization",
    "-q",
    "--revision",
    "--tokenizer",
    "--tokenizer-revision",
    "--hf-overrides",
    "--attention-backend",
    "--calculate-kv-scales",
    "--pipeline-parallel-size",
    "-pp",
    "--prefill-context-parallel-size",
    "-pcp",
)


def flag_name(arg: str) -> str | None:
    """The flag an argument names, as vLLM reads it (`--kv_transfer_config=x` → `--kv-transfer-config`);
    None for a value."""
    if not arg.startswith("-") or arg in ("-", "--") or arg[1:2].isdigit():
        return None
    name = arg.split("=", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def flag_rules(args: Sequence[str], *, at: str, multinode: bool, pool: bool) -> list[tuple[str, str]]:
    """(path, reason) for each argument the operator owns: `OWNED_FLAGS` always, the data-parallel
    flags on a multi-node pool, the KV flags in a pool's own args (`pool`)."""
    errors = []
    for i, arg in enumerate(args):
        name = flag_name(arg)
        if name is None:
            continue
        if name in OWNED_FLAGS:
            errors.append((f"{at}[{i}]", f"{name}: {OWNED_FLAGS[name]}"))
        elif multinode and name in MULTINODE_FLAGS:
            errors.append(
                (f"{at}[{i}]", f"{name}: the operator sets vLLM's data-parallel flags on multi-node pools")
            )
        elif pool and name in KV_FLAGS:
            errors.append(
                (
                    f"{at}[{i}]",
                    f"{name} changes the KV layout: set it in spec.engine.args so both pools agree",
                )
            )
    return errors
