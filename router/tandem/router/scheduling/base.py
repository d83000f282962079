"""The scheduling boundary: what a request looks like to a policy (`Routable`), the Protocol every
policy implements, and the dispatcher's feedback seam."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tandem.router.types import SLO, Endpoint, EndpointSnapshot, Pool


class Routable(Protocol):
    """One request as scheduling reads it: the gateway's per-request context, or a `RequestView`.

    `prompt_length()` and `block_keys(size)` are computed on first use and kept by the request
    itself (`tandem.core.blockhash` keys over its prompt tokens, full blocks only); policies that
    do not need them never cause a prompt to be tokenized or hashed. `kv_loaded`: a prefill for
    this request succeeded, so its decode engine loads the prompt's KV instead of computing it.
    `request_id` is for logs only: no state is ever keyed by it.
    """

    @property
    def request_id(self) -> str: ...

    @property
    def slo(self) -> SLO: ...

    @property
    def kv_loaded(self) -> bool: ...

    def prompt_length(self) -> int: ...

    def prompt_size(self) -> int:
        """The prompt's tokens if known, else a cheap estimate (for charges the engine's usage
        corrects later, and for policies that never need the exact count)."""
        ...

    def block_keys(self, block_size: int, /) -> Sequence[int]: ...

    @property
    def lora_name(self) -> str | None:
        """The LoRA adapter the request runs under (None: the base model)."""
        ...


class Scheduler(Protocol):
    """Chooses the endpoint of `pool` that serves `request`.

    Contract: `candidates` is non-empty, holds only endpoints of `pool` that are in rotation and not
    yet tried by this request, and is in discovery order; the result is one of them. `pick` is
    synchronous, does no I/O and must not mutate its arguments; it may update the policy's own
    state (a cursor, counters). Called on the event loop, so it must be cheap (microseconds).
    Parameters are positional-only so implementations may name them as they like.
    """

    def pick(self, pool: Pool, request: Routable, candidates: Sequence[EndpointSnapshot], /) -> Endpoint: ...


class DispatchObserver(Protocol):
    """Told by the dispatcher about every upstream attempt, so the scheduler's state can follow the
    router's own traffic (queued prefill work, routed prefixes, observed time to first token).

    `started` is called when an attempt to `endpoint` begins and returns an opaque ticket; then
    `answered` once when the head of the answer arrives (`status`; `streamed`: the head is the first
    chunk of a successful stream, i.e. the first token; `lag_s`: how late the gateway's event loop
    ran since the attempt started), and `finished` once when the attempt is over
    whatever happened (after `answered`, or instead of it on failure or cancellation). Synchronous
    and cheap: they run on the event loop on every request.
    """

    def started(self, endpoint: Endpoint, request: Routable, /) -> object: ...

    def answered(self, ticket: object, /, *, status: int, streamed: bool, lag_s: float = 0.0) -> None: ...

    def finished(self, ticket: object, /) -> None: ...


class NoObserver:
    """A `DispatchObserver` that follows nothing (the default)."""

    def started(self, endpoint: Endpoint, request: Routable, /) -> object:
        return None

    def answered(self, ticket: object, /, *, status: int, streamed: bool, lag_s: float = 0.0) -> None:
        return None

    def finished(self, ticket: object, /) -> None:
        return None
