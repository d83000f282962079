"""The gateway's effective configuration: the InferenceService's router config (`RouterConfig`, from
the operator's ConfigMap or `tandem up`), the process's tuning (`RouterSettings`, from flags) and the
few facts of the environment (the KV pool's password), resolved once at start-up into one frozen
object that the composition root builds everything from. Nothing below the composition root reads
the environment, flags or the spec directly.

Resolution rules (each one written here, nowhere else):
- served model names: `spec.model.servedName` (or `name`) and `spec.model.name`, and the LoRA
  adapters' (`spec.adapters[].name`, then the router config's `adapterNames`: names fixed for the
  gateway's life, such as the benchmark's), and with `adapterNamesFile` the names that file lists,
  re-read while the gateway runs (`tandem.router.upstream.adapters.AdapterNamesFile`); a request
  naming an adapter goes to the same pools with its `model` unchanged;
- default SLO: `spec.router.slo`; logging prompts: `spec.router.logPrompts` or `--log-prompts`;
- tenant weights: `spec.router.tenants[].weight`, overridden by `--tenant-weight`;
- the KV pool look-ups (P/D decision, barrier): on with a pool URL where the gateway computes the
  engines' own chunk keys (`tandem.kvpool.keys.PoolKeys`): `engine.kind: sim` (Tandem's hash), or
  `vllm` with the model's tokenizer files (`tokenizerPath`: the keys hash the model's own tokens)
  and either connector, the one `engineKvKeys.connector` names, else `spec.kvPool.connector`. The
  keys' other fields come from `tandem.kvpool.engine_keys.engine_pool_keys` over `engine.args`,
  `engine.env`, the pools' `tensorParallel` and the model's `config.json` beside the tokenizer;
  LMCache's also from `engineKvKeys` (the engines' model argument and PYTHONHASHSEED). Off, with
  the reason in `kv_pool_off` (logged at start-up), where they cannot be computed: no tokenizer
  files, LMCache without `engineKvKeys` or without a fixed PYTHONHASHSEED, different world sizes in
  the two pools. `TANDEM_KVPOOL_PASSWORD` from the environment;
- gateway replicas in front of the same engines: `--replicas`, else `spec.router.replicas` with
  Kubernetes discovery, else 1; with `workers` they divide every engine's capacity;
- shared fair-queue counters: through the KV pool's Redis (`kvPoolUrl`, whatever the engine) when
  `--shared-counters redis`, or `auto` with more than one replica and a pool; `redis` without a pool
  stops start-up;
- the prefix source: `--prefix-source`, else `spec.router.prefixSource`; the engines' KV-event
  addresses: per engine URL from `--kv-events` settings' `endpoints`, else the router config's
  `kvEvents` templates (what the operator and `tandem up` made the engines bind), else
  `tcp://{host}:<--kv-events-port>` (and `<replay_port>`);
- the prompt tokenizer: the model's files at `tokenizerPath` when given (a directory without them
  stops start-up), else Tandem's tokenizer: exact for `engine.kind: sim`, an estimate otherwise
  (`tokenizer_exact` False, logged once at start-up).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from tandem.core.kvevents import KVEventsAddresses
from tandem.core.routerconfig import FileDiscovery, KubernetesDiscovery, RouterConfig, StaticDiscovery
from tandem.core.spec import InferenceServiceSpec, ModelSpec, PrefixSourceKind, max_prefill_replicas
from tandem.core.tracing import TracingSpec, settings_from_env
from tandem.kvpool.client import password_from_env, pool_key_from_env
from tandem.kvpool.engine_keys import KeysUnavailable, engine_pool_keys, key_alternatives
from tandem.kvpool.keys import PoolKeys, TandemHash
from tandem.router.errors import ConfigurationError
from tandem.router.settings import KVEventsSettings, RouterSettings
from tandem.router.types import SLO


def served_names(spec: ModelSpec) -> frozenset[str]:
    """The `model` values the gateway accepts: the served (public) name and the model name."""
    return frozenset({spec.public_name, spec.name})


def adapter_names(config: RouterConfig) -> tuple[str, ...]:
    """The LoRA adapters the service's engines serve by name, in order: `spec.adapters`, then the
    router config's `adapterNames` (a catalog's), without repeats or the model's own names."""
    base = served_names(config.spec.model)
    names = (*(a.name for a in config.spec.adapters), *config.adapter_names)
    return tuple(n for n in dict.fromkeys(names) if n not in base)


@dataclass(frozen=True, slots=True, kw_only=True)
class KVPoolAccess:
    """How the gateway reaches the KV pool for P/D decisions and the barrier, and the engines' keys
    (`alternatives`: other layouts the same engines may write, tried when `keys` find nothing)."""

    url: str
    password: str | None
    timeout_s: float
    keys: PoolKeys
    alternatives: tuple[PoolKeys, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedCountersAccess:
    """Where the replicas of one gateway keep their fair-queue counters: a hash `key` in the KV
    pool's Redis, synced every `interval_s`."""

    url: str
    password: str | None
    timeout_s: float
    key: str
    interval_s: float


#: vLLM's default publisher address, on each engine's host; no replay.
DEFAULT_KV_EVENTS = KVEventsAddresses(events="tcp://{host}:5557")


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectiveConfig:
    """Everything one gateway process runs with (module docstring); frozen."""

    service: str
    spec: InferenceServiceSpec
    settings: RouterSettings
    discovery: StaticDiscovery | KubernetesDiscovery | FileDiscovery
    #: Every `model` the gateway accepts: the model's names and its adapters'.
    served_models: frozenset[str]
    default_slo: SLO
    log_prompts: bool
    tenant_weights: Mapping[str, float]
    kv_pool: KVPoolAccess | None
    api_keys_file: Path | None
    tokenizer_path: Path | None
    prefix_source: PrefixSourceKind = "approximate"
    kv_events: KVEventsAddresses = DEFAULT_KV_EVENTS
    replicas: int = 1
    shared_counters: SharedCountersAccess | None = None
    #: Why a configured pool is not looked up (the engines' keys cannot be computed); None otherwise.
    kv_pool_off: str | None = None
    #: The LoRA adapters among `served_models`, in order (`adapter_names`): the fixed ones; those of
    #: `adapter_names_file` join them while the gateway runs.
    adapters: tuple[str, ...] = ()
    #: The names file to follow (`RouterConfig.adapterNamesFile`); None: the fixed names only.
    adapter_names_file: Path | None = None
    #: Where the engines' resolver finds adapters (`RouterConfig.adapterLoadDir`): copies ahead of
    #: requests on; None: off.
    adapter_load_dir: str | None = None
    #: The engines run LMCache over the KV pool (`engines_run_lmcache`): adapter requests are tagged.
    lmcache_engines: bool = False
    #: Traces: the spec's `tracing` under the standard `OTEL_*` variables; None: off.
    tracing: TracingSpec | None = None
    #: The engines put their KV layout in their pool keys' scope (`RouterConfig.kvLayoutInKeys`).
    kv_layout_in_keys: bool = False

    @property
    def lora(self) -> bool:
        """Whether the service may serve LoRA adapters: `spec.engine.lora` is set, or names are given
        (a static configuration naming adapters without the engines' sizing)."""
        return self.spec.engine.lora is not None or bool(self.adapters) or self.adapter_names_file is not None

    @property
    def prefill_pool_possible(self) -> bool:
        """Whether a prefill engine can ever join: the spec can run some (`max_prefill_replicas`), or a
        static list names some. Without one every request is decode-only, and the P/D decision reads
        nothing of the prompt."""
        if max_prefill_replicas(self.spec) > 0:
            return True
        return isinstance(self.discovery, StaticDiscovery) and bool(self.discovery.prefill)

    @property
    def tokenizer_exact(self) -> bool:
        """Whether prompt tokens are the engines' own (model files given, or the simulator)."""
        return self.tokenizer_path is not None or self.spec.engine.kind == "sim"

    def describe(self) -> dict[str, Any]:
        """The log line's view of it at start-up (no secrets)."""
        return {
            "service": self.service,
            "model": self.spec.model.public_name,
            "policy": self.spec.router.policy,
            "disaggregation": self.spec.disaggregation.mode,
            "fairness": self.settings.admission.fairness,
            "prefix_source": self.prefix_source,
            "kv_pool": self.kv_pool is not None,
            "kv_pool_keys": self.kv_pool.keys.scheme.name if self.kv_pool else None,
            "replicas": self.replicas,
            "shared_counters": self.shared_counters is not None,
            "auth": self.api_keys_file is not None,
            "tokenizer": str(self.tokenizer_path) if self.tokenizer_path else "tandem",
            "tokenizer_exact": self.tokenizer_exact,
        }


def resolve(
    config: RouterConfig, settings: RouterSettings, *, environ: Mapping[str, str] | None = None
) -> EffectiveConfig:
    """The effective configuration of `config` and `settings` (module docstring)."""
    env = os.environ if environ is None else environ
    spec = config.spec
    adapters = adapter_names(config)
    kv_pool, kv_pool_off = None, None
    if config.kv_pool_url is not None:
        keys = pool_keys(config, environ=env)
        if isinstance(keys, KeysUnavailable):
            kv_pool_off = keys.reason
        else:
            kv_pool = KVPoolAccess(
                url=config.kv_pool_url,
                password=password_from_env(env),
                timeout_s=settings.disaggregation.kv_pool_timeout_seconds,
                keys=keys,
                alternatives=key_alternatives(keys),
            )
    weights = {t.name: t.weight for t in spec.router.tenants} | dict(settings.admission.tenant_weights)
    admission = settings.admission
    cluster = spec.router.replicas if config.discovery.kind == "kubernetes" else 1
    replicas = admission.replicas or cluster
    shared = None
    wanted = admission.shared_counters == "redis" or (admission.shared_counters == "auto" and replicas > 1)
    if wanted and config.kv_pool_url is not None:
        shared = SharedCountersAccess(
            url=config.kv_pool_url,
            password=password_from_env(env),
            timeout_s=settings.disaggregation.kv_pool_timeout_seconds,
            key=f"tandem:{config.service}:vtc",
            interval_s=admission.counter_sync_seconds,
        )
    elif admission.shared_counters == "redis":
        raise ConfigurationError(
            "--shared-counters redis needs the KV pool's Redis (kvPoolUrl in the router config)"
        )
    return EffectiveConfig(
        service=config.service,
        spec=spec,
        settings=settings,
        discovery=config.discovery,
        served_models=served_names(spec.model) | frozenset(adapters),
        default_slo=SLO(ttft_s=spec.router.slo.ttft_seconds, tpot_s=spec.router.slo.tpot_seconds),
        log_prompts=spec.router.log_prompts or settings.access.log_prompts,
        tenant_weights=MappingProxyType(weights),
        kv_pool=kv_pool,
        api_keys_file=Path(config.api_keys_file) if config.api_keys_file else None,
        tokenizer_path=Path(config.tokenizer_path) if config.tokenizer_path else None,
        prefix_source=settings.scheduling.prefix_source or spec.router.prefix_source,
        kv_events=config.kv_events or _flag_addresses(settings.scheduling.kv_events),
        replicas=replicas,
        shared_counters=shared,
        kv_pool_off=kv_pool_off,
        adapters=adapters,
        adapter_names_file=Path(config.adapter_names_file) if config.adapter_names_file else None,
        adapter_load_dir=config.adapter_load_dir,
        lmcache_engines=engines_run_lmcache(config),
        kv_layout_in_keys=config.kv_layout_in_keys,
        tracing=_tracing(spec, settings, env),
    )


def _tracing(
    spec: InferenceServiceSpec, settings: RouterSettings, environ: Mapping[str, str]
) -> TracingSpec | None:
    """The tracing in effect: the flags over the `OTEL_*` variables over the spec (None: off)."""
    flags = settings.tracing
    base = settings_from_env(spec.tracing, environ)
    if flags.endpoint is None and base is None:
        return None
    values = base.model_dump() if base is not None else {}
    values.update(flags.model_dump(exclude_none=True))
    return TracingSpec.model_validate(values)


def engines_run_lmcache(config: RouterConfig) -> bool:
    """Whether the service's engines run LMCache's connector over the KV pool: real vLLM, a pool, and
    the connector `engineKvKeys` names, else `spec.kvPool.connector`. The gateway then tags each
    adapter and each salted request (`tandem.router.pd.handoff.lmcache_tagged`), whether or not it
    can compute the engines' keys, so that no engine's LMCache stores or loads an adapter's or a
    tenant's KV under another's keys."""
    connector = engines_connector(config)
    return config.spec.engine.kind == "vllm" and config.kv_pool_url is not None and connector == "lmcache"


def engines_connector(config: RouterConfig) -> Literal["tandem", "lmcache"]:
    """The engines' KV connector: the one `engineKvKeys` names, else `spec.kvPool.connector`."""
    told = config.engine_kv_keys
    return told.connector if told is not None else config.spec.kv_pool.connector


def pool_keys(
    config: RouterConfig, *, environ: Mapping[str, str] | None = None
) -> PoolKeys | KeysUnavailable:
    """The chunk keys the engines write to the pool, or why the gateway cannot compute them (module
    docstring). Simulated engines and Tandem's connector key their chain with the pool key the gateway
    shares with them (`TANDEM_KV_POOL_KEY` in `environ`, default this process's; unset: the unkeyed
    chain)."""
    spec = config.spec
    key = pool_key_from_env(os.environ if environ is None else environ)
    if spec.engine.kind == "sim":
        return PoolKeys(model=spec.model.name, chunk_size=spec.kv_pool.chunk_size, scheme=TandemHash(key=key))
    if config.tokenizer_path is None:
        return KeysUnavailable("no tokenizer files (tokenizerPath): prompt tokens are estimates")
    told = config.engine_kv_keys
    connector = engines_connector(config)
    if connector == "lmcache" and told is None:
        return KeysUnavailable(
            "the router config does not say the engines' model argument and PYTHONHASHSEED "
            "(engineKvKeys), which LMCache's keys depend on"
        )
    return engine_pool_keys(
        connector=connector,
        model=told.model if told is not None else spec.model.name,
        chunk_size=spec.kv_pool.chunk_size,
        engine_args=spec.engine.args,
        engine_env={var.name: var.value for var in spec.engine.env},
        tensor_parallel=(spec.prefill.tensor_parallel, spec.decode.tensor_parallel),
        model_config=_model_config(Path(config.tokenizer_path)),
        python_hash_seed=told.python_hash_seed if told is not None else None,
        pool_key=key,
    )


def _model_config(directory: Path) -> dict[str, Any] | None:
    """The model's `config.json` beside its tokenizer; None when absent or unreadable (the engine
    flags or the defaults then decide)."""
    try:
        loaded = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _flag_addresses(settings: KVEventsSettings) -> KVEventsAddresses:
    replay = f"tcp://{{host}}:{settings.replay_port}" if settings.replay_port is not None else None
    return KVEventsAddresses(events=f"tcp://{{host}}:{settings.port}", replay=replay)
