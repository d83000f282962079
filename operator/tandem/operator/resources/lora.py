"""LoRA on the engine pods (`spec.engine.lora`, `spec.adapters`, `spec.adapterCatalog`). Pure builders.

With `engine.lora` set, every engine container (prefill and decode alike: with P/D the prefill engine
receives the same `model` and must resolve the adapter too) gets vLLM's flags
`--enable-lora --max-loras N --max-lora-rank R [--max-cpu-loras C]` and environment
(`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, `VLLM_PLUGINS=lora_filesystem_resolver`,
`VLLM_LORA_RESOLVER_CACHE_DIR=/adapters`), so that a request whose `model` names `/adapters/<name>`
is served with that adapter. The pod's volumes:

- `adapters` at `/adapters`, writable: an emptyDir per pod, or `spec.adapterCache.pvc` (a
  ReadWriteMany claim the pods of the service share, which something else may fill too);
- `adapter-list`: the ConfigMap `<name>-adapters` (`build_adapters_configmap`: the `hf://` and
  `s3://` adapters as `tandem.core.adaptersync` reads them) at `/etc/tandem/adapters`;
- each `pvc://claim/path` adapter: its claim read-only at `/adapters/<name>` (subPath `path`);
- `spec.adapterCatalog` (`pvc://claim/path`): its claim read-only at `/adapter-catalog`.

Each engine pod runs the **`adapters-sync` sidecar** (a native sidecar: an init container with
`restartPolicy: Always`, Kubernetes 1.29 and later), `tandem adapters sync` of the Tandem image. On
every pass (10 s) it installs the listed adapters into `/adapters` (downloaded once per source: with
the shared claim, once for every pod of the service; `tandem.core.adapterfetch`), removes those it
installed that are no longer listed, and links the catalog's adapters (a declared name wins; one
that left the catalog is unlinked). Its startupProbe (`/ready`) passes after the first pass, and
the engine container starts only then, so a new or restarted pod serves every adapter that could be
installed. Its environment takes the keys
of `spec.adapterCache.credentialsSecret` (`FETCH_ENV_KEYS`, each optional).

**Nothing in the pod template names an adapter** (with LoRA on, the sidecar and the list's volume are
there even for an empty list): adding, changing or removing an `hf://` or `s3://` adapter changes only
the ConfigMap, which the kubelet updates in the running pods' volume (within its sync period, about a
minute), and each pod's sidecar acts on it; catalog adapters added later are linked the same way. An
adapter that cannot be installed does not keep the engines from starting: the sidecar's report
(`GET /adapters` on port `adapter-sync`, 8095) says why, and the operator reads it back into
`status.adapters` (`tandem.operator.adapterstatus`). A `pvc://` adapter is a mount of its own, so
adding one does roll the pools; a catalog on a claim is the way to add volume-held adapters live.

**The gateway's names** (`build_adapter_names_configmap`): ConfigMap `<name>-adapter-names`, key
`names.json` (`tandem.core.adapternames`), lists every name the gateway accepts as an adapter: the
declared ones, then the catalog's names as the sidecars report them. The gateway pods mount it whole
and re-read it, and the router config names only the file (`resources.router`), so no adapter change
rolls the gateway either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tandem.core.adapternames import NAMES_KEY, names_document, parse_names
from tandem.core.adapters import (
    AdapterError,
    HfSource,
    PvcSource,
    S3Source,
    engine_args,
    engine_env,
    parse_source,
)
from tandem.core.adaptersync import LIST_KEY, SYNC_PORT, list_document
from tandem.core.spec import InferenceServiceSpec
from tandem.operator.resources.meta import Images, Owner, Role, child_name, object_meta
from tandem.operator.resources.security import container_security_context

ADAPTER_DIR = "/adapters"
CATALOG_MOUNT = "/adapter-catalog"
ADAPTERS_VOLUME = "adapters"
CATALOG_VOLUME = "adapter-catalog"
LIST_VOLUME = "adapter-list"
LIST_MOUNT = "/etc/tandem/adapters"
#: The ConfigMap `<name>-adapters` holding the list the sidecars read.
ADAPTERS_SUFFIX = "adapters"
#: The ConfigMap `<name>-adapter-names` holding the names the gateway accepts as adapters.
ADAPTER_NAMES_SUFFIX = "adapter-names"
#: Its second key: the catalog's names it was written with (`live_catalog`); the gateway reads only
#: `names.json`.
CATALOG_KEY = "catalog.json"
#: The most both keys of `<name>-adapter-names` may hold together: the API server refuses a ConfigMap
#: whose data exceeds 1 MiB (1,048,576 bytes); the rest is room for its keys and metadata.
NAMES_CONFIGMAP_BYTES = 1_000_000
#: Downloads stream to disk in 1 MiB chunks (boto3's transfers use a few more buffers).
SYNC_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
SYNC_CONTAINER = "adapters-sync"
SYNC_PORT_NAME = "adapter-sync"
#: The first pass may download every adapter: the startupProbe allows it 30 minutes (2 s × 900).
SYNC_STARTUP_PERIOD_S, SYNC_STARTUP_FAILURES = 2, 900
#: The keys of `spec.adapterCache.credentialsSecret` the fetch reads (each optional).
FETCH_ENV_KEYS = (
    "HF_TOKEN",
    "HF_ENDPOINT",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
)


def lora_args(spec: InferenceServiceSpec) -> list[str]:
    """The engines' LoRA flags (vLLM's; the simulator takes the same), [] with LoRA off."""
    return engine_args(spec.engine.lora) if spec.engine.lora is not None else []


def lora_env(spec: InferenceServiceSpec) -> dict[str, dict[str, Any]]:
    """The engines' LoRA environment by name, {} with LoRA off."""
    if spec.engine.lora is None:
        return {}
    return {name: {"value": value} for name, value in engine_env(ADAPTER_DIR).items()}


def build_adapters_configmap(spec: InferenceServiceSpec, *, owner: Owner) -> dict[str, Any] | None:
    """ConfigMap `<name>-adapters` with the list the sidecars keep (`adapters.json`); None with LoRA
    off."""
    if spec.engine.lora is None:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(owner, name=child_name(owner, ADAPTERS_SUFFIX), role=Role.DECODE),
        "data": {LIST_KEY: list_document(remote_adapters(spec))},
    }


def build_adapter_names_configmap(
    spec: InferenceServiceSpec, *, owner: Owner, catalog: Sequence[str]
) -> dict[str, Any] | None:
    """ConfigMap `<name>-adapter-names` (module docstring); None with LoRA off. `names.json` holds
    `served_adapter_names`; `catalog.json` the catalog's names as given (the reconcile's
    `catalog`: the union of the sidecars' reports, or this ConfigMap's own `catalog.json` when no
    report could be read, `live_catalog`), both as `names_document`s."""
    if spec.engine.lora is None:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(owner, name=child_name(owner, ADAPTER_NAMES_SUFFIX), role=Role.ROUTER),
        "data": {
            NAMES_KEY: names_document(served_adapter_names(spec, catalog)),
            CATALOG_KEY: names_document(sorted(catalog)),
        },
    }


def served_adapter_names(spec: InferenceServiceSpec, catalog: Sequence[str]) -> list[str]:
    """The names the gateway accepts as adapters: `spec.adapters`' in spec order, then the catalog's
    sorted, without the model's own names (`spec.model.name`, its served name: never an adapter) and
    without repeats (a declared name wins over the catalog's).

    >>> from tandem.core.spec import InferenceServiceSpec
    >>> spec = InferenceServiceSpec.model_validate({
    ...     "model": {"name": "m"}, "engine": {"lora": {}},
    ...     "adapters": [{"name": "sql", "source": "hf://o/sql"}]})
    >>> served_adapter_names(spec, ["z", "sql", "m", "a"])
    ['sql', 'a', 'z']
    """
    model = {spec.model.name, spec.model.public_name}
    declared = [adapter.name for adapter in spec.adapters]
    return list(dict.fromkeys([*declared, *(n for n in sorted(catalog) if n not in model)]))


def extra_catalog_names(spec: InferenceServiceSpec, catalog: Sequence[str]) -> list[str]:
    """The catalog's names the gateway serves besides the declared adapters (`served_adapter_names`)."""
    declared = {adapter.name for adapter in spec.adapters}
    return [name for name in served_adapter_names(spec, catalog) if name not in declared]


def fit_catalog(spec: InferenceServiceSpec, catalog: Sequence[str]) -> tuple[list[str], list[str]]:
    """(kept, left out): the catalog's names, sorted, that `<name>-adapter-names` can hold within
    `NAMES_CONFIGMAP_BYTES`, and those it cannot (the last in sorted order). A name the gateway serves
    is written twice (`names.json` and `catalog.json`), one it does not (declared, or the model's own)
    once, so about 4,000 names of 128 characters fit, or 20,000 of 20; a catalog holds at most 10,000.

    >>> from tandem.core.spec import InferenceServiceSpec
    >>> spec = InferenceServiceSpec.model_validate({"model": {"name": "m"}, "engine": {"lora": {}}})
    >>> fit_catalog(spec, ["b", "a"])
    (['a', 'b'], [])
    >>> kept, left_out = fit_catalog(spec, [f"{i:0128d}" for i in range(5000)])
    >>> len(kept), len(left_out), left_out[0] == f"{len(kept):0128d}"
    (3787, 1213, True)
    """
    names = sorted(set(catalog))
    extra = set(extra_catalog_names(spec, names))
    size = len(names_document(adapter.name for adapter in spec.adapters)) + len(names_document([]))
    for index, name in enumerate(names):
        entry = len(json.dumps(name)) + 2  # the name and its ", "
        size += entry * (2 if name in extra else 1)
        if size > NAMES_CONFIGMAP_BYTES:
            return names[:index], names[index:]
    return names, []


def live_catalog(configmap: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The catalog's names a live `<name>-adapter-names` was written with (its `catalog.json`); ()
    when it is absent or that key is missing or not a names document."""
    text = ((configmap or {}).get("data") or {}).get(CATALOG_KEY)
    if not isinstance(text, str):
        return ()
    try:
        return parse_names(text)
    except AdapterError:
        return ()


def _pvc_adapters(spec: InferenceServiceSpec) -> list[tuple[str, PvcSource]]:
    out = []
    for adapter in spec.adapters:
        source = parse_source(adapter.source)  # parsed by check_rules before any builder runs
        if isinstance(source, PvcSource):
            out.append((adapter.name, source))
    return out


def remote_adapters(spec: InferenceServiceSpec) -> list[tuple[str, str]]:
    """(name, source as declared) of the `hf://` and `s3://` adapters, in spec order."""
    return [
        (adapter.name, adapter.source)
        for adapter in spec.adapters
        if isinstance(parse_source(adapter.source), HfSource | S3Source)
    ]


def _catalog(spec: InferenceServiceSpec) -> PvcSource | None:
    if spec.adapter_catalog is None:
        return None
    source = parse_source(spec.adapter_catalog.source)
    return source if isinstance(source, PvcSource) else None


def lora_volumes(
    spec: InferenceServiceSpec, owner: Owner
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's adapter volumes and the engine container's mounts (module docstring; the list's
    volume is the sidecar's alone: `sync_container`); none with LoRA off. One volume per claim
    (`adapter-pvc-<i>`, in the order the claims first appear)."""
    if spec.engine.lora is None:
        return [], []
    cache = spec.adapter_cache
    volumes: list[dict[str, Any]] = [
        {"name": ADAPTERS_VOLUME, "persistentVolumeClaim": {"claimName": cache.pvc}}
        if cache is not None and cache.pvc is not None
        else {"name": ADAPTERS_VOLUME, "emptyDir": {}},
        {"name": LIST_VOLUME, "configMap": {"name": child_name(owner, ADAPTERS_SUFFIX)}},
    ]
    mounts: list[dict[str, Any]] = [{"name": ADAPTERS_VOLUME, "mountPath": ADAPTER_DIR}]
    claims: dict[str, str] = {}
    for name, source in _pvc_adapters(spec):
        if source.claim not in claims:
            claims[source.claim] = f"adapter-pvc-{len(claims)}"
            volumes.append(_claim_volume(claims[source.claim], source.claim))
        mounts.append(_read_only(claims[source.claim], f"{ADAPTER_DIR}/{name}", source.path))
    catalog = _catalog(spec)
    if catalog is not None:
        volumes.append(_claim_volume(CATALOG_VOLUME, catalog.claim))
        mounts.append(_read_only(CATALOG_VOLUME, CATALOG_MOUNT, catalog.path))
    return volumes, mounts


def _claim_volume(name: str, claim: str) -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}


def _read_only(volume: str, path: str, sub_path: str) -> dict[str, Any]:
    mount = {"name": volume, "mountPath": path, "readOnly": True}
    return mount | {"subPath": sub_path} if sub_path else mount


def sync_container(spec: InferenceServiceSpec, *, owner: Owner, images: Images) -> dict[str, Any] | None:
    """The engine pods' `adapters-sync` sidecar (module docstring); None with LoRA off. It mounts
    what the engine mounts (declared `pvc://` adapters are directories it leaves alone) and the list."""
    lora = spec.engine.lora
    if lora is None:
        return None
    command = ["tandem", "adapters", "sync", "--list", f"{LIST_MOUNT}/{LIST_KEY}", "--dest", ADAPTER_DIR]
    command += ["--max-rank", str(lora.max_rank), "--port", str(SYNC_PORT)]
    if _catalog(spec) is not None:
        command += ["--catalog", CATALOG_MOUNT]
    list_mount = {"name": LIST_VOLUME, "mountPath": LIST_MOUNT, "readOnly": True}
    container: dict[str, Any] = {
        "name": SYNC_CONTAINER,
        "image": images.tandem,
        "restartPolicy": "Always",
        "command": command,
        "ports": [{"name": SYNC_PORT_NAME, "containerPort": SYNC_PORT, "protocol": "TCP"}],
        "startupProbe": {
            "httpGet": {"path": "/ready", "port": SYNC_PORT_NAME},
            "periodSeconds": SYNC_STARTUP_PERIOD_S,
            "failureThreshold": SYNC_STARTUP_FAILURES,
        },
        "livenessProbe": {
            "httpGet": {"path": "/ready", "port": SYNC_PORT_NAME},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": SYNC_RESOURCES,
        "volumeMounts": [*lora_volumes(spec, owner)[1], list_mount],
        "securityContext": container_security_context(),
    }
    secret = spec.adapter_cache.credentials_secret if spec.adapter_cache is not None else None
    if secret is not None:
        container["env"] = [
            {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
            for key in FETCH_ENV_KEYS
        ]
    return container
