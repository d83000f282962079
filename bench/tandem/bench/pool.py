"""What every target of a `tandem bench` harness run meets, as data (pure): the simulated pool's settings,
the binaries the harness starts, and the InferenceService and credentials a run plans from.

`tandem.bench.harness` plans each target's processes from these (`tandem.local.plan.build_plan`) and
starts them; nothing here starts, reads or writes anything, so every target of a run gets the same
engines (same profile, count, flags, time scale and seed) from the same `PoolSettings`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from tandem.core.spec import InferenceService
from tandem.core.specrules import parse_inference_service
from tandem.local.plan import LocalCredentials


@dataclass(frozen=True)
class PoolSettings:
    """The simulated pool every target runs against.

    `engines`: decode engines (1 for `direct`); `prefill_engines` only with `pd`; `time_scale`:
    simulated seconds per wall second; `engine_args`: extra `tandem sim` flags for every engine;
    `router_args`: extra `tandem router` flags for Tandem's gateway (e.g. admission limits);
    `warmup_requests`: requests sent through the gateway before a `restarted` or `warm` start's run
    (`Target.start`);
    `declare_capacity`: whether Tandem's gateway reads the engines' `--max-num-seqs` from its spec. By
    default it does not: the engines get every `engine_args` flag, the gateway's copy of the spec has
    no `--max-num-seqs`, so it learns each engine's capacity as it would in front of engines started
    elsewhere or left at vLLM's default (`tandem.router.discovery.capacity`);
    `slo_ttft_s`/`slo_tpot_s`: the objectives the benchmark scores, in engine seconds. Tandem's gateway
    gets them as `spec.router.slo` in **wall** seconds (÷ time scale), since it measures and predicts
    in wall time: its early rejection and queue deadlines then aim at the objectives the table scores.
    `max_loras`: LoRA on the engines (`spec.engine.lora`: `--enable-lora --max-loras N`, the filesystem
    resolver's environment reading `<run dir>/adapters`), None: no LoRA; `max_cpu_loras`: their CPU
    tier (`maxCpuLoras`; None: vLLM's default, `max_loras`); `adapters`: the adapter names
    written there as config-only adapters (`tandem.bench.adapters.write_adapter_folder`, rank
    `adapter_rank`) and given to Tandem's gateway as the router config's `adapterNames`.
    """

    engines: int = 4
    prefill_engines: int = 1
    pd: bool = False
    profile: str = "qwen2.5-7b-h100"
    time_scale: float = 1.0
    model: str = "qwen"
    engine_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()
    seed: int = 0
    slo_ttft_s: float = 1.0
    slo_tpot_s: float = 0.1
    declare_capacity: bool = False
    warmup_requests: int = 16
    max_loras: int | None = None
    max_cpu_loras: int | None = None
    adapters: tuple[str, ...] = ()
    adapter_rank: int = 8

    def describe(self) -> str:
        pools = f"{self.engines} decode"
        if self.pd:
            pools = f"{self.prefill_engines} prefill + {pools} (P/D)"
        return f"{pools} simulated engines, profile {self.profile}"


@dataclass(frozen=True)
class Tools:
    """Binaries the harness starts: the Python that runs `tandem`, redis-server, vllm-router."""

    python: str
    redis_server: str | None
    vllm_router: str | None


def _lora(pool: PoolSettings) -> dict[str, int]:
    """`spec.engine.lora` for a pool with LoRA: `maxLoras`, and `maxCpuLoras` when set."""
    lora = {"maxLoras": pool.max_loras or 1}
    if pool.max_cpu_loras is not None:
        lora["maxCpuLoras"] = pool.max_cpu_loras
    return lora


def bench_service(
    pool: PoolSettings, *, policy: str, direct: bool, prefix_source: str = "approximate"
) -> InferenceService:
    """The InferenceService a run plans from (pure); `direct` means one decode engine, no P/D;
    `prefix_source: precise` makes the engines publish KV events (the gateway subscribes)."""
    pd = pool.pd and not direct
    document = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "bench"},
        "spec": {
            "model": {"name": pool.model},
            "engine": {
                "kind": "sim",
                "sim": {"profile": pool.profile, "timeScale": pool.time_scale},
                "args": ["--seed", str(pool.seed), *pool.engine_args],
                **({"lora": _lora(pool)} if pool.max_loras is not None else {}),
            },
            "prefill": {"replicas": pool.prefill_engines if pd else 0},
            "decode": {"replicas": 1 if direct else pool.engines},
            "disaggregation": {"mode": "always" if pd else "off"},
            "router": {
                "policy": policy,
                "prefixSource": prefix_source,
                "slo": {
                    "ttftSeconds": round(pool.slo_ttft_s / pool.time_scale, 6),
                    "tpotSeconds": round(pool.slo_tpot_s / pool.time_scale, 6),
                },
            },
        },
    }
    return parse_inference_service(document)


def bench_credentials() -> LocalCredentials:
    """One run's credentials. Engines without an API key: the peer routers call them directly, and
    every target must meet the same engines (the managed Redis still has its password). One salt key
    (`TANDEM_CACHE_KEY`) for every Tandem gateway of the run, as `tandem up` and the operator's Secret
    give: replicas, and a gateway restarted in front of warm engines (`--start restarted`), salt a
    tenant's prompts alike and so reuse each other's cache entries."""
    return LocalCredentials(
        redis_password=secrets.token_urlsafe(32), engine_api_key=None, cache_key=secrets.token_urlsafe(32)
    )
