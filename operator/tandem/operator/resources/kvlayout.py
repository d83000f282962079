"""The KV-layout label: which engine pods can hand KV to each other. Pure.

Every engine pod carries `tandem.dev/kv-layout: <hash>`, the same value on both pools' pods of one
generation. The hash covers everything that makes one engine's KV unreadable to another, in either
pool: the engine kind, the model (its argument and name), each pool's image, the connector, the
pool's chunk size, the PYTHONHASHSEED, the KV-relevant arguments and variables of `spec.engine`
(`tandem.core.podtemplate.KV_FLAGS`, `KV_ENV`: dtype, KV-cache dtype, block size, quantisation,
revision, tokenizer, attention backend, pipeline and context parallel sizes; a pool's own
arguments may not set them), the simulator's profile, and each pool's tensor-parallel size when the
keys carry it: LMCache's connector puts the world size in its keys; Tandem's connector stores KV per
KV head on a grid that does not depend on TP, so with it (engine kind vllm) TP is not hashed
(`tandem.kvpool.engine_keys`).

So a change to any of these in either pool changes the label of both pools: both roll, and while
they do, old and new pods carry different labels, which lets a gateway pair a prefill engine only
with a decode engine of its own generation. What does not change KV (replicas, resources,
placement, batch sizes) does not change it.

    kv_layout(spec, images) → "3f1c0a9e5b7d2c41"
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tandem.core.engineargs import arg_value
from tandem.core.podtemplate import KV_ENV, KV_ENV_PREFIXES, KV_FLAGS, flag_name
from tandem.core.spec import InferenceServiceSpec, engine_hash_seed
from tandem.operator.resources.meta import Images

KV_LAYOUT_LABEL = "tandem.dev/kv-layout"


def pool_image(spec: InferenceServiceSpec, pool: str, images: Images) -> str:
    """The engine image of `pool` (`prefill` or `decode`): its own, else spec.engine.image (kind
    vllm) or the Tandem image (kind sim)."""
    own = (spec.prefill if pool == "prefill" else spec.decode).engine.image
    return own or (spec.engine.image if spec.engine.kind == "vllm" else images.tandem)


def kv_facts(spec: InferenceServiceSpec, images: Images, *, model: str) -> dict[str, Any]:
    """What the label hashes (module docstring); `model`: the engines' model argument."""
    engine = spec.engine
    args = [_normalised(arg) for arg in engine.args]
    return {
        "kind": engine.kind,
        "model": model,
        "name": spec.model.name,
        "connector": spec.kv_pool.connector,
        "chunkSize": spec.kv_pool.chunk_size,
        "hashSeed": engine_hash_seed(spec),
        "args": {flag: arg_value(args, flag) for flag in KV_FLAGS if _given(args, flag)},
        "env": {
            v.name: v.value for v in engine.env if v.name in KV_ENV or v.name.startswith(KV_ENV_PREFIXES)
        },
        "profile": engine.sim.profile if engine.kind == "sim" else None,
        "pools": {
            pool: {"image": pool_image(spec, pool, images)} | _tensor_parallel(spec, section.tensor_parallel)
            for pool, section in (("prefill", spec.prefill), ("decode", spec.decode))
        },
    }


def _tensor_parallel(spec: InferenceServiceSpec, size: int) -> dict[str, int]:
    """A pool's TP, when it changes the keys: LMCache's (and the simulator's label as before) carry the
    world size; Tandem's connector stores KV per head on a TP-independent grid, so vLLM engines of any
    TP read each other's chunks and a TP change alone does not roll the other pool."""
    if spec.engine.kind == "vllm" and spec.kv_pool.connector == "tandem":
        return {}
    return {"tensorParallel": size}


def kv_layout(spec: InferenceServiceSpec, images: Images, *, model: str) -> str:
    """The label's value: 16 hex digits of the SHA-256 of `kv_facts` as sorted JSON."""
    text = json.dumps(kv_facts(spec, images, model=model), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _normalised(arg: str) -> str:
    """`--kv_cache_dtype=fp8` → `--kv-cache-dtype=fp8`, as vLLM reads it; values unchanged."""
    name = flag_name(arg)
    if name is None:
        return arg
    _, equals, value = arg.partition("=")
    return f"{name}{equals}{value}"


def _given(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)
