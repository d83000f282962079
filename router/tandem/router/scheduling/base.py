"""The scheduling boundary: the Protocol every policy implements, and the dispatcher's feedback seam."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tandem.router.types import Endpoint, EndpointSnapshot, Pool, RequestView


class Scheduler(Protocol):
    """Chooses the endpoint of `pool` that serves `request`.

    Contract: `candidates` is non-empty, holds only endpoints of `pool` that are in rotation and not
    yet tried by this request, and is in discovery order; the result is one of them. `pick` is
    synchronous, does no I/O and must not mutate its arguments; it may update the policy's own
    state (a cursor, counters). Called on the event loop, so it must be cheap (microseconds).
    Parameters are positional-only so implementations may name them as they like.
    """

    def pick(
        self, pool: Pool, request: RequestView, candidates: Sequence[EndpointSnapshot], /
    ) -> Endpoint: ...


class DispatchObserver(Protocol):
    """Told by the dispatcher about every upstream attempt, so the scheduler's state can follow the
    router's own traffic (queued prefill work, routed prefixes, observed time to first token).

    `started` is called when an attempt to `endpoint` begins and returns an opaque ticket; then
    `answered` once when the head of the answer arrives (`status`; `streamed`: the head is the first
    chunk of a successful stream, i.e. the first token), and `finished` once when the attempt is over
    whatever happened (after `answered`, or instead of it on failure or cancellation). Synchronous
    and cheap: they run on the event loop on every request.
    """

    def started(self, endpoint: Endpoint, request: RequestView, /) -> object: ...

    def answered(self, ticket: object, /, *, status: int, streamed: bool) -> None: ...

    def finished(self, ticket: object, /) -> None: ...


class NoObserver:
    """A `DispatchObserver` that follows nothing (the default)."""

    def started(self, endpoint: Endpoint, request: RequestView, /) -> object:
        return None

    def answered(self, ticket: object, /, *, status: int, streamed: bool) -> None:
        return None

    def finished(self, ticket: object, /) -> None:
        return None
