"""LoRA on the engine pods (`spec.engine.lora`, `spec.adapters`, `spec.adapterCatalog`). Pure builders.

With `engine.lora` set, every engine container (prefill and decode alike: with P/D the prefill engine
receives the same `model` and must resolve the adapter too) gets vLLM's flags
`--enable-lora --max-loras N --max-lora-rank R [--max-cpu-loras C]` and environment
(`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, `VLLM_PLUGINS=lora_filesystem_resolver`,
`VLLM_LORA_RESOLVER_CACHE_DIR=/adapters`), so that a request whose `model` names `/adapters/<name>`
is served with that adapter. The pod's volumes:

- `adapters` at `/adapters`, writable: an emptyDir per pod, or `spec.adapterCache.pvc` (a
  ReadWriteMany claim the pods of the service share, which something else may fill too);
- each `pvc://claim/path` adapter: its claim read-only at `/adapters/<name>` (subPath `path`);
- `spec.adapterCatalog` (`pvc://claim/path`): its claim read-only at `/adapter-catalog`; an init
  container of the Tandem image (`tandem adapters link`) links each subdirectory holding an
  `adapter_config.json` to `/adapters/<name>` as the pod starts (an adapter declared in
  `spec.adapters` of the same name wins). Adapters added to the catalog later are seen by pods
  started later.

With `hf://` or `s3://` adapters, that init container is `adapters-fetch` instead: `tandem adapters
fetch --dest /adapters --max-rank R --prune [--catalog /adapter-catalog] name=source...` installs each
into `/adapters/<name>` (downloaded once per source: with the shared claim, once for every pod of the
service; `tandem.core.adapterfetch`), removes those it installed before that are no longer declared,
then links the catalog. Its environment takes the keys of `spec.adapterCache.credentialsSecret`
(`FETCH_ENV_KEYS`, each optional). The adapters are in its arguments, so adding, changing or removing
one rolls the engine pools: each new pod fetches what is missing and serves the new set. An adapter
it cannot install does not keep the engines from starting (`--keep-going`): it writes `failed <name>:
<reason>` lines to its termination message, which the pod's `initContainerStatuses` carry and the
operator reads back into `status.adapters` (`tandem.operator.adapterstatus`).
"""

from __future__ import annotations

from typing import Any

from tandem.core.adapters import HfSource, PvcSource, S3Source, engine_args, engine_env, parse_source
from tandem.core.spec import InferenceServiceSpec
from tandem.operator.resources.meta import Images
from tandem.operator.resources.security import container_security_context

ADAPTER_DIR = "/adapters"
CATALOG_MOUNT = "/adapter-catalog"
ADAPTERS_VOLUME = "adapters"
CATALOG_VOLUME = "adapter-catalog"
LINK_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
#: Downloads stream to disk in 1 MiB chunks (boto3's transfers use a few more buffers).
FETCH_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
FETCH_CONTAINER = "adapters-fetch"
#: Where a container's termination message is read from (the pod's default terminationMessagePath).
TERMINATION_LOG = "/dev/termination-log"
LINK_CONTAINER = "adapters-link"
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


def lora_volumes(spec: InferenceServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's adapter volumes and the engine container's mounts (module docstring); none with
    LoRA off. One volume per claim (`adapter-pvc-<i>`, in the order the claims first appear)."""
    if spec.engine.lora is None:
        return [], []
    cache = spec.adapter_cache
    volumes: list[dict[str, Any]] = [
        {"name": ADAPTERS_VOLUME, "persistentVolumeClaim": {"claimName": cache.pvc}}
        if cache is not None and cache.pvc is not None
        else {"name": ADAPTERS_VOLUME, "emptyDir": {}}
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


def link_container(spec: InferenceServiceSpec, *, images: Images) -> dict[str, Any] | None:
    """The engine pods' adapter init container (None when there is nothing to put in `/adapters`):
    `adapters-fetch` with `hf://` or `s3://` adapters, else `adapters-link` with a catalog (module
    docstring). It mounts what the engine mounts, so that declared adapters are directories it
    leaves alone."""
    remote, catalog = remote_adapters(spec), _catalog(spec)
    if not remote and catalog is None:
        return None
    container: dict[str, Any] = {
        "name": LINK_CONTAINER,
        "image": images.tandem,
        "command": ["tandem", "adapters", "link", "--catalog", CATALOG_MOUNT, "--dest", ADAPTER_DIR],
        "resources": LINK_RESOURCES,
        "volumeMounts": lora_volumes(spec)[1],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
    }
    if not remote:
        return container
    lora = spec.engine.lora
    max_rank = lora.max_rank if lora is not None else 16  # lora is required with adapters (check_rules)
    command = ["tandem", "adapters", "fetch", "--dest", ADAPTER_DIR, "--max-rank", str(max_rank)]
    command += ["--prune", "--keep-going", "--report", TERMINATION_LOG]
    if catalog is not None:
        command += ["--catalog", CATALOG_MOUNT]
    container |= {
        "name": FETCH_CONTAINER,
        "command": command,
        "args": [f"{name}={source}" for name, source in remote],
        "resources": FETCH_RESOURCES,
    }
    secret = spec.adapter_cache.credentials_secret if spec.adapter_cache is not None else None
    if secret is not None:
        container["env"] = [
            {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
            for key in FETCH_ENV_KEYS
        ]
    return container
