"""The P/D step of a generation request: whether to disaggregate, the prefill, and the KV barrier.

**Decision** (`tandem.router.pd.decision.decide`, pure; `tandem_router_pd_decisions_total{decision,reason}`):

    mode off                              → decode_only  (off)
    an adapter's, pool keys without adapters → decode_only  (adapter)
    pre-empting, uncached < minUncachedTokens → decode_only (preempting; the swap, below)
    prefill pool busy (below)             → decode_only  (prefill_busy)
    mode always                           → disaggregate (always)
    mode auto, no prefill endpoint        → decode_only  (no_prefill_pool)
    mode auto, KV pool configured but down → decode_only (pool_unavailable)
    mode auto, uncached < minUncachedTokens → decode_only (few_uncached)
    mode auto, otherwise                  → disaggregate (many_uncached)

**Adapters.** Tandem's pool keys (the simulator, Tandem's connector: `TandemHash`) are rooted in the
request's scope, its salt and its LoRA adapter (`PoolScope`, `tandem.core.kvkeys.scope_root`), so an
adapter's request is disaggregated like any other: the look-up and the barrier ask for the chunks of
the adapter's scope (`pool_scope`), which its prefill writes and its decode loads, and never another
adapter's or the base model's. LMCache 0.5.6's chains carry no adapter nor salt (vLLM #44250), but
its keys carry the request's tags: the gateway tags every adapter and salted request to LMCache
engines (`kv_transfer_params: {"lmcache.tag.lora": <adapter>, "lmcache.tag.salt": <salt's hash>}`,
`tandem.router.pd.handoff`), prefill and decode alike, so the adapter's (and the tenant's) chunks
are its own keys (`...@bfloat16@lora%sql@salt%<32 hex>`), which the look-up and the barrier compute too
(`tandem.core.kvkeys.lmcache_tags`). Where the pool's keys cannot carry
an adapter (LMCache 0.3's: `carries_adapter` is False), or the gateway computes no keys at all (no
pool configured, or the engines' keys unknown), it stays decode-only (`adapter`): a prefill might
store the adapter's KV under keys the base model's and every other adapter's requests load.

**The swap** (`--preemption-swap on`, off by default). A request that took its slot by pre-empting a
stream (`Grant.stopped_on`) goes to the decode engine where that stream ran, whose blocks its abort
has just freed (`pipeline.stages.Pick`; one under a LoRA adapter goes where the adapter placement
sends it), and is decided there as mode `auto` would, in any mode: with fewer than
`minUncachedTokens` uncached tokens it is computed on that engine at once, in the stopped stream's
place, instead of waiting for a prefill, the KV barrier and the KV load while requests sent ahead of
their slots (the handover's lead) take the freed blocks. Requests of other tenants waiting there
without an answer make room for it (`Recalls.make_room`). A pre-emption is rare (a tenant's only
waiting request, within its share), so the decode engine computes few such prompts. Example: a
light tenant's 286-token question pre-empts a heavy stream on decode engine B under mode `always`:
it goes decode-only to B (`preempting`); a 4,000-token one is prefilled elsewhere and decoded on B.

**Convertible decoders** (`spec.disaggregation.convertibleDecoders`, on by default; TokenScale's idea,
arXiv 2512.03416): a request about to be disaggregated goes decode-only instead when the prefill pool is
short of capacity, i.e. the best predicted time to first token over the prefill endpoints in rotation
exceeds the prefill's share of the request's TTFT objective (`PREFILL_SHARE`, half: the KV handoff and
the decode engine's first step take the rest, and a prediction made while a burst arrives runs behind
the queue it is building) *and* the chosen decode endpoint, computing the prompt itself, would be
faster (`TTFTEstimator`: the router's own `c + (Q + U) / R` model of
`tandem.router.scheduling.ttft`, so a decode engine already busy with converted prefills stops being
chosen as its own queue grows). When the prefill pool catches up (new replicas, a shorter queue) the
prediction falls under that share and requests go back to P/D by themselves. Example, objective 1 s:
prefill endpoints predicted at 0.8 s and 3.1 s (a burst queued on them), the decode endpoint at 0.35 s →
decode only; the same with the prefill pool at 0.4 s → disaggregate.

    uncached = prompt tokens − max(local prefix on the chosen decode endpoint, prefix in the KV pool)

The decode endpoint is chosen first, so "cached" means cached where the request will decode: its own
prefix cache (a `PrefixSource`, 0 without one) or the pool's leading chunks (a decode engine loads
those itself). Both are prefixes from token 0, so the longer one counts, not their sum. Example with
`minUncachedTokens` 512 and 256-token chunks: a 1,100-token prompt whose first 3 chunks (768 tokens)
are in the pool has 332 uncached tokens → decode only; the same prompt with nothing cached → prefill.

**Prefill** (`Prefiller.prefill`): with late binding (`tandem.router.pd.hold`) the request first waits
in the gateway while every prefill endpoint has more than a quarter of its objective queued; then the
prefill body (`handoff.prefill_body`) to one prefill endpoint;
it returns the `kv_transfer_params` for decode. It never fails the client's request: on any problem
the request goes decode-only with a fallback reason, counted in `tandem_router_pd_fallbacks_total`:

    no_endpoint       no prefill endpoint in rotation
    layout_mismatch   prefill endpoints in rotation, none of the decode endpoint's KV layout (below)
    connect, timeout, read, status   the engine failed (`UpstreamError.kind`; timeout also when
                      the whole prefill exceeds `prefill_timeout_seconds`)
    rejected          the engine answered 4xx
    invalid_response  the answer was not JSON
    barrier_timeout   the prompt's chunks did not all reach the KV pool within the barrier timeout
    pool_unavailable  the KV pool could not be asked (the barrier could not be checked)

**Pairing by KV layout** (`Endpoint.layout`, the pods' `tandem.dev/kv-layout` label): the decode
endpoint is chosen first, and the prefill endpoint only among those whose layout is
`kv_compatible` with it (equal, or either unknown). While a rollout runs, old- and new-generation
engines serve side by side and KV of one generation is garbage to the other; when no prefill
endpoint of the decode endpoint's layout is in rotation, the request goes decode-only
(`layout_mismatch`, logged with the request id), never to a pair of two generations. The decode
request keeps to the prefill endpoint's layout when it is placed again (`pipeline.stages.Dispatch`);
with none of that layout left it goes decode-only too, under a cache salt where the prefill's chunks
are not (`handoff.away_from_layout_body`).

**Barrier** (with a KV pool configured): after a successful prefill, wait (bounded) until every full
chunk of the prompt has its metadata in the pool (`KVPoolIndex.wait_for_keys`), so the decode
engine finds the KV; `tandem_router_pd_kv_barrier_wait_seconds{outcome}`. Prefill is not retried on
another prefill endpoint: decode-only is the cheaper recovery.

**Self-check of the pool keys** (`tandem.router.pd.keycheck`): every barrier and look-up tells the
`PoolKeysCheck` what it found. After `MISSES_TO_MISMATCH` barriers in a row that found none of their
prompt's chunks, with no hit ever, the engines evidently write other keys: the look-ups and the
barrier stop (as without a pool: the decision uses the local prefix, decode gets the prefill's
`kv_transfer_params` at once) but for one probe every `RECHECK_AFTER_S`, and one error line says
so; the first hit verifies the keys for good. A pool that does not answer is no evidence either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from tandem.kvpool.index import KVPoolIndex
from tandem.kvpool.keys import PoolScope
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.errors import UpstreamError, UpstreamTimeout
from tandem.router.pd.decision import (
    DisaggregationMode,
    PDDecision,
    TTFTEstimator,
    decide,
    prefill_busy,
)
from tandem.router.pd.handoff import decode_body, kv_params_from_prefill, prefill_body
from tandem.router.pd.hold import PrefillHold
from tandem.router.pd.keycheck import (
    Evidence,
    PoolKeysCheck,
    barrier_evidence,
    keys_fields,
    lookup_evidence,
    mismatch_message,
)
from tandem.router.pd.prefetch import DecodeAdapterLoad
from tandem.router.scheduling.base import Routable
from tandem.router.types import Endpoint, Route
from tandem.router.upstream.client import UpstreamCall
from tandem.router.upstream.dispatch import Dispatcher

log = logging.getLogger(__name__)


class PDRequest(Routable, Protocol):
    """A request as the P/D step reads it: a `Routable` with its route, body and prompt tokens."""

    @property
    def route(self) -> Route: ...

    @property
    def body(self) -> Mapping[str, Any]: ...

    def prompt_tokens(self) -> Sequence[int]: ...

    @property
    def cache_salt(self) -> str | None:
        """The tenant's cache salt: with `lora_name`, the scope of its prompts' keys in the KV pool
        (`pool_scope`)."""
        ...

    @property
    def lora_name(self) -> str | None:
        """The LoRA adapter the request runs under (None: the base model)."""
        ...

    @property
    def swapped_in(self) -> bool:
        """It pre-empted a stream and goes to that stream's decode engine (the swap, above)."""
        ...


def pool_scope(request: PDRequest, *, kv_layout: str | None = None) -> PoolScope:
    """The scope of the request's chunks in the KV pool: its tenant's salt and its adapter, as the
    engines' connector roots them (`tandem.core.kvkeys.scope_root`), and the KV layout of the engines
    that write and read them when their keys carry it (`Disaggregator.layout_keys`)."""
    return PoolScope(cache_salt=request.cache_salt, lora_name=request.lora_name, kv_layout=kv_layout)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillOutcome:
    """`kv_transfer_params` is None when falling back to decode-only (then `fallback` says why).
    `endpoint` is the prefill endpoint tried, if any; `duration_s` is in clock seconds."""

    endpoint: Endpoint | None
    kv_transfer_params: dict[str, Any] | None
    fallback: str | None
    duration_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Prefiller:
    """Sends the prefill (module docstring); `hold`: late binding (`tandem.router.pd.hold`; None: a
    prefill goes to an engine as soon as it is asked for)."""

    dispatcher: Dispatcher
    timeout_s: float
    clock: Callable[[], float]
    hold: PrefillHold | None = None

    async def prefill(
        self, request: PDRequest, *, headers: Mapping[str, str], layout: str | None = None
    ) -> PrefillOutcome:
        """`layout`: the decode endpoint's KV layout; the prefill endpoint is one that pairs with it."""
        started = self.clock()
        endpoint, params, fallback = await self._run(request, headers=headers, layout=layout)
        outcome = PrefillOutcome(
            endpoint=endpoint,
            kv_transfer_params=params,
            fallback=fallback,
            duration_s=self.clock() - started,
        )
        metrics = self.dispatcher.metrics
        metrics.pd_prefill_duration.labels("fallback" if fallback else "ok").observe(outcome.duration_s)
        if fallback:
            metrics.pd_fallbacks.labels(fallback).inc()
        return outcome

    async def _run(
        self, request: PDRequest, *, headers: Mapping[str, str], layout: str | None
    ) -> tuple[Endpoint | None, dict[str, Any] | None, str | None]:
        registry = self.dispatcher.registry
        if self.hold is not None:
            await self.hold.admit(slo_ttft_s=request.slo.ttft_s, tokens=request.prompt_length())
        candidates = registry.candidates("prefill")
        if not candidates:
            return None, None, "no_endpoint"
        if layout is not None:
            candidates = registry.candidates("prefill", pairs_with=layout)
            if not candidates:
                log.warning(
                    "no prefill endpoint of the decode endpoint's KV layout: decode only",
                    extra={"request_id": request.request_id, "kv_layout": layout},
                )
                return None, None, "layout_mismatch"
        endpoint = self.dispatcher.pick("prefill", request, candidates)
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._exchange(endpoint, request=request, headers=headers)
        except TimeoutError:
            error = UpstreamTimeout(f"{endpoint.name}: prefill took over {self.timeout_s}s")
            self.dispatcher.note_failure(endpoint, error)
            return endpoint, None, error.kind
        except UpstreamError as exc:
            return endpoint, None, exc.kind
        finally:
            if self.hold is not None:  # its queued work left that engine: the first held one looks again
                self.hold.wake()
        if body is None:
            return endpoint, None, "rejected"
        try:
            answer = orjson.loads(body)
        except ValueError:
            return endpoint, None, "invalid_response"
        return endpoint, kv_params_from_prefill(answer), None

    async def _exchange(
        self, endpoint: Endpoint, *, request: PDRequest, headers: Mapping[str, str]
    ) -> bytes | None:
        """The prefill answer's body, or None for a 4xx. Raises `UpstreamError` (recorded)."""
        call = UpstreamCall(
            path=request.route.value,
            body=orjson.dumps(prefill_body(request.body)),
            headers=headers,
            stream=False,
            read_timeout_s=self.timeout_s,
        )
        attempt = await self.dispatcher.attempt(endpoint, call, request=request)
        attempt.finish()
        return attempt.reply.head if attempt.reply.status < 400 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class PDOutcome:
    """What decode gets: `body` (the client's, plus `kv_transfer_params` after a good prefill).
    `prefill_endpoint` is set when decode uses a prefill's KV; `fallback` says why a disaggregated
    request went decode-only; `prefill_s` and `barrier_s` are clock seconds (None when skipped)."""

    decision: PDDecision
    body: Mapping[str, Any]
    prefill_endpoint: Endpoint | None = None
    fallback: str | None = None
    prefill_s: float | None = None
    barrier_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Disaggregator:
    """Runs the P/D step (module docstring). `pool`: the KV pool when the service has one
    (`RouterConfig.kvPoolUrl`); `prefix`: the decode endpoints' prefix caches, when known; `convert`:
    the TTFT estimates behind convertible decoders (None: off); `keys`: the self-check of the pool's
    keys (its state outlives requests; the composition root shares it with the metrics);
    `layout_keys`: the engines put their KV layout in their keys' scope (the operator's engines:
    `RouterConfig.kvLayoutInKeys`), so the keys of a request are those of its decode endpoint's
    layout, which its prefill endpoint shares; `decode_loads`: a disaggregated request's decode
    engine reads its adapter while the prefill runs (`tandem.router.pd.prefetch`; None: the decode
    request loads it)."""

    prefiller: Prefiller
    mode: DisaggregationMode
    min_uncached_tokens: int
    barrier_timeout_s: float
    pool: KVPoolIndex | None = None
    prefix: PrefixSource | None = None
    convert: TTFTEstimator | None = None
    keys: PoolKeysCheck = field(default_factory=PoolKeysCheck)
    layout_keys: bool = False
    decode_loads: DecodeAdapterLoad | None = None

    async def run(
        self, request: PDRequest, *, decode: Endpoint | None, headers: Mapping[str, str]
    ) -> PDOutcome:
        """Decide, prefill and wait for the KV; never raises because of prefill or the pool."""
        pool = self.pool
        # The prompt's chunk keys, hashed at most once for the look-up and the barrier together.
        memo: list[Sequence[str]] = []
        layout = decode.layout if decode is not None else None
        scope = pool_scope(request, kv_layout=layout if self.layout_keys else None)

        def keys() -> Sequence[str]:
            if not memo:
                tokens = request.prompt_tokens()
                memo.append(pool.metadata_keys(tokens, scope=scope) if pool is not None else [])
            return memo[0]

        decision = await self._decide(request, decode=decode, keys=keys, scope=scope)
        metrics = self.prefiller.dispatcher.metrics
        metrics.pd_decisions.labels(decision.label, decision.reason).inc()
        if not decision.disaggregate:
            return PDOutcome(decision=decision, body=request.body)
        reading = None
        if self.decode_loads is not None and decode is not None:
            reading = self.decode_loads.start(decode.url, request.lora_name)
        outcome = await self._disaggregate(
            request, decision, headers=headers, layout=layout, keys=keys, scope=scope
        )
        if reading is not None:  # the decode request goes to an engine that holds its adapter
            await reading.wait()
        return outcome

    async def _disaggregate(
        self,
        request: PDRequest,
        decision: PDDecision,
        *,
        headers: Mapping[str, str],
        layout: str | None,
        keys: Callable[[], Sequence[str]],
        scope: PoolScope,
    ) -> PDOutcome:
        """The prefill and the KV barrier of a request decided for P/D."""
        metrics = self.prefiller.dispatcher.metrics
        prefill = await self.prefiller.prefill(request, headers=headers, layout=layout)
        if prefill.kv_transfer_params is None or prefill.endpoint is None:
            return PDOutcome(
                decision=decision,
                body=request.body,
                fallback=prefill.fallback or "unknown",
                prefill_s=prefill.duration_s,
            )
        barrier_s, fallback = await self._barrier(request, keys=keys, scope=scope)
        if fallback is not None:
            metrics.pd_fallbacks.labels(fallback).inc()
            return PDOutcome(
                decision=decision,
                body=request.body,
                fallback=fallback,
                prefill_s=prefill.duration_s,
                barrier_s=barrier_s,
            )
        return PDOutcome(
            decision=decision,
            body=decode_body(request.body, prefill.kv_transfer_params),
            prefill_endpoint=prefill.endpoint,
            prefill_s=prefill.duration_s,
            barrier_s=barrier_s,
        )

    async def _decide(
        self,
        request: PDRequest,
        *,
        decode: Endpoint | None,
        keys: Callable[[], Sequence[str]],
        scope: PoolScope,
    ) -> PDDecision:
        members = len(self.prefiller.dispatcher.registry.endpoints("prefill"))
        adapter = request.lora_name is not None and not self.adapters_pooled
        swap = request.swapped_in
        available: int | None = 0
        # the only cases the table reads the prompt
        counted = (self.mode == "auto" or swap) and members > 0 and not adapter
        if counted:
            available = await self._available_tokens(request, decode=decode, keys=keys, scope=scope)
        decision = decide(
            self.mode,
            prefill_members=members,
            prompt_tokens=request.prompt_length() if counted else 0,
            available_tokens=available,
            min_uncached_tokens=self.min_uncached_tokens,
            adapter=adapter,
            swap=swap,
        )
        if decision.disaggregate and self._busy(request, decode=decode):
            return PDDecision(False, "prefill_busy")
        return decision

    def _busy(self, request: PDRequest, *, decode: Endpoint | None) -> bool:
        if self.convert is None or decode is None:
            return False
        registry = self.prefiller.dispatcher.registry
        convert, prefill = self.convert, registry.candidates("prefill", pairs_with=decode.layout)
        hold = self.prefiller.hold
        # Held prefills go before this one: their work, spread over the prefill engines, is ahead of it.
        held = hold.held_tokens // max(1, len(prefill)) if hold is not None else 0
        predictions = (convert.estimate_ttft(s.endpoint.url, request, extra_queued=held) for s in prefill)
        return prefill_busy(
            slo_ttft_s=request.slo.ttft_s,
            prefill_ttft_s=predictions,
            decode_ttft_s=lambda: convert.estimate_ttft(decode.url, request),
        )

    @property
    def adapters_pooled(self) -> bool:
        """Whether the pool's keys keep adapters apart (module docstring): Tandem's and LMCache
        0.5.6's (tagged), not LMCache 0.3's."""
        return self.pool is not None and self.pool.keys.scheme.carries_adapter

    async def _available_tokens(
        self,
        request: PDRequest,
        *,
        decode: Endpoint | None,
        keys: Callable[[], Sequence[str]],
        scope: PoolScope,
    ) -> int | None:
        local = 0
        if self.prefix is not None and decode is not None:
            local = self.prefix.match([decode.url], request).get(decode.url, 0)
        if self.pool is None or not self.keys.lookups_on:
            return local
        pooled = await self.pool.cached_prefix(keys())
        self._observe(lookup_evidence(pooled), request, scope)
        return None if pooled is None else max(local, pooled)

    async def _barrier(
        self, request: PDRequest, *, keys: Callable[[], Sequence[str]], scope: PoolScope
    ) -> tuple[float | None, str | None]:
        """(seconds waited, fallback reason or None); no pool, or keys the engines do not write
        (but for a probe), → nothing to wait for."""
        if self.pool is None or not self.keys.barrier_due(self.prefiller.clock()):
            return None, None
        result = await self.pool.wait_for_keys(keys(), timeout_s=self.barrier_timeout_s)
        metrics = self.prefiller.dispatcher.metrics
        metrics.pd_kv_barrier_wait.labels(result.outcome).observe(result.waited_s)
        evidence = barrier_evidence(result.outcome, chunks=result.chunks, found=result.found)
        if (
            evidence == "miss"
            and self.keys.state == "unverified"
            and await self._other_layout(request, scope)
        ):
            evidence = "hit"
        self._observe(evidence, request, scope)
        if result.outcome == "ok":
            return result.waited_s, None
        return result.waited_s, "barrier_timeout" if result.outcome == "timeout" else "pool_unavailable"

    async def _other_layout(self, request: PDRequest, scope: PoolScope) -> bool:
        """After a miss: whether the pool holds this prompt under another layout the engines may write
        (`KVPoolIndex.adopt_alternative`, e.g. LMCache 0.3's); the gateway then computes those keys."""
        if self.pool is None:
            return False
        was = self.pool.keys.scheme.name
        adopted = await self.pool.adopt_alternative(request.prompt_tokens(), scope=scope)
        if adopted is None:
            return False
        log.info(
            f"kv pool keys: the engines write {adopted.scheme.name} keys, not {was}: "
            "the gateway computes those now",
            extra=keys_fields(adopted),
        )
        return True

    def _observe(self, evidence: Evidence, request: PDRequest, scope: PoolScope) -> None:
        """Tell the self-check; log its conclusions (once each: the states change rarely)."""
        if evidence == "none" or self.pool is None:
            return
        check, keys = self.keys, self.pool.keys
        was = check.state
        changed = check.observe(evidence, now=self.prefiller.clock())
        if changed == "mismatch":
            first_chunk = request.prompt_tokens()[: keys.chunk_size]
            looked_for = keys.chunk_keys(first_chunk, scope=scope)
            log.error(
                mismatch_message(keys, misses=check.misses, recheck_after_s=check.recheck_after_s),
                extra={**keys_fields(keys), "example_key": looked_for[0] if looked_for else None},
            )
        elif changed == "verified":
            log.info(
                "kv pool keys verified: the pool holds chunks under the keys the gateway computes"
                + ("; the KV barrier and the pool look-ups are on again" if was == "mismatch" else ""),
                extra={**keys_fields(keys), "misses_before": check.misses},
            )
