"""Plain data for the scheduling tests: endpoints, snapshots, candidates and requests, built in one line."""

from __future__ import annotations

from collections.abc import Sequence

from tandem.router.scheduling.plugins import Candidate, Cycle
from tandem.router.types import (
    DEFAULT_SLO,
    SLO,
    Endpoint,
    EndpointSnapshot,
    EngineReading,
    EngineStats,
    Pool,
    RequestView,
    Route,
)

A, B, C, D = (Endpoint("decode", f"http://10.0.0.{i}:8000") for i in (1, 2, 3, 4))


def request(
    tokens: Sequence[int] = (), *, request_id: str = "r", slo_ttft_s: float | None = None
) -> RequestView:
    return RequestView(
        request_id=request_id,
        route=Route.COMPLETIONS,
        tenant="default",
        prompt_token_ids=tuple(tokens),
        slo=DEFAULT_SLO if slo_ttft_s is None else SLO(ttft_s=slo_ttft_s, tpot_s=0.05),
    )


def stats(
    *,
    running: int = 0,
    waiting: int = 0,
    kv_usage: float | None = 0.0,
    block_size: int | None = 16,
    num_gpu_blocks: int | None = 1000,
    tokens: float | None = None,
    served: float | None = None,
    started: float | None = None,
    preemptions: float | None = None,
) -> EngineStats:
    return EngineStats(
        running=running,
        waiting=waiting,
        kv_usage=kv_usage,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        tokens=tokens,
        served=served,
        started=started,
        preemptions=preemptions,
    )


def snapshot(
    endpoint: Endpoint, *, in_flight: int = 0, engine: EngineStats | None = None, stale: bool = False
) -> EndpointSnapshot:
    reading = None if engine is None else EngineReading(stats=engine, scraped_at=0.5, stale=stale)
    return EndpointSnapshot(
        endpoint=endpoint, in_flight=in_flight, consecutive_failures=0, in_rotation=True, engine=reading
    )


def candidate(
    endpoint: Endpoint,
    *,
    load: float = 0.0,
    kv_usage: float | None = None,
    matched: int = 0,
    fill: float = 0.0,
    predicted_ttft_s: float = 0.1,
    in_flight: int = 0,
    queued: int = 0,
) -> Candidate:
    return Candidate(
        snapshot=snapshot(endpoint, in_flight=in_flight),
        url=endpoint.url,
        load=load,
        kv_usage=kv_usage,
        matched_tokens=matched,
        cache_fill=fill,
        queued_tokens=queued,
        tokens_per_second=10_000.0,
        predicted_ttft_s=predicted_ttft_s,
    )


def cycle(*, prompt_tokens: int = 1000, slo_ttft_s: float = 1.0, pool: Pool = "decode") -> Cycle:
    return Cycle(
        pool=pool, profile="prompt", request=request(), prompt_tokens=prompt_tokens, slo_ttft_s=slo_ttft_s
    )


def host(endpoint: Endpoint) -> str:
    """`10.0.0.1` for A: short names in assertions."""
    return endpoint.url.split("//")[1].split(":")[0]
