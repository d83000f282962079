"""Prefill ahead: a disaggregated request's prefill runs while it still waits for its decode slot.

Under a flood the admission gate keeps the backlog in its fair queue and sends each decode engine
only what it runs (`tandem.router.admission.gate`). Disaggregated, a request granted a slot then
first passes the prefill pool, the KV barrier and only then reaches its decode engine: every time a
stream ends, its slot stands empty for that long (50–200 ms a request on a 2-core host, against a
decode step of a few ms). On KV-cache-bound decode engines that cost the heavy tenant of a flood
0.87–0.90× the requests per second vllm-router's round robin gets, which keeps a backlog queued
inside the engines (docs/benchmarks.md §0).

With `--prefill-ahead S` (a share of the gate's capacity, 1 by default; 0: off) the gate takes the
next requests in fair order out of its queue while no slot is free, at most `ceil(S × capacity)` of
them (`AdmissionGate`, "Prefill ahead"), and each one's P/D step starts at once
(`PrefillAhead.start`): the decision, the prefill and the barrier, with no decode engine chosen yet.
It still waits for its grant, which comes before the queue's when a slot frees;
`pipeline.stages.Disaggregate` then takes the step's outcome, done by then, and the decode request
goes out at once. The decode engine's queue stays empty, so a tenant who arrives later is not behind
it: its request is the next one taken ahead, or pre-empts a stream as before. What the limit bounds
is the KV held in the pool for requests not yet decoding, and how far ahead of their turn requests
are charged.

Which requests: those of a service with a prefill pool in rotation, P/D on (mode `always` or
`auto`), under the base model (an adapter's request is placed with its decode engine first:
`tandem.router.pd.prefetch`), where the pool's keys do not carry the decode engine's KV layout
(`Disaggregator.layout_keys`: the keys depend on the decode engine). With no decode engine chosen,
the decision reads the pool's prefix, not the decode engine's own cache, and convertible decoders
(which compare a decode engine's prediction) do not apply; a request decided decode-only ahead
goes decode-only. Counted in `tandem_router_pd_prefill_ahead_total{outcome}`: `used` (the request
was granted and took the step's outcome), `unused` (it ended first: refused past its deadline, or
its client left; its prefill, if running, is cancelled).

Example: capacity 12 (two decode engines of 6), share 1 → up to 12 requests prefilled while the
engines run 12 (about the turnovers of the half second a slow host's prefill path can take); a stream
ends, the first of them is granted, its prefill done 40 ms ago, and its decode request reaches the
engine within a millisecond or two.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

from tandem.router.pd.disagg import Disaggregator, PDOutcome, PDRequest


def ahead_limit(share: float, capacity: int) -> int:
    """How many requests may be taken ahead: `ceil(share × capacity)`.

    >>> ahead_limit(0.5, 12), ahead_limit(0.5, 5), ahead_limit(1.0, 0)
    (6, 3, 0)"""
    return math.ceil(share * capacity)


def applies(share: float, disaggregator: Disaggregator) -> bool:
    """Whether a service takes requests ahead at all (module docstring): a share, P/D on, and pool
    keys that do not depend on the decode engine's layout. Decided once, when it is composed."""
    return share > 0 and disaggregator.mode != "off" and not disaggregator.layout_keys


@dataclass(frozen=True, slots=True)
class PrefillAhead:
    """Starts a waiting request's P/D step (module docstring); `share` of the gate's capacity. Made
    only for a service where it `applies`."""

    disaggregator: Disaggregator
    share: float

    def limit(self, capacity: int) -> int:
        """The gate's limit at `capacity`: 0 with no prefill endpoint in rotation."""
        if not self.disaggregator.prefiller.dispatcher.registry.candidates("prefill"):
            return 0
        return ahead_limit(self.share, capacity)

    def eligible(self, request: PDRequest) -> bool:
        """Whether `request` may be taken ahead: the base model's, with prefill members listed
        (none: nothing is set up for it)."""
        registry = self.disaggregator.prefiller.dispatcher.registry
        return request.lora_name is None and bool(registry.endpoints("prefill"))

    def start(self, request: PDRequest, *, headers: Mapping[str, str]) -> asyncio.Task[PDOutcome]:
        """The request's P/D step, started now with no decode engine chosen."""
        return asyncio.get_running_loop().create_task(
            self.disaggregator.run(request, decode=None, headers=headers)
        )

    def end(self, task: asyncio.Task[PDOutcome] | None, *, used: bool) -> None:
        """At the request's end: count the step; cancel one still running that was never used."""
        if task is None:
            return
        if not used:
            task.cancel()  # nothing once it is done
            if task.done() and not task.cancelled():
                with contextlib.suppress(Exception):
                    task.exception()  # retrieved: an unused step's error is not logged as lost
        self.disaggregator.prefiller.dispatcher.metrics.pd_prefill_ahead.labels(
            "used" if used else "unused"
        ).inc()
