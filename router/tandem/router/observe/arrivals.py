"""What arrives at the gateway, counted when it arrives: the autoscaler's leading signal.

`tandem_router_arrivals_total` (requests) and `tandem_router_arrival_prompt_tokens_total` (their prompt
tokens) count every generation request that passed the rate limits, before it is held, queued or
routed, so their rate is the demand now, not the service done. The autoscaler divides the token rate by
a prefill replica's capacity (docs/autoscaler.md). Prompt tokens are exact (the model's tokenizer) when
`exact` is set (the composition root sets it when the prefill pool autoscales: the tokens are needed for
routing anyway, and counted once), else the request's cheap estimate.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from tandem.router.scheduling.base import Routable


class Arrivals:
    """The two arrival counters of one gateway process."""

    def __init__(self, registry: CollectorRegistry, *, exact: bool) -> None:
        self._requests = Counter(
            "tandem_router_arrivals", "Generation requests arrived (past the rate limits).", registry=registry
        )
        self._tokens = Counter(
            "tandem_router_arrival_prompt_tokens",
            "Prompt tokens of the generation requests arrived (past the rate limits).",
            registry=registry,
        )
        self._exact = exact

    def arrived(self, request: Routable) -> None:
        self._requests.inc()
        self._tokens.inc(request.prompt_length() if self._exact else request.prompt_size())
