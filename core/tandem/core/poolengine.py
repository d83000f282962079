"""How a pool's engine settings combine with the shared ones: one rule for the operator's pods and for
`tandem up`'s processes.

Pure. `spec.engine.args` / `spec.engine.env` apply to both pools; `spec.<pool>.engine` adds to them:

- args: the pool's come after the shared ones (vLLM's and `tandem sim`'s parsers keep the last value
  of a flag given twice, so a pool's flag overrides a shared one). Example: shared
  `[--max-num-seqs, 128]`, decode `[--max-num-seqs, 256]` → decode runs
  `[--max-num-seqs, 128, --max-num-seqs, 256]`, i.e. 256; prefill keeps 128.
- env: by name, the pool's value over the shared one; names keep their first position, a pool's new
  names follow. Example: shared {A: 1, B: 2}, pool {B: 3, C: 4} → {A: 1, B: 3, C: 4}.
- image: the pool's when set, else the shared one (a cluster's only: `tandem up` runs processes;
  the operator's `tandem.operator.resources.kvlayout.pool_image`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from tandem.core.spec import EnvVar, InferenceServiceSpec, PoolSpec

PoolName = Literal["prefill", "decode"]


def pool_section(spec: InferenceServiceSpec, pool: PoolName) -> PoolSpec:
    """`spec.prefill` or `spec.decode`."""
    return spec.prefill if pool == "prefill" else spec.decode


def pool_engine_args(spec: InferenceServiceSpec, pool: PoolName) -> list[str]:
    """The user's engine arguments of one pool: the shared ones, then the pool's (module docstring)."""
    return [*spec.engine.args, *pool_section(spec, pool).engine.args]


def merged_env(*layers: Iterable[EnvVar]) -> dict[str, str]:
    """Name → value, a later layer's value winning on a name clash (module docstring)."""
    env: dict[str, str] = {}
    for layer in layers:
        env |= {var.name: var.value for var in layer}
    return env


def pool_engine_env(spec: InferenceServiceSpec, pool: PoolName) -> dict[str, str]:
    """The user's engine environment of one pool: the shared variables, the pool's over them."""
    return merged_env(spec.engine.env, pool_section(spec, pool).engine.env)
