"""The chunk keys vLLM engines write to the KV pool, worked out from how they were started, for a
reader that cannot ask them (the gateway's conditional P/D decision and KV barrier).

`engine_pool_keys` gives the `PoolKeys` of the prefill engines' worker 0, or `KeysUnavailable` with
the reason. Per connector (`tandem.kvpool.engine_config`):

- `tandem` (Tandem's connector): Tandem's chain (`TandemHash`, keyed with the pool key the engines
  hold, `TANDEM_KV_POOL_KEY`, when there is one), the model part `spec.model.name`, dtype
  `engine_kv_dtype`, and the head grid (`connector_plan.HeadGrid`) in place of LMCache's world size
  and worker: world size the pipeline-parallel size, worker 0 (KV head 0 of stage 0). No
  tensor-parallel size: engines of any TP share keys.
- `lmcache` (LMCache 0.5.6's `LMCacheConnectorV1` in vLLM 0.32, `save_unfull_chunk: False`,
  `redis://` remote): with `pre_caching_hash_algorithm: sha256_cbor` (what Tandem configures,
  `engine_config.lmcache_env`; the engines' `LMCACHE_PRE_CACHING_HASH_ALGORITHM` in `engine_env`
  overrides it) LMCache's sha256_cbor chain from its NONE_HASH of the engines' PYTHONHASHSEED string
  (`tandem.core.kvkeys.lmcache_cbor_none_hash`; unset is fine); with `builtin`, the builtin-hash
  chain (`lmcache_none_hash`; none without a numeric PYTHONHASHSEED). The model part vLLM's
  `model_config.model` (the model argument the engines were started with), world size
  `parallel_config.world_size` = tensor × pipeline × prefill-context parallel, or 1 for MLA models
  (LMCache's `save_only_first_rank`, on by default for MLA, collapses it and only rank 0 writes),
  dtype LMCache's name of vLLM's KV cache torch dtype (`lmcache_kv_dtype`).

LMCache puts the world size in its keys, so its decode engines find the prefill engines' chunks only
when both pools run the same world size (the spec refuses unequal TP with it); otherwise the pool
cannot hand KV over at all and the look-ups are off too. Tandem's keys differ only when the pools'
pipeline parallel sizes do. Pure: engine arguments, environment and the model's `config.json` in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from tandem.core.engineargs import arg_value
from tandem.core.kvkeys import (
    ChunkHashScheme,
    LMCache03Hash,
    LMCacheCborHash,
    LMCacheHash,
    TandemHash,
    lmcache_cbor_none_hash,
    lmcache_none_hash,
)
from tandem.kvpool.connector_plan import engine_kv_dtype
from tandem.kvpool.engine_config import LMCACHE_HASH_ALGORITHM, LMCACHE_HASH_ENV
from tandem.kvpool.keys import PoolKeys

__all__ = [
    "KeysUnavailable",
    "engine_pool_keys",
    "key_alternatives",
    "lmcache_kv_dtype",
    "parallel_sizes",
    "uses_mla",
]

#: vLLM 0.32's `--kv-cache-dtype` values of a float cache: named as the model dtype is
#: (`connector_plan.engine_kv_dtype`, which reads the flag first).
_FLOAT_CACHE_DTYPES = frozenset({"half", "float16", "bfloat16", "float", "float32"})
#: Its other values → torch dtype (`STR_DTYPE_TO_TORCH_DTYPE`) → LMCache's name of it
#: (`TORCH_DTYPE_TO_STR_DTYPE`): quantised caches are stored as uint8 tensors.
_QUANTISED_CACHE_DTYPE = {
    "fp8": "uint8",
    "fp8_e4m3": "uint8",
    "fp8_e5m2": "uint8",
    "fp8_per_token_head": "uint8",
    "fp8_ds_mla": "uint8",
    "nvfp4_ds_mla": "uint8",
    "int4_per_token_head": "uint8",
    "int8": "int8",
    "int8_per_token_head": "int8",
    "fp8_inc": "fp8_e4m3fn",
}
#: vLLM 0.32's DeepSeek-style MLA model types (`ModelArchConfigConvertor.is_deepseek_mla`).
_MLA_MODEL_TYPES = frozenset(
    {
        "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41", "dots3_note",
        "deepseek_mtp", "k3_dspark", "glm5_next", "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite",
        "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash", "pangu_ultra_moe",
        "pangu_ultra_moe_mtp", "bailing_hybrid", "bailing_hybrid_mtp", "bailing_hybrid_v3_mtp", "hy_v4",
        "hy_v4_mtp",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class KeysUnavailable:
    """Why a reader cannot compute the engines' keys (one sentence, for a log line)."""

    reason: str


def parallel_sizes(engine_args: Sequence[str], *, tensor_parallel: int) -> tuple[int, int, int]:
    """(tensor, pipeline, prefill-context) parallel sizes of a vLLM engine: `tensor_parallel` (the
    pool's `tensorParallel`) unless `engine_args` say otherwise, as they come last on the command
    line. Raises ValueError for a value that is not a positive integer."""
    flags = (
        (("--tensor-parallel-size", "-tp"), str(tensor_parallel)),
        (("--pipeline-parallel-size", "-pp"), "1"),
        (("--prefill-context-parallel-size", "-pcp"), "1"),
    )
    sizes = []
    for names, default in flags:
        text = arg_value(engine_args, *names) or default
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{names[0]} must be a positive integer, got {text!r}")
        sizes.append(int(text))
    return sizes[0], sizes[1], sizes[2]


def lmcache_kv_dtype(engine_args: Sequence[str], model_config: Mapping[str, object] | None) -> str | None:
    """The dtype part of LMCache's keys (`TORCH_DTYPE_TO_STR_DTYPE` of vLLM's
    `get_kv_cache_torch_dtype`): `--kv-cache-dtype` unless `auto` (e.g. `fp8` → `uint8`), else the
    model dtype as `engine_kv_dtype` reads it; None for a cache dtype this table does not know."""
    cache = arg_value(engine_args, "--kv-cache-dtype")
    if cache is not None and cache != "auto" and cache not in _FLOAT_CACHE_DTYPES:
        return _QUANTISED_CACHE_DTYPE.get(cache)
    return engine_kv_dtype(engine_args, model_config)


def uses_mla(model_config: Mapping[str, object] | None, engine_env: Mapping[str, str]) -> bool:
    """Whether vLLM 0.32 runs the model with MLA (`ModelConfig.use_mla`): a DeepSeek-style MLA
    `model_type` with its `kv_lora_rank` (or DeepSeek-V4's `compress_ratios` and `head_dim`) in the
    text config, a causal one, and `VLLM_MLA_DISABLE` not set to a non-zero integer."""
    try:
        if int(engine_env.get("VLLM_MLA_DISABLE", "0")):
            return False
    except ValueError:
        pass  # vLLM itself refuses to start on such a value
    config = model_config or {}
    text = config.get("text_config")
    text = text if isinstance(text, Mapping) else config
    if text.get("model_type") not in _MLA_MODEL_TYPES or text.get("is_causal", True) is False:
        return False
    if "compress_ratios" in text:
        return text.get("head_dim") is not None
    return text.get("kv_lora_rank") is not None


def engine_pool_keys(
    *,
    connector: Literal["tandem", "lmcache"],
    model: str,
    chunk_size: int,
    engine_args: Sequence[str],
    engine_env: Mapping[str, str],
    tensor_parallel: tuple[int, int],
    model_config: Mapping[str, object] | None,
    python_hash_seed: str | None,
    pool_key: bytes | None = None,
) -> PoolKeys | KeysUnavailable:
    """The keys of worker 0 of the prefill engines (module docstring). `model`: the key's model part
    (what the engines were started with); `tensor_parallel`: the (prefill, decode) pools'
    `tensorParallel`; `python_hash_seed`: the engines' PYTHONHASHSEED (None: unset); `pool_key`: the
    engines' pool key (Tandem's connector only; LMCache's keys are never keyed)."""
    try:
        prefill, decode = (parallel_sizes(engine_args, tensor_parallel=tp) for tp in tensor_parallel)
    except ValueError as exc:
        return KeysUnavailable(f"cannot read the engines' parallel sizes: {exc}")
    if connector == "tandem":
        world = (prefill[1], decode[1])  # HeadGrid.key_world_size: the pipeline stages
        dtype: str | None = engine_kv_dtype(engine_args, model_config)
        scheme: ChunkHashScheme = TandemHash(key=pool_key)
    else:
        lmcache_scheme = _lmcache_scheme(
            engine_env.get(LMCACHE_HASH_ENV, LMCACHE_HASH_ALGORITHM), python_hash_seed
        )
        if isinstance(lmcache_scheme, KeysUnavailable):
            return lmcache_scheme
        scheme = lmcache_scheme
        mla = uses_mla(model_config, engine_env)
        world = (1, 1) if mla else (math.prod(prefill), math.prod(decode))
        dtype = lmcache_kv_dtype(engine_args, model_config)
    if dtype is None:
        return KeysUnavailable("the engines' --kv-cache-dtype is not one whose LMCache name is known")
    if world[0] != world[1]:
        what = "pipeline parallel sizes" if connector == "tandem" else "world sizes"
        sizes = (prefill[1], decode[1]) if connector == "tandem" else world
        return KeysUnavailable(
            f"prefill and decode engines run {what} {sizes[0]} and {sizes[1]}: the pool's keys "
            f"carry it, so decode engines cannot read the prefill engines' chunks"
        )
    return PoolKeys(model=model, chunk_size=chunk_size, dtype=dtype, world_size=world[0], scheme=scheme)


def _lmcache_scheme(
    algorithm: str, python_hash_seed: str | None
) -> LMCacheHash | LMCacheCborHash | KeysUnavailable:
    """LMCache 0.5.6's chain for `pre_caching_hash_algorithm` (module docstring). LMCache 0.5.6 reads
    `sha256_cbor_64bit` as `sha256_cbor` (vLLM's rename)."""
    legacy = lmcache_none_hash(python_hash_seed)
    if algorithm in ("sha256_cbor", "sha256_cbor_64bit"):
        return LMCacheCborHash(lmcache_cbor_none_hash(python_hash_seed), builtin_none_hash=legacy)
    if algorithm != "builtin":
        return KeysUnavailable(
            f"the engines' LMCache pre_caching_hash_algorithm is {algorithm!r}: the gateway computes "
            "LMCache's keys for sha256_cbor (Tandem's setting) and builtin only"
        )
    if legacy is None:
        return KeysUnavailable(
            f"the engines' PYTHONHASHSEED is {python_hash_seed or 'unset'}: LMCache's chunk hashes "
            "are random per engine process (set one number on every engine, e.g. 0)"
        )
    return LMCacheHash(legacy)


def key_alternatives(keys: PoolKeys) -> tuple[PoolKeys, ...]:
    """Other layouts the same engines may write, for a reader to try when `keys` find nothing: for
    LMCache's, LMCache 0.3's (the default image's; `tandem.core.kvkeys.LMCache03Hash`), same model
    part and world size, from the builtin NONE_HASH of the engines' PYTHONHASHSEED (LMCache 0.3 knows
    `sha256_cbor_64bit` and `sha256` only and falls back to Python's hash for `sha256_cbor`; none
    without a numeric seed). None for Tandem's own keys."""
    scheme = keys.scheme
    if isinstance(scheme, LMCacheHash):
        return (replace(keys, scheme=LMCache03Hash(scheme.none_hash)),)
    if isinstance(scheme, LMCacheCborHash) and scheme.builtin_none_hash is not None:
        return (replace(keys, scheme=LMCache03Hash(scheme.builtin_none_hash)),)
    return ()
