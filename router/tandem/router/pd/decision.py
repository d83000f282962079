"""The P/D decision, pure: whether a request is disaggregated (`decide`, the table of
`tandem.router.pd.disagg`'s docstring, with the meaning of each `reason` label) and whether the
prefill pool is too busy for it (`prefill_busy`, convertible decoders)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from tandem.router.scheduling.base import Routable

DisaggregationMode = Literal["always", "auto", "off"]


@dataclass(frozen=True, slots=True)
class PDDecision:
    disaggregate: bool
    reason: str  # the `reason` label (`tandem.router.pd.disagg`)

    @property
    def label(self) -> str:
        return "disaggregate" if self.disaggregate else "decode_only"


class TTFTEstimator(Protocol):
    """Predicted time to first token of `request` on the endpoint at `url` if sent there now, computing
    the prompt itself (`tandem.router.scheduling.state.SchedulingState.estimate_ttft`)."""

    def estimate_ttft(self, url: str, request: Routable, /, *, extra_queued: int = 0) -> float: ...


#: The share of a request's TTFT objective its prefill may take before the pool counts as busy.
PREFILL_SHARE = 0.5


def prefill_busy(
    *, slo_ttft_s: float, prefill_ttft_s: Iterable[float], decode_ttft_s: Callable[[], float | None]
) -> bool:
    """Whether the prefill pool is short of capacity for this request (`tandem.router.pd.disagg`,
    convertible decoders): its best
    prediction exceeds `PREFILL_SHARE` of the objective and the decode endpoint would be faster. The
    predictions are consumed lazily: the first prefill endpoint within that share ends it (the usual
    case), and the decode endpoint is asked only when none is. Example: objective 1 s, prefill
    [0.8, 3.1], decode 0.35 → True; prefill [0.4] → False; no decode estimate → False."""
    best = math.inf
    for predicted in prefill_ttft_s:
        if predicted <= PREFILL_SHARE * slo_ttft_s:
            return False
        best = min(best, predicted)
    if math.isinf(best):
        return False
    decode = decode_ttft_s()
    return decode is not None and decode < best


def decide(
    mode: DisaggregationMode,
    *,
    prefill_members: int,
    prompt_tokens: int,
    available_tokens: int | None,
    min_uncached_tokens: int,
    busy: bool = False,
    adapter: bool = False,
    swap: bool = False,
) -> PDDecision:
    """The P/D decision table of `tandem.router.pd.disagg`'s docstring. `available_tokens`: the
    prompt's prefix the chosen decode endpoint can get without computing it; None when the KV pool
    could not be asked.
    `busy`: `prefill_busy` said so (asked only for requests that would otherwise disaggregate).
    `adapter`: the request runs under a LoRA adapter the pool's keys cannot tell apart.
    `swap`: the request pre-empted a stream of the chosen decode endpoint (any mode decides it as
    `auto` would on its uncached tokens)."""
    if mode == "off":
        return PDDecision(False, "off")
    if adapter:
        return PDDecision(False, "adapter")
    if swap and available_tokens is not None and prompt_tokens - available_tokens < min_uncached_tokens:
        return PDDecision(False, "preempting")
    if busy:
        return PDDecision(False, "prefill_busy")
    if mode == "always":
        return PDDecision(True, "always")
    if prefill_members == 0:
        return PDDecision(False, "no_prefill_pool")
    if available_tokens is None:
        return PDDecision(False, "pool_unavailable")
    if prompt_tokens - available_tokens < min_uncached_tokens:
        return PDDecision(False, "few_uncached")
    return PDDecision(True, "many_uncached")
