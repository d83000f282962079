"""The cold-start hold: generation requests that arrive while the decode pool has no engine at all
wait in the gateway for its first one, instead of getting a 503.

A decode pool scaled to zero (`spec.decode.autoscaling.min: 0`) has no member until the autoscaler
starts one and discovery lists it (a model load: tens of seconds). With `spec.router.coldStart`
(`ColdStartSpec`), a new request

- goes on at once when the decode pool has a member, in rotation or not (members out of rotation
  after failures are a failure, not a start: the dispatcher's 503 as before), or when
  `maxHeldRequests` is 0 (holding off: the 503 as before);
- else is held, unless `maxHeldRequests` are held already: then 429 `model_cold_start` with
  `Retry-After: retryAfterSeconds` at once (outcome `rejected`).

A held request waits, without polling, until discovery gives the decode pool a member
(`EndpointRegistry.on_members` → `members_changed`, which wakes every held request at once:
`released`), and then goes on through admission as if it had just arrived (its response times still
count from its arrival). It waits at most `holdSeconds`: then 429 `model_cold_start` with
`Retry-After` (`expired`). A client that leaves while held is withdrawn at once (`cancelled`).

**Where it sits**: the `Hold` stage, after the tenant's rate limits and before admission. So a held
request has been counted against its tenant's rate limits (which also keep one tenant from filling
the hold beyond them), and charges nothing in the fair queue while held: the VTC counters, the queue
and its metrics see it only once it is released into the gate. Each gateway process (each worker)
holds the requests it received; `tandem_router_held_requests` is its count.

Time: the deadline is a timer of the event loop (`holdSeconds` of loop time); the injected `clock`
measures how long a request was held (histogram, log lines, messages). Single-threaded: everything
runs on the router's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Literal

from tandem.core.spec import ColdStartSpec
from tandem.router.admission.metrics import HoldMetrics
from tandem.router.errors import ColdStart
from tandem.router.types import Pool

log = logging.getLogger("tandem.router")

HoldVerdict = Literal["go", "hold", "full"]


def hold_verdict(*, members: int, held: int, max_held: int) -> HoldVerdict:
    """What a new request does (module docstring): `go` on (the decode pool has `members`, or
    holding is off: `max_held` 0), `hold` it, or refuse it because the hold is `full`.

    >>> hold_verdict(members=0, held=3, max_held=256), hold_verdict(members=0, held=256, max_held=256)
    ('hold', 'full')
    """
    if members or max_held == 0:
        return "go"
    return "hold" if held < max_held else "full"


class ColdStartHold:
    """Holds requests while the decode pool has no member (module docstring). `members()`: how many
    members discovery lists for the decode pool now. `held`: requests held now."""

    def __init__(
        self,
        *,
        spec: ColdStartSpec,
        members: Callable[[], int],
        metrics: HoldMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._max_held = spec.max_held_requests
        self._hold_s = spec.hold_seconds
        self._retry_after_s = spec.retry_after_seconds
        self._members = members
        self._metrics = metrics
        self._clock = clock
        self._ready = asyncio.Event()  # set while the decode pool has a member (once it was asked)
        self.held = 0

    def members_changed(self, pool: Pool) -> None:
        """Discovery rewrote `pool`: when the decode pool has a member now, wake every held request."""
        if pool != "decode":
            return
        if self._members():
            self._ready.set()
        else:
            self._ready.clear()

    async def wait(self) -> float | None:
        """Return at once (None) when the request may go on; else hold it until the decode pool has
        a member and return the seconds it was held. Raises `ColdStart` (429) when the hold is full
        or its deadline passed; cancelling the caller withdraws it."""
        verdict = hold_verdict(members=self._members(), held=self.held, max_held=self._max_held)
        if verdict == "go":
            return None
        if verdict == "full":
            self._metrics.ended("rejected")
            raise ColdStart(
                f"no decode engine is ready yet (the pool is starting from zero); {self.held} requests "
                "already held; retry later",
                outcome="rejected",
                retry_after_s=self._retry_after_s,
            )
        return await self._hold()

    async def _hold(self) -> float:
        started = self._clock()
        self._ready.clear()  # the pool has no member now, whatever was last signalled
        self.held += 1
        log.info(
            "request held: the decode pool has no engine yet",
            extra={"held_requests": self.held, "hold_seconds": self._hold_s},
        )
        outcome = "cancelled"  # unless the wait below ends otherwise: the caller was cancelled
        try:
            async with asyncio.timeout(self._hold_s):
                await self._ready.wait()
            outcome = "released"
        except TimeoutError:
            outcome = "expired"
        finally:
            self.held -= 1
            held_s = self._clock() - started
            self._metrics.ended(outcome, held_s=held_s)
            self._log(outcome, held_s)
        if outcome == "expired":
            raise ColdStart(
                f"held {held_s:.3g}s and the decode pool has no engine yet (it is starting from zero); "
                "retry later",
                outcome="expired",
                retry_after_s=self._retry_after_s,
            )
        return held_s

    def _log(self, outcome: str, held_s: float) -> None:
        fields = {"held_s": round(held_s, 4), "held_requests": self.held}
        if outcome == "released":
            log.info("held request released: a decode engine is ready", extra=fields)
        elif outcome == "expired":
            log.warning("held request expired: still no decode engine", extra=fields)
        else:
            log.info("held request cancelled: the client left", extra=fields)
