"""Pure planning of the local runtime: InferenceService in → the processes to start, in order.

The plan mirrors what the operator creates in a cluster: a Redis KV pool (unless the spec names an
external one), `prefill.replicas` producer engines, `decode.replicas` consumer engines and one gateway
whose static discovery lists the engines. When a pool has `autoscaling.enabled`, the gateway uses file
discovery instead (`<state dir>/endpoints.json`, written by the local runtime as the autoscaler starts
and drains engines), and `LocalPlan.new_engine` builds the process of any further engine. With
`router.prefixSource: precise` every engine publishes its KV events on Unix sockets named after its
HTTP port (`tandem.core.kvevents.local_addresses`) and the router config says where. With
`engine.lora`, every engine gets vLLM's LoRA flags and environment, its resolver reading
`<state dir>/adapters` (`tandem up` links the local adapters there by name), and the gateway learns
the names beyond `spec.adapters` from the router config: fixed ones (`catalog_adapters`, the
benchmark's), or the names file of a catalog `tandem up` follows (`follow_catalog`). Nothing here
touches the system; ports, binary paths and credentials come in as arguments.

As in a cluster, the managed Redis requires a password and the engines an API key that only the
gateway is given, engines and the gateway share the pool key (keyed chunk hashes, a tag on every
chunk) and the gateway alone holds the salt key it derives tenants' `cache_salt` from
(`LocalCredentials`, drawn at random per run): all reach processes through their environment only
(`TANDEM_KVPOOL_PASSWORD`; `VLLM_API_KEY` for engines, `TANDEM_ENGINE_API_KEY` for the gateway;
`TANDEM_KV_POOL_KEY` for both; `TANDEM_CACHE_KEY` for the gateway), never through argv or the
router's config file.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from tandem.core.adapters import engine_args as lora_args
from tandem.core.adapters import engine_env as lora_env
from tandem.core.kvevents import (
    KVEventsAddresses,
    ipc_folder,
    local_addresses,
    sim_kv_events_args,
    vllm_kv_events_config,
)
from tandem.core.poolengine import PoolName, pool_engine_args, pool_engine_env
from tandem.core.routerconfig import FileDiscovery, RouterConfig, StaticDiscovery
from tandem.core.spec import InferenceService, PoolSpec
from tandem.core.tracing import engine_tracing
from tandem.kvpool.engine_config import PASSWORD_ENV, POOL_KEY_ENV
from tandem.kvpool.redisconf import authenticated_command, pool_config, server_args
from tandem.local.vllm_engine import EngineRole, engine_command, engine_kv_keys, local_connector

Role = Literal["kvpool", "prefill", "decode", "router"]
LOOPBACK = "127.0.0.1"
ENDPOINT_FILE = "endpoints.json"
#: With `engine.lora`: the engines' adapter directory under the state dir (vLLM's
#: VLLM_LORA_RESOLVER_CACHE_DIR), into which `tandem up` links the local adapters by name.
ADAPTER_DIR = "adapters"
#: The adapter names file `tandem up` keeps for a followed local catalog (`adapter_names_path`).
ADAPTER_NAMES_FILE = "adapter-names.json"


#: Where engines read the key they require (vLLM's variable; `tandem sim` reads it too), and where the
#: gateway reads the key it sends them.
ENGINE_KEY_ENV = "VLLM_API_KEY"
GATEWAY_ENGINE_KEY_ENV = "TANDEM_ENGINE_API_KEY"
#: Where the gateway reads the key it derives tenants' cache_salt from (never given to engines).
CACHE_KEY_ENV = "TANDEM_CACHE_KEY"


@dataclass(frozen=True)
class LocalCredentials:
    """The managed Redis' password, the engines' API key and the cache keys of one local run (URL-safe
    strings)."""

    redis_password: str = field(repr=False)
    #: None: engines take requests without a key (`tandem bench`, whose peer routers call them
    #: directly and must see the same engines).
    engine_api_key: str | None = field(repr=False)
    #: The pool secret (`TANDEM_KV_POOL_KEY`) of engines and gateway; None: an unkeyed pool (the
    #: environment's own variable, if any, is inherited).
    pool_key: str | None = field(default=None, repr=False)
    #: The gateway's salt key (`TANDEM_CACHE_KEY`); None: the gateway draws one for its life.
    cache_key: str | None = field(default=None, repr=False)

    @classmethod
    def generate(cls) -> LocalCredentials:
        """Fresh random credentials: 32 random bytes each, URL-safe base64."""
        return cls(
            redis_password=secrets.token_urlsafe(32),
            engine_api_key=secrets.token_urlsafe(32),
            pool_key=secrets.token_urlsafe(32),
            cache_key=secrets.token_urlsafe(32),
        )


class PlanError(ValueError):
    """The InferenceService cannot run locally as it is (the message says why and what to change)."""


@dataclass(frozen=True)
class ProcessPlan:
    """One child process: its argv, its port and how to tell it is ready."""

    name: str
    role: Role
    argv: tuple[str, ...]
    port: int
    probe: Literal["http", "redis"]
    env: dict[str, str] = field(default_factory=dict)
    #: Folders that must exist before it starts (its KV-event sockets' folder).
    dirs: tuple[Path, ...] = ()

    @property
    def url(self) -> str:
        scheme = "redis" if self.probe == "redis" else "http"
        return f"{scheme}://{LOOPBACK}:{self.port}"


#: (role, index, port) → the process of one more engine of that pool.
EngineFactory = Callable[[Literal["prefill", "decode"], int, int], ProcessPlan]


@dataclass(frozen=True)
class LocalPlan:
    processes: tuple[ProcessPlan, ...]
    router_config: RouterConfig
    router_config_path: Path
    endpoint: str
    model: str
    #: Set when a pool is autoscaled: the endpoint file the gateway follows (file discovery).
    endpoint_file: Path | None = None
    #: Builds further engines for the autoscaler (same arguments as the planned ones).
    new_engine: EngineFactory | None = None


def build_plan(
    isvc: InferenceService,
    *,
    ports: Iterator[int],
    router_port: int,
    python: str,
    redis_server: str | None,
    state_dir: Path,
    credentials: LocalCredentials | None = None,
    catalog_adapters: Sequence[str] = (),
    follow_catalog: bool = False,
) -> LocalPlan:
    """The processes that run `isvc` here, in start order (KV pool, engines, gateway).

    `ports` yields free loopback ports for internal components; `redis_server` is the Redis binary
    (None is fine when the spec names an external Redis URL); `credentials` default to fresh ones;
    `catalog_adapters`: adapter names the engines resolve beyond `spec.adapters`, fixed for the
    gateway's life (the router config's `adapterNames`; `tandem bench` gives its generated adapters'
    names); `follow_catalog`: the local catalog's names come from the names file `tandem up` keeps
    (`adapter_names_path`, the router config's `adapterNamesFile`;
    `tandem.local.catalog.CatalogFollower`), so adapters added to the catalog while the stack runs are
    served.
    """
    spec = isvc.spec
    credentials = credentials or LocalCredentials.generate()
    if spec.engine.kind not in ("sim", "vllm"):
        raise PlanError(
            f"engine.kind {spec.engine.kind!r} is not supported by the local runtime; use engine.kind: sim"
        )
    redis, pool_url = _kv_pool(
        isvc, ports=ports, redis_server=redis_server, state_dir=state_dir, password=credentials.redis_password
    )
    engine_env, gateway_env = _credential_envs(credentials, managed_redis=redis is not None)
    events = local_addresses(state_dir) if spec.router.prefix_source == "precise" else None
    adapter_dir = adapter_folder(isvc, state_dir)
    if adapter_dir is not None:  # the resolver's folder; `tandem up` links the adapters into it
        engine_env |= lora_env(str(adapter_dir))
    new_engine = _engine_factory(
        isvc, python=python, pool_url=pool_url, events=events, adapter_dir=adapter_dir, env=engine_env
    )
    engines = [new_engine(role, i, next(ports)) for role, count in _pool_sizes(isvc) for i in range(count)]
    autoscaled = spec.prefill.autoscaling.enabled or spec.decode.autoscaling.enabled
    endpoint_file = state_dir / ENDPOINT_FILE if autoscaled else None
    config = _router_config(
        isvc, discovery=_discovery(engines, endpoint_file), pool_url=pool_url, events=events,
        adapter_dir=adapter_dir, state_dir=state_dir, catalog_adapters=catalog_adapters,
        follow_catalog=follow_catalog,
    )  # fmt: skip
    config_path = state_dir / "router.yaml"
    router = _router_process(python=python, config_path=config_path, port=router_port, env=gateway_env)
    managed_pool = (redis,) if redis is not None else ()
    return LocalPlan(
        processes=(*managed_pool, *engines, router),
        router_config=config,
        router_config_path=config_path,
        endpoint=f"http://{LOOPBACK}:{router_port}/v1",
        model=spec.model.public_name,
        endpoint_file=endpoint_file,
        new_engine=new_engine if autoscaled else None,
    )


def _credential_envs(
    credentials: LocalCredentials, *, managed_redis: bool
) -> tuple[dict[str, str], dict[str, str]]:
    """The engines' and the gateway's environment from `credentials` (module doc): the engine key;
    the pool key for both; the salt key for the gateway alone; with the managed Redis, its password
    for both (an external Redis' password is the environment's own TANDEM_KVPOOL_PASSWORD, inherited)."""
    key = credentials.engine_api_key
    engine_env = {ENGINE_KEY_ENV: key} if key is not None else {}
    gateway_env = {GATEWAY_ENGINE_KEY_ENV: key} if key is not None else {}
    if credentials.pool_key is not None:  # engines key and seal their chunks; the gateway computes the keys
        engine_env[POOL_KEY_ENV] = gateway_env[POOL_KEY_ENV] = credentials.pool_key
    if credentials.cache_key is not None:  # the gateway's alone: an engine could compute tenants' salts
        gateway_env[CACHE_KEY_ENV] = credentials.cache_key
    if managed_redis:
        for env in (engine_env, gateway_env):
            env[PASSWORD_ENV] = credentials.redis_password
    return engine_env, gateway_env


def _kv_pool(
    isvc: InferenceService, *, ports: Iterator[int], redis_server: str | None, state_dir: Path, password: str
) -> tuple[ProcessPlan | None, str]:
    """The KV pool's process and URL: (None, the spec's URL) for an external Redis, else the managed
    Redis on the next of `ports` (raises `PlanError` without a `redis_server` binary)."""
    external = isvc.spec.kv_pool.redis.url
    if external is not None:
        return None, external
    if redis_server is None:
        raise PlanError("no redis-server binary found (install Debian's redis-server)")
    redis = _redis_process(
        isvc, port=next(ports), binary=redis_server, state_dir=state_dir, password=password
    )
    return redis, redis.url


def _engine_factory(
    isvc: InferenceService,
    *,
    python: str,
    pool_url: str,
    events: KVEventsAddresses | None,
    adapter_dir: Path | None,
    env: dict[str, str],
) -> EngineFactory:
    """The builder of every engine's process, planned or added by the autoscaler: `_engine_process`
    with the adapter folder among its dirs, the spec's tracing arguments, and `env` under the tracing
    environment and the spec's engine.env (which wins, as in a cluster)."""
    spec = isvc.spec

    def new_engine(role: Literal["prefill", "decode"], index: int, port: int) -> ProcessPlan:
        engine = _engine_process(
            isvc, role=role, index=index, port=port, python=python, pool_url=pool_url, events=events
        )
        dirs = (*engine.dirs, adapter_dir) if adapter_dir is not None else engine.dirs
        trace_args, trace_env = engine_tracing(spec.tracing, kind=spec.engine.kind)
        return replace(
            engine, argv=(*engine.argv, *trace_args), env={**env, **trace_env, **engine.env}, dirs=dirs
        )

    return new_engine


def _discovery(engines: Sequence[ProcessPlan], endpoint_file: Path | None) -> StaticDiscovery | FileDiscovery:
    """How the gateway finds the engines: the endpoint file when a pool is autoscaled, else the
    planned engines' URLs by pool."""
    if endpoint_file is not None:
        return FileDiscovery(path=str(endpoint_file))
    return StaticDiscovery(
        prefill=[e.url for e in engines if e.role == "prefill"],
        decode=[e.url for e in engines if e.role == "decode"],
    )


def _router_config(
    isvc: InferenceService,
    *,
    discovery: StaticDiscovery | FileDiscovery,
    pool_url: str,
    events: KVEventsAddresses | None,
    adapter_dir: Path | None,
    state_dir: Path,
    catalog_adapters: Sequence[str],
    follow_catalog: bool,
) -> RouterConfig:
    """The gateway's config file: the spec, its discovery, the KV pool, the tokenizer, the engines'
    KV keys (vLLM), the KV-event sockets and, with `engine.lora`, the adapter names (`build_plan`)."""
    spec = isvc.spec
    lora = spec.engine.lora is not None
    return RouterConfig(
        service=isvc.metadata.name,
        spec=spec,
        discovery=discovery,
        kv_pool_url=pool_url,
        tokenizer_path=local_tokenizer_path(isvc),
        engine_kv_keys=engine_kv_keys(isvc) if spec.engine.kind == "vllm" else None,
        kv_events=events,
        adapter_names=list(catalog_adapters) if lora else [],
        adapter_names_file=str(adapter_names_path(state_dir)) if follow_catalog and lora else None,
        # The engines' resolver folder: the gateway copies hot adapters from it (runtime API).
        adapter_load_dir=str(adapter_dir) if adapter_dir is not None else None,
    )


def _router_process(*, python: str, config_path: Path, port: int, env: dict[str, str]) -> ProcessPlan:
    """The gateway: `tandem router` on loopback reading `config_path`."""
    return ProcessPlan(
        name="router",
        role="router",
        argv=(python, "-m", "tandem.cli", "router", "--config", str(config_path),
              "--host", LOOPBACK, "--port", str(port)),
        port=port,
        probe="http",
        env=env,
    )  # fmt: skip


def adapter_names_path(state_dir: Path) -> Path:
    """The gateway's adapter names file of a followed local catalog (`follow_catalog`)."""
    return state_dir / ADAPTER_NAMES_FILE


def adapter_folder(isvc: InferenceService, state_dir: Path) -> Path | None:
    """The engines' adapter directory with `engine.lora` (`<state dir>/adapters`), else None."""
    return state_dir / ADAPTER_DIR if isvc.spec.engine.lora is not None else None


def local_tokenizer_path(isvc: InferenceService) -> str | None:
    """The model's directory for real vLLM (`model.source.path`, made absolute: the gateway reads its
    tokenizer files there); None for the simulator, whose tokenizer the gateway has built in."""
    source = isvc.spec.model.source
    if isvc.spec.engine.kind != "vllm" or source is None or not source.path or source.pvc:
        return None
    return str(Path(source.path).resolve())


def _pool_sizes(isvc: InferenceService) -> tuple[tuple[Literal["prefill", "decode"], int], ...]:
    return (("prefill", isvc.spec.prefill.replicas), ("decode", isvc.spec.decode.replicas))


def _redis_process(
    isvc: InferenceService, *, port: int, binary: str, state_dir: Path, password: str
) -> ProcessPlan:
    """redis-server on loopback with `requirepass` (written by `AUTH_SCRIPT` to `<state dir>/auth.conf`,
    mode 600, from the environment) and protected mode on."""
    config = pool_config(isvc.spec.kv_pool.redis)
    args = server_args(config, port=port, bind=LOOPBACK, data_dir=str(state_dir), protected_mode=True)
    env = {PASSWORD_ENV: password, "REDIS_DATA_DIR": str(state_dir)}
    argv = (*authenticated_command(binary), *args)
    return ProcessPlan(name="redis", role="kvpool", argv=argv, port=port, probe="redis", env=env)


def _engine_process(
    isvc: InferenceService,
    *,
    role: PoolName,
    index: int,
    port: int,
    python: str,
    pool_url: str,
    events: KVEventsAddresses | None,
) -> ProcessPlan:
    spec = isvc.spec
    bind = events.for_engine(f"http://{LOOPBACK}:{port}") if events is not None else None
    folder = ipc_folder(events) if events is not None else None
    dirs = (folder,) if folder is not None else ()
    if spec.engine.kind == "vllm":
        ordinal = index if role == "prefill" else spec.prefill.replicas + index
        engine_role: EngineRole = "prefill" if role == "prefill" else "decode"
        argv, env = engine_command(
            isvc, role=engine_role, ordinal=ordinal, port=port, python=python, pool_url=pool_url
        )
        if bind is not None:
            config = vllm_kv_events_config(endpoint=bind[0], replay=bind[1])
            argv = (*argv, "--kv-events-config", json.dumps(config))
        return ProcessPlan(
            name=f"{role}-{index}", role=role, argv=argv, port=port, probe="http", env=env, dirs=dirs
        )
    kv_role = "producer" if role == "prefill" else "consumer"
    argv = (
        python, "-m", "tandem.cli", "sim",
        "--model", spec.model.name,
        "--served-model-name", spec.model.public_name,
        "--profile", spec.engine.sim.profile,
        "--time-scale", str(spec.engine.sim.time_scale),
        "--kv-role", kv_role,
        "--kv-pool", pool_url,
        "--kv-chunk-size", str(spec.kv_pool.chunk_size),
        "--host", LOOPBACK,
        "--port", str(port),
        *(sim_kv_events_args(endpoint=bind[0], replay=bind[1]) if bind is not None else ()),
        *(lora_args(spec.engine.lora) if spec.engine.lora is not None else ()),
        *pool_engine_args(spec, role),
    )  # fmt: skip
    env = pool_engine_env(spec, role)
    return ProcessPlan(
        name=f"{role}-{index}", role=role, argv=argv, port=port, probe="http", env=env, dirs=dirs
    )


def not_applied_locally(isvc: InferenceService) -> list[tuple[str, str]]:
    """(what, field path) of every setting the spec makes that a local run cannot apply: it starts
    processes on this machine, not pods, so pod templates (placement, labels, volumes, sidecars, the
    engine container's extras) and images mean nothing here, and a multi-node engine runs as one
    process. Per-pool engine args and env are applied (`tandem.core.poolengine`).
    Example: decode with `template.spec.nodeSelector` and `engine.image` →
    [("pod templates", "spec.decode.template"), ("images", "spec.decode.engine.image")]."""
    spec = isvc.spec
    gaps: list[tuple[str, str]] = []
    if spec.engine.template is not None:
        gaps.append(("pod templates", "spec.engine.template"))
    pools: tuple[tuple[PoolName, PoolSpec], ...] = (("prefill", spec.prefill), ("decode", spec.decode))
    for name, pool in pools:
        if pool.template is not None:
            gaps.append(("pod templates", f"spec.{name}.template"))
    if spec.router.template is not None:
        gaps.append(("pod templates", "spec.router.template"))
    if spec.kv_pool.redis.template is not None:
        gaps.append(("pod templates", "spec.kvPool.redis.template"))
    if "image" in spec.engine.model_fields_set:
        gaps.append(("images", "spec.engine.image"))
    for name, pool in pools:
        if pool.engine.image is not None:
            gaps.append(("images", f"spec.{name}.engine.image"))
    for name, pool in pools:
        if pool.multinode:
            gaps.append(("multi-node engines (one process each here)", f"spec.{name}.nodesPerReplica"))
    return gaps


def local_preflight(isvc: InferenceService, *, sim_flags: Collection[str]) -> list[str]:
    """What `tandem up` says before it starts a service (`local_notes`); raises `PlanError` for what
    it cannot run: with `engine.kind: sim`, an engine flag the simulator does not take (`sim_flags`:
    `tandem sim`'s options), which would end the engine at start-up."""
    if isvc.spec.engine.kind == "sim" and (problem := unknown_sim_flag(isvc, sim_flags)) is not None:
        raise PlanError(problem)
    return local_notes(isvc)


def unknown_sim_flag(isvc: InferenceService, known: Collection[str]) -> str | None:
    """The first user engine flag (shared, then prefill's, then decode's) that is not one of `known`,
    as a one-line reason naming its field. Example: spec.engine.args ["--trust-remote-code"] →
    "InferenceService x: spec.engine.args[0]: --trust-remote-code is not a flag of tandem sim ..."."""
    spec = isvc.spec
    told = (
        ("spec.engine.args", spec.engine.args),
        ("spec.prefill.engine.args", spec.prefill.engine.args),
        ("spec.decode.engine.args", spec.decode.engine.args),
    )
    for at, args in told:
        for i, arg in enumerate(args):
            name = arg.split("=", 1)[0]
            if name.startswith("--") and name not in known:
                return (
                    f"InferenceService {isvc.metadata.name}: {at}[{i}]: {name} is not a flag of tandem sim "
                    "(engine.kind sim runs the simulator): drop it for a local run, or use --engine vllm"
                )
    return None


def local_notes(isvc: InferenceService) -> list[str]:
    """What `tandem up` says before it starts a service: what it cannot apply here
    (`not_applied_line`) and, for vLLM, the connector it uses instead of LMCache."""
    notes = [not_applied_line(isvc.metadata.name, not_applied_locally(isvc))]
    if isvc.spec.engine.kind == "vllm":
        notes.append(local_connector(isvc)[1])
    return [note for note in notes if note is not None]


def not_applied_line(name: str, gaps: Sequence[tuple[str, str]]) -> str | None:
    """One warning line for `not_applied_locally`'s answer (None when there is nothing to say).
    Example: "warning: InferenceService demo: not applied locally (processes here, not pods):
    pod templates spec.decode.template; images spec.decode.engine.image"."""
    if not gaps:
        return None
    kinds: dict[str, list[str]] = {}
    for what, path in gaps:
        kinds.setdefault(what, []).append(path)
    parts = "; ".join(f"{what} {', '.join(paths)}" for what, paths in kinds.items())
    return f"warning: InferenceService {name}: not applied locally (processes here, not pods): {parts}"
