"""The plugin boundary of the scheduler (llm-d's Filter → Scorer → Picker), and the data plugins see.

One scheduling cycle is one `pick` for one pool. Before plugins run, the scheduler computes every
per-request, per-endpoint quantity once (the prefix match, the load, the predicted TTFT) into a
`Candidate` per endpoint, so plugins are small pure functions over plain data:

- a `Filter` narrows the candidates (it may return all of them; the runner never lets it return none);
- a `Scorer` gives every candidate a score in [0, 1], 1 best (the runner clamps out-of-range values,
  multiplies by the configured weight and sums);
- a `Picker` chooses one candidate from the scored ones.

Plugins are stateless or keep only their own state; they do no I/O and never mutate their inputs.

`Cycle`, `Candidate` and `Scored` are named tuples, not dataclasses: a decision builds one cycle and a
candidate and a score per endpoint on every request, and a named tuple is built in C at about a third
of a frozen dataclass's cost (docs/router-performance.md). They are as immutable; build them with
keywords.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from tandem.router.scheduling.base import Routable
from tandem.router.types import Endpoint, EndpointSnapshot, Pool

if TYPE_CHECKING:
    from tandem.router.scheduling.runner import Decision


class Cycle(NamedTuple):
    """The request side of one scheduling cycle.

    `profile`: the name of the profile in use (see `tandem.router.scheduling.tandem`).
    `prompt_tokens`: the prompt's length in tokens (n). `slo_ttft_s`: the request's TTFT objective.
    """

    pool: Pool
    profile: str
    request: Routable
    prompt_tokens: int
    slo_ttft_s: float


class Candidate(NamedTuple):
    """One endpoint as the plugins see it for this request.

    `load`: requests queued or running on it, `max(in_flight, running + waiting)` (the router's own
      count, or the engine's when a fresh scrape says more: other router replicas send to it too).
    `kv_usage`: the engine's KV-cache usage 0..1, None when unknown or stale.
    `matched_tokens`: leading prompt tokens its prefix cache holds (an estimate; 0..n).
    `cache_fill`: how full the router's picture of its prefix cache is, 0..1 (routed blocks / capacity).
    `queued_tokens`: uncached prompt tokens of requests the router sent it that have no first token yet.
    `tokens_per_second`: its learned prefill rate. `predicted_ttft_s`: `predict_ttft` for this request.
    `warming`: it has not answered yet and already computes a prompt (`filters.SlowStart`).
    `url`: its endpoint's URL, the key scorers score by (a field, not a property: it is read several
    times per candidate per decision).
    """

    snapshot: EndpointSnapshot
    url: str
    load: float
    kv_usage: float | None
    matched_tokens: int
    cache_fill: float
    queued_tokens: int
    tokens_per_second: float
    predicted_ttft_s: float
    warming: bool = False

    @property
    def endpoint(self) -> Endpoint:
        return self.snapshot.endpoint


class Scored(NamedTuple):
    """A candidate with its weighted total and each scorer's clamped, unweighted score."""

    candidate: Candidate
    total: float
    scores: Mapping[str, float]


class Filter(Protocol):
    """Keeps the candidates worth scoring. May return all of them; must return a subset."""

    @property
    def name(self) -> str: ...

    def filter(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Sequence[Candidate]: ...


class Scorer(Protocol):
    """Scores every candidate in [0, 1], 1 best, keyed by `Candidate.url`."""

    @property
    def name(self) -> str: ...

    def score(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Mapping[str, float]: ...


class Picker(Protocol):
    """Chooses one of `scored` (non-empty)."""

    @property
    def name(self) -> str: ...

    def pick(self, scored: Sequence[Scored], /) -> Scored: ...


@runtime_checkable
class PostPick(Protocol):
    """A filter or scorer that learns from the decisions made with it (llm-d's PreRequest plugins):
    the scheduler calls `picked` after each cycle of a profile it is in, with the decision.
    Synchronous and cheap, no I/O; it may update only the plugin's own state."""

    def picked(self, decision: Decision, /) -> None: ...
