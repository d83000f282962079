"""The built-in workloads by name, and building one from `--param key=value` overrides (pure but for
the trace workloads, which read their file).

| name | generator | module |
| --- | --- | --- |
| `shared-prefix` | SGLang's generated-shared-prefix | `tandem.bench.workloads` |
| `two-tenant` | a heavy and a light tenant (VTC overload) | `tandem.bench.workloads` |
| `flood` | a closed-loop heavy tenant and a Poisson light one (isolation) | `tandem.bench.generators` |
| `multi-turn` | conversations resending their history | `tandem.bench.generators` |
| `tenant-skew` | Zipf-distributed tenants | `tandem.bench.generators` |
| `burst` | on/off load | `tandem.bench.generators` |
| `ramp` | idle → peak → idle | `tandem.bench.generators` |
| `azure-trace` | Azure LLM inference CSV replay | `tandem.bench.traces` |
| `mooncake-trace` | Mooncake JSONL replay, prefixes from hash ids | `tandem.bench.traces` |
| `multi-adapter` | Zipf-popular LoRA adapters and a hot-adapter burst | `tandem.bench.adapters` |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from tandem.bench import adapters, generators, traces
from tandem.bench.workloads import (
    Params,
    SharedPrefixParams,
    TwoTenantParams,
    Workload,
    WorkloadError,
    shared_prefix,
    two_tenant,
)


@dataclass(frozen=True)
class WorkloadKind:
    """A built-in generator: its parameter model and the function that builds it."""

    name: str
    summary: str
    params: type[Params]
    build: Callable[[Any, int], Workload]


def _kind(name: str, summary: str, params: type[Params], build: Callable[..., Workload]) -> WorkloadKind:
    return WorkloadKind(name, summary, params, lambda p, seed: build(p, seed=seed))


WORKLOADS: Mapping[str, WorkloadKind] = MappingProxyType(
    {
        k.name: k
        for k in (
            _kind("shared-prefix", "groups sharing long system prompts (SGLang generated-shared-prefix)",
                  SharedPrefixParams, shared_prefix),
            _kind("two-tenant", "a heavy and a light tenant (x-tenant-id), Poisson arrivals (VTC overload)",
                  TwoTenantParams, two_tenant),
            _kind("flood", "a heavy tenant holding N requests open (closed loop) and a light Poisson one",
                  generators.FloodParams, generators.flood),
            _kind("multi-turn", "conversations whose turns resend the growing history",
                  generators.MultiTurnParams, generators.multi_turn),
            _kind("tenant-skew", "Zipf-distributed tenants, Poisson arrivals",
                  generators.TenantSkewParams, generators.tenant_skew),
            _kind("burst", "on/off load", generators.BurstParams, generators.burst),
            _kind("ramp", "idle, linear ramp to a peak, back to idle",
                  generators.RampParams, generators.ramp),
            _kind("azure-trace", "replay of an Azure LLM inference CSV (sample shipped)",
                  traces.TraceParams, traces.azure_workload),
            _kind("mooncake-trace", "replay of a Mooncake JSONL, prefixes shared as its hash ids say",
                  traces.MooncakeParams, traces.mooncake_workload),
            _kind("multi-adapter", "Zipf-popular LoRA adapters (model = adapter), a hot-adapter burst",
                  adapters.MultiAdapterParams, adapters.multi_adapter),
        )
    }
)  # fmt: skip


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """`["groups=8", "system-prompt-tokens=512"]` → `{"groups": "8", "system_prompt_tokens": "512"}`."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise WorkloadError(f"--param {pair!r}: expected key=value")
        overrides[key.strip().replace("-", "_")] = value.strip()
    return overrides


def make_workload(name: str, overrides: Mapping[str, str], *, seed: int) -> Workload:
    """Build the built-in workload `name` with parameter `overrides` (strings, coerced and checked).

    Raises WorkloadError naming an unknown workload, an unknown parameter or a bad value.
    """
    kind = WORKLOADS.get(name)
    if kind is None:
        raise WorkloadError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    try:
        params = kind.params.model_validate(dict(overrides))
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc'])}: "
            f"{'unknown parameter' if e['type'] == 'extra_forbidden' else e['msg']}"
            for e in exc.errors()
        ]
        raise WorkloadError(f"workload {name}: " + "; ".join(problems)) from None
    return kind.build(params, seed)
