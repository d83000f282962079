"""The prefill step of a disaggregated request (P/D), and when to take it.

`Prefiller.prefill` sends the prefill body (`handoff.prefill_body`) to one prefill endpoint and
returns the `kv_transfer_params` for decode. It never fails the client's request: on any problem
it returns a decode-only outcome with a fallback reason, counted in
`tandem_router_pd_fallbacks_total{reason}`:

    no_endpoint       no prefill endpoint in rotation
    connect, timeout, read, status   the engine failed (`UpstreamError.kind`; timeout also when
                      the whole prefill exceeds `prefill_timeout_seconds`)
    rejected          the engine answered 4xx
    invalid_response  the answer was not JSON

Prefill is not retried on another prefill endpoint: decode-only is the cheaper recovery.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tandem.router.dispatch import Dispatcher
from tandem.router.errors import UpstreamError, UpstreamTimeout
from tandem.router.handoff import kv_params_from_prefill, prefill_body
from tandem.router.proxy import UpstreamCall
from tandem.router.types import Endpoint, RequestView

DisaggregationMode = Literal["always", "auto", "off"]


def should_disaggregate(mode: DisaggregationMode, *, prefill_members: int) -> bool:
    """Whether to run a prefill step. `always`: yes (no prefill endpoint → counted fallback);
    `auto`: when the prefill pool has members (this baseline treats it like `always`; the uncached-
    token rule comes with the scoring scheduler); `off`: never."""
    if mode == "always":
        return True
    return mode == "auto" and prefill_members > 0


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
    dispatcher: Dispatcher
    timeout_s: float
    clock: Callable[[], float]

    async def prefill(self, request: RequestView, *, headers: Mapping[str, str]) -> PrefillOutcome:
        started = self.clock()
        endpoint, params, fallback = await self._run(request, headers=headers)
        outcome = PrefillOutcome(
            endpoint=endpoint,
            kv_transfer_params=params,
            fallback=fallback,
            duration_s=self.clock() - started,
        )
        metrics = self.dispatcher.metrics
        metrics.pd_prefill_duration.labels(outcome="fallback" if fallback else "ok").observe(
            outcome.duration_s
        )
        if fallback:
            metrics.pd_fallbacks.labels(reason=fallback).inc()
        return outcome

    async def _run(
        self, request: RequestView, *, headers: Mapping[str, str]
    ) -> tuple[Endpoint | None, dict[str, Any] | None, str | None]:
        registry = self.dispatcher.registry
        candidates = registry.candidates("prefill")
        if not candidates:
            return None, None, "no_endpoint"
        endpoint = self.dispatcher.scheduler.pick("prefill", request, candidates)
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._exchange(endpoint, request=request, headers=headers)
        except TimeoutError:
            error = UpstreamTimeout(f"{endpoint.name}: prefill took over {self.timeout_s}s")
            self.dispatcher.note_failure(endpoint, error)
            return endpoint, None, error.kind
        except UpstreamError as exc:
            return endpoint, None, exc.kind
        if body is None:
            return endpoint, None, "rejected"
        try:
            answer = json.loads(body)
        except ValueError:
            return endpoint, None, "invalid_response"
        return endpoint, kv_params_from_prefill(answer), None

    async def _exchange(
        self, endpoint: Endpoint, *, request: RequestView, headers: Mapping[str, str]
    ) -> bytes | None:
        """The prefill answer's body, or None for a 4xx. Raises `UpstreamError` (recorded)."""
        call = UpstreamCall(
            path=request.route.value,
            body=prefill_body(request.body),
            headers=headers,
            stream=False,
            read_timeout_s=self.timeout_s,
        )
        attempt = await self.dispatcher.attempt(endpoint, call)
        await attempt.finish()
        return attempt.reply.head if attempt.reply.status < 400 else None
