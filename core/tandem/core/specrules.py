"""What a spec's schema cannot say, and reading a whole document.

- `SpecError` / `SpecInvalid`: problems with their dotted field paths.
- `check_rules`: the InferenceService's cross-field rules, e.g. `autoscaling.min <= autoscaling.max`;
  `access_rules`, the gateway's part, shared with the InferenceGateway (`tandem.core.gateway`).
- `parse_inference_service`: structure (`tandem.core.spec`), then the rules; raises `SpecInvalid`
  listing every error.
- Adapters (`spec.adapters`, `spec.adapterCatalog`, `spec.engine.lora`): `check_rules` holds what the
  spec alone says (sources parse, names unique and not the model's); `local_adapter_rules` reads
  local sources (`tandem validate`, `tandem up`: ranks, catalog names); `cluster_adapter_rules` refuses
  what a cluster cannot serve (local paths); `adapter_warnings` says what is accepted but costs more
  than it needs to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tandem.core.adapters import (
    AdapterError,
    AdapterSource,
    HfSource,
    LocalSource,
    PvcSource,
    S3Source,
    config_problem,
    parse_source,
    read_adapter_config,
    scan_catalog,
)
from tandem.core.podtemplate import KV_ENV, KV_ENV_PREFIXES, OWNED_ENV, flag_rules, template_rules
from tandem.core.spec import (
    ENGINE_BLOCK_SIZE,
    AuthSpec,
    DecodeSpec,
    InferenceService,
    InferenceServiceSpec,
    PrefillSpec,
    RouterSpec,
    TenantSpec,
    max_prefill_replicas,
)


@dataclass(frozen=True)
class SpecError:
    """One problem in a document: a dotted field path (`spec.decode.autoscaling.max`) and a message."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecInvalid(ValueError):
    """The document is not a valid InferenceService; `errors` lists every problem found."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def check_rules(spec: InferenceServiceSpec) -> list[SpecError]:
    """Cross-field rules that a structural schema cannot express. Pure; empty list when valid."""
    errors: list[SpecError] = []
    pools: tuple[tuple[str, PrefillSpec | DecodeSpec], ...] = (
        ("prefill", spec.prefill),
        ("decode", spec.decode),
    )
    for pool_name, pool in pools:
        scaling = pool.autoscaling
        base = f"spec.{pool_name}.autoscaling"
        if scaling.panic_window_seconds > scaling.stable_window_seconds:
            errors.append(
                SpecError(
                    f"{base}.panicWindowSeconds",
                    f"must be <= {base}.stableWindowSeconds "
                    f"({scaling.panic_window_seconds:g} > {scaling.stable_window_seconds:g})",
                )
            )
        if scaling.min > scaling.max:
            errors.append(SpecError(f"{base}.min", f"must be <= {base}.max ({scaling.min} > {scaling.max})"))
        elif scaling.enabled and not scaling.min <= pool.replicas <= scaling.max:
            errors.append(
                SpecError(
                    f"spec.{pool_name}.replicas",
                    f"must lie within autoscaling bounds [{scaling.min}, {scaling.max}] "
                    f"when autoscaling is enabled (got {pool.replicas})",
                )
            )
    if spec.decode.replicas == 0 and not spec.decode.autoscaling.enabled:
        errors.append(
            SpecError(
                "spec.decode.replicas",
                "0 decode replicas needs decode.autoscaling.enabled (scale from zero with min 0)",
            )
        )
    if spec.disaggregation.mode == "always" and max_prefill_replicas(spec) == 0:
        errors.append(
            SpecError(
                "spec.prefill.replicas",
                "disaggregation.mode 'always' needs at least one prefill replica",
            )
        )
    if spec.kv_pool.chunk_size % ENGINE_BLOCK_SIZE:
        errors.append(
            SpecError(
                "spec.kvPool.chunkSize",
                f"must be a multiple of the engine block size {ENGINE_BLOCK_SIZE} "
                f"(got {spec.kv_pool.chunk_size})",
            )
        )
    if (problem := _unequal_tp_problem(spec)) is not None:
        errors.append(SpecError("spec.decode.tensorParallel", problem))
    errors.extend(_router_rules(spec.router))
    errors.extend(_adapter_rules(spec))
    errors.extend(_pool_rules(spec))
    return errors


def _pool_rules(spec: InferenceServiceSpec) -> list[SpecError]:
    """What the operator owns in the templates and engine arguments (`tandem.core.podtemplate`),
    and what a multi-node pool needs."""
    found = template_rules(spec.engine.template, at="spec.engine.template", main="engine", engine=True)
    multinode = spec.prefill.multinode or spec.decode.multinode
    found += flag_rules(spec.engine.args, at="spec.engine.args", multinode=multinode, pool=False)
    for name, pool in (("prefill", spec.prefill), ("decode", spec.decode)):
        at = f"spec.{name}"
        found += template_rules(pool.template, at=f"{at}.template", main="engine", engine=True)
        found += flag_rules(pool.engine.args, at=f"{at}.engine.args", multinode=pool.multinode, pool=True)
        for i, var in enumerate(pool.engine.env):
            if (problem := _pool_env_problem(var.name)) is not None:
                found.append((f"{at}.engine.env[{i}].name", problem))
        if pool.multinode and spec.engine.kind != "vllm":
            found.append(
                (
                    f"{at}.nodesPerReplica",
                    "more than 1 needs engine.kind vllm (the simulator runs on one pod)",
                )
            )
        if pool.multinode and (problem := _gpus_problem(pool)) is not None:
            found.append((f"{at}.resources", problem))
    found += template_rules(spec.router.template, at="spec.router.template", main="router")
    found += template_rules(spec.kv_pool.redis.template, at="spec.kvPool.redis.template", main="redis")
    if spec.kv_pool.redis.template is not None and spec.kv_pool.redis.url is not None:
        found.append(("spec.kvPool.redis.template", "no Redis is deployed when kvPool.redis.url is set"))
    return [SpecError(path, message) for path, message in found]


def _unequal_tp_problem(spec: InferenceServiceSpec) -> str | None:
    """LMCache's pool keys carry the world size and worker id, so a decode engine finds a prefill
    engine's chunks only at the same tensor-parallel size; Tandem's connector stores KV per head."""
    prefill, decode = spec.prefill.tensor_parallel, spec.decode.tensor_parallel
    if spec.engine.kind != "vllm" or spec.kv_pool.connector != "lmcache" or prefill == decode:
        return None
    return (
        f"must equal spec.prefill.tensorParallel ({decode} != {prefill}) with kvPool.connector lmcache, "
        "whose keys carry the world size and worker id; use kvPool.connector tandem for unequal TP"
    )


def _pool_env_problem(name: str) -> str | None:
    if name in OWNED_ENV:
        return f"{name} carries a credential from its Secret"
    if name in KV_ENV or name.startswith(KV_ENV_PREFIXES):
        return f"{name} changes the KV layout: set it in spec.engine.env so both pools agree"
    return None


def _gpus_problem(pool: PrefillSpec | DecodeSpec) -> str | None:
    """A multi-node pod runs `GPUs / tensorParallel` data-parallel ranks: the count must divide."""
    told = pool.resources.limits.get("nvidia.com/gpu") or pool.resources.requests.get("nvidia.com/gpu")
    if told is None:
        return None
    if not told.isdigit() or int(told) % pool.tensor_parallel:
        return (
            f"nvidia.com/gpu ({told}) must be a whole multiple of tensorParallel ({pool.tensor_parallel}) "
            "on a multi-node pool: each pod runs GPUs / tensorParallel data-parallel ranks"
        )
    return None


def _adapter_rules(spec: InferenceServiceSpec) -> list[SpecError]:
    """LoRA is asked for explicitly, sources parse, and adapter names are unique and not the model's."""
    errors: list[SpecError] = []
    lora = spec.engine.lora
    if lora is None and (spec.adapters or spec.adapter_catalog is not None):
        errors.append(
            SpecError(
                "spec.engine.lora",
                "is required when spec.adapters or spec.adapterCatalog is set (it sizes the engines' "
                "LoRA memory: maxLoras, maxRank)",
            )
        )
    if lora is not None and lora.max_cpu_loras is not None and lora.max_cpu_loras < lora.max_loras:
        errors.append(
            SpecError(
                "spec.engine.lora.maxCpuLoras",
                f"must be >= spec.engine.lora.maxLoras ({lora.max_cpu_loras} < {lora.max_loras})",
            )
        )
    model_names = {spec.model.name: "spec.model.name", spec.model.public_name: "spec.model.servedName"}
    seen: set[str] = set()
    for i, adapter in enumerate(spec.adapters):
        at = f"spec.adapters[{i}]"
        if adapter.name in model_names:
            errors.append(
                SpecError(f"{at}.name", f"{adapter.name!r} is the model's name ({model_names[adapter.name]})")
            )
        elif adapter.name in seen:
            errors.append(SpecError(f"{at}.name", f"duplicate adapter {adapter.name!r}"))
        seen.add(adapter.name)
        try:
            parse_source(adapter.source)
        except AdapterError as exc:
            errors.append(SpecError(f"{at}.source", str(exc)))
    catalog = spec.adapter_catalog
    if catalog is not None:
        try:
            source = parse_source(catalog.source)
        except AdapterError as exc:
            errors.append(SpecError("spec.adapterCatalog.source", str(exc)))
        else:
            if not isinstance(source, LocalSource | PvcSource):
                errors.append(
                    SpecError("spec.adapterCatalog.source", "must be pvc://claim/path or a local directory")
                )
    return errors


def adapter_sources(spec: InferenceServiceSpec) -> list[tuple[str, str, AdapterSource]]:
    """(field path, adapter name, source) of every declared adapter whose source parses."""
    out = []
    for i, adapter in enumerate(spec.adapters):
        try:
            out.append((f"spec.adapters[{i}].source", adapter.name, parse_source(adapter.source)))
        except AdapterError:
            continue  # check_rules reports it
    return out


def local_path(source: LocalSource, *, base: Path) -> Path:
    """A local source's directory: relative paths are relative to `base` (the YAML file's folder)."""
    path = Path(source.path).expanduser()
    return path if path.is_absolute() else base / path


def local_catalog(spec: InferenceServiceSpec, *, base: Path) -> Path | None:
    """The catalog's local directory, when it is a local one that parses."""
    if spec.adapter_catalog is None:
        return None
    try:
        source = parse_source(spec.adapter_catalog.source)
    except AdapterError:
        return None
    return local_path(source, base=base) if isinstance(source, LocalSource) else None


def local_adapter_rules(spec: InferenceServiceSpec, *, base: Path) -> list[SpecError]:
    """What the local files say (`tandem validate`, `tandem up`; reads the filesystem): each local
    adapter's `adapter_config.json` is readable and its rank at most `spec.engine.lora.maxRank`; a
    local catalog is listable, its adapters' names are safe, not the model's nor a declared adapter's,
    and their ranks fit too. `base`: the folder relative paths start from."""
    lora = spec.engine.lora
    if lora is None:
        return []  # check_rules already asks for it
    errors: list[SpecError] = []
    for at, name, source in adapter_sources(spec):
        if isinstance(source, LocalSource):
            errors += _config_errors(at, name, local_path(source, base=base), max_rank=lora.max_rank)
    directory = local_catalog(spec, base=base)
    if directory is None:
        return errors
    at = "spec.adapterCatalog.source"
    try:
        catalog = scan_catalog(directory)
    except AdapterError as exc:
        return [*errors, SpecError(at, str(exc))]
    errors += [SpecError(at, f"subdirectory {name!r} cannot name an adapter") for name in catalog.unsafe]
    taken = {spec.model.name, spec.model.public_name, *(a.name for a in spec.adapters)}
    for name, path in catalog.adapters.items():
        if name in taken:
            errors.append(
                SpecError(
                    at, f"adapter {name!r} of the catalog is already the model's or a declared adapter's name"
                )
            )
            continue
        errors += _config_errors(at, name, path, max_rank=lora.max_rank)
    return errors


def _config_errors(at: str, name: str, directory: Path, *, max_rank: int) -> list[SpecError]:
    try:
        problem = config_problem(read_adapter_config(directory), max_rank=max_rank)
    except AdapterError as exc:
        return [SpecError(at, f"adapter {name!r}: {exc}")]
    return [SpecError(at, f"adapter {name!r}: {problem}")] if problem else []


def cluster_adapter_rules(spec: InferenceServiceSpec) -> list[SpecError]:
    """What a cluster cannot serve (the operator, `tandem render`): local paths, which name this
    machine's files (adapters, a catalog, a `file://` tracing endpoint)."""
    errors = [
        SpecError(at, "a local path works with tandem up only; in a cluster use pvc://, hf:// or s3://")
        for at, _, source in adapter_sources(spec)
        if isinstance(source, LocalSource)
    ]
    if spec.adapter_catalog is not None and local_catalog(spec, base=Path(".")) is not None:
        errors.append(
            SpecError(
                "spec.adapterCatalog.source",
                "a local directory works with tandem up only; in a cluster use pvc://claim/path",
            )
        )
    if spec.tracing is not None and spec.tracing.endpoint.startswith("file://"):
        errors.append(
            SpecError(
                "spec.tracing.endpoint",
                "file:// works with tandem up only; in a cluster give an OTLP collector's URL",
            )
        )
    return errors


def adapter_warnings(spec: InferenceServiceSpec) -> list[SpecError]:
    """`hf://` and `s3://` adapters without a shared cache: each engine pod's init container fetches
    them into its own emptyDir (`tandem adapters fetch`), so every pod downloads every one, and again
    when it is re-created; `spec.adapterCache.pvc` makes it one download for the service's pods."""
    if spec.adapter_cache is not None and spec.adapter_cache.pvc is not None:
        return []
    return [
        SpecError(
            at,
            f"{'hf://' if isinstance(source, HfSource) else 's3://'} adapter {name!r} is fetched by every "
            "engine pod on its own: set spec.adapterCache.pvc (a ReadWriteMany claim) to download it once",
        )
        for at, name, source in adapter_sources(spec)
        if isinstance(source, HfSource | S3Source)
    ]


def _router_rules(router: RouterSpec) -> list[SpecError]:
    return access_rules(router.auth, router.tenants, at="spec.router")


def access_rules(auth: AuthSpec, tenants: Sequence[TenantSpec], *, at: str) -> list[SpecError]:
    """A gateway's API keys need their Secret, and a tenant is listed once (`at`: where the two
    fields are, `spec.router` for an InferenceService, `spec` for an InferenceGateway)."""
    errors: list[SpecError] = []
    if auth.enabled and auth.api_keys_secret is None:
        errors.append(SpecError(f"{at}.auth.apiKeysSecret", "is required when auth.enabled is true"))
    seen: set[str] = set()
    for i, tenant in enumerate(tenants):
        if tenant.name in seen:
            errors.append(SpecError(f"{at}.tenants[{i}].name", f"duplicate tenant {tenant.name!r}"))
        seen.add(tenant.name)
    return errors


def parse_inference_service(document: Mapping[str, Any]) -> InferenceService:
    """Validate a whole document (structure, then cross-field rules); raise `SpecInvalid` on errors."""
    try:
        isvc = InferenceService.model_validate(document)
    except ValidationError as exc:
        raise SpecInvalid([from_pydantic_error(err) for err in exc.errors()]) from None
    errors = check_rules(isvc.spec)
    if errors:
        raise SpecInvalid(errors)
    return isvc


def from_pydantic_error(err: Mapping[str, Any]) -> SpecError:
    """A pydantic error as a `SpecError` with a dotted field path (`spec.decode.replicas`)."""
    parts = [str(p) for p in err["loc"]]
    # Pydantic appends the tag of a failed union/literal choice; the field path is what users need.
    path = ".".join(p if not p.isdigit() else f"[{p}]" for p in parts).replace(".[", "[")
    message = str(err["msg"])
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    return SpecError(path or "<document>", _readable(message))


def _readable(message: str) -> str:
    return re.sub(r"^Value error, ", "", message)
