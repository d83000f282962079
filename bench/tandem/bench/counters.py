"""Engine counters parsed from vLLM's Prometheus text, and what their deltas over a run say (pure;
`tandem.bench.engines` scrapes them).

Counters read (vLLM's names, which the simulator serves too; every series of a name is summed, so
an engine with several `engine` or `model_name` label sets counts once in total):

| field | metric | unit |
| --- | --- | --- |
| `prefix_queries` | `vllm:prefix_cache_queries_total` | prompt tokens looked up in the local prefix cache |
| `prefix_hits` | `vllm:prefix_cache_hits_total` | of those, tokens found cached |
| `external_queries` | `vllm:external_prefix_cache_queries_total` | prompt tokens looked up in the connector |
| `external_hits` | `vllm:external_prefix_cache_hits_total` | tokens loaded from it |
| `prompt_tokens` | `vllm:prompt_tokens_total` | prompt tokens processed |
| `generation_tokens` | `vllm:generation_tokens_total` | tokens generated |
| `requests` | `vllm:request_success_total` (all `finished_reason`s) | finished requests |
| `preemptions` | `vllm:num_preemptions_total` | preemptions |
| `ttft_sum`, `ttft_count` | `vllm:time_to_first_token_seconds_sum`, `_count` | the engine's TTFT histogram |

Rates over a run (deltas; None when the denominator is 0):
- prefix hit rate = Δprefix_hits / Δprefix_queries (vLLM's "prefix cache hit rate", local cache);
- external hit rate = Δexternal_hits / Δexternal_queries (the KV pool's own hit rate);
- reused fraction = (Δprefix_hits + Δexternal_hits) / Δprefix_queries: prompt tokens not computed;
- engine TTFT mean = Δttft_sum / Δttft_count: seconds from the request reaching the engine to its
  first token, as the engine measures it (the simulator: simulated seconds, so neither the gateway
  nor a host that cannot keep up with the time scale is in it).
Overall rates sum the deltas over engines first (token-weighted), never average per-engine rates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from types import MappingProxyType
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

METRICS: Mapping[str, str] = MappingProxyType(
    {
        "prefix_queries": "vllm:prefix_cache_queries_total",
        "prefix_hits": "vllm:prefix_cache_hits_total",
        "external_queries": "vllm:external_prefix_cache_queries_total",
        "external_hits": "vllm:external_prefix_cache_hits_total",
        "prompt_tokens": "vllm:prompt_tokens_total",
        "generation_tokens": "vllm:generation_tokens_total",
        "requests": "vllm:request_success_total",
        "preemptions": "vllm:num_preemptions_total",
        "ttft_sum": "vllm:time_to_first_token_seconds_sum",
        "ttft_count": "vllm:time_to_first_token_seconds_count",
    }
)


@dataclass(frozen=True)
class EngineCounters:
    """One engine's counters at one moment, or a delta between two moments (see the module table)."""

    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    external_queries: float = 0.0
    external_hits: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests: float = 0.0
    preemptions: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0

    def __sub__(self, earlier: EngineCounters) -> EngineCounters:
        return EngineCounters(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)}
        )

    def __add__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def rates(self) -> dict[str, float | None]:
        """Rates of a delta (module docstring): hit rates in [0, 1], the engine TTFT mean in seconds;
        None when undefined."""
        return {
            "prefix_hit_rate": _ratio(self.prefix_hits, self.prefix_queries),
            "external_hit_rate": _ratio(self.external_hits, self.external_queries),
            "reused_fraction": _ratio(self.prefix_hits + self.external_hits, self.prefix_queries),
            "engine_ttft_mean_s": self.ttft_sum / self.ttft_count if self.ttft_count > 0 else None,
        }


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator <= 0 else min(1.0, max(0.0, numerator / denominator))


class MetricsError(RuntimeError):
    """An engine's /metrics could not be read or parsed."""


def families(text: str, prefixes: tuple[str, ...]) -> Iterable[Metric]:
    """The metric families of Prometheus `text` whose names start with one of `prefixes`, parsing
    only their lines: a page is mostly histograms, and a sampler that runs every second on the event
    loop whose requests it measures should not parse them (the timeline's and the adapter bench's).
    Raises ValueError for a wanted line that is not Prometheus exposition format."""
    marks = tuple(f"# {kind} {p}" for kind in ("TYPE", "HELP") for p in prefixes)
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(prefixes + marks))
    return text_string_to_metric_families(wanted)


def parse_counters(text: str) -> EngineCounters:
    """Sum the counters of the module table out of Prometheus text; absent metrics count 0."""
    wanted = {name: key for key, name in METRICS.items()}
    totals = dict.fromkeys(METRICS, 0.0)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = wanted.get(sample.name)
                if key is not None:
                    totals[key] += float(sample.value)
    except ValueError as exc:  # the parser's error for malformed exposition text
        raise MetricsError(f"invalid Prometheus text: {exc}") from None
    return EngineCounters(**totals)


def engine_report(
    before: Mapping[str, EngineCounters | str], after: Mapping[str, EngineCounters | str]
) -> dict[str, Any]:
    """Per-engine deltas and rates, plus the overall (summed) delta and rates, as plain JSON data.

    An engine whose either scrape failed appears with its `error` and is left out of the total.
    """
    engines: dict[str, Any] = {}
    total = EngineCounters()
    counted = 0
    for url in after:
        first, last = before.get(url, "not scraped before the run"), after[url]
        if isinstance(first, str) or isinstance(last, str):
            engines[url] = {"error": first if isinstance(first, str) else last}
            continue
        delta = last - first
        total = total + delta
        counted += 1
        engines[url] = {"delta": asdict(delta), **delta.rates()}
    overall = {"engines_counted": counted, "delta": asdict(total), **total.rates()} if counted else None
    return {"engines": engines, "overall": overall}
