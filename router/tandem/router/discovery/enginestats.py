"""Reading an engine's Prometheus text (`GET /metrics`) into `EngineStats` (pure: text in, numbers out).

The names are vLLM's (research/anchors.md §1.1), which the simulator serves too:

| field | metric | across data-parallel engines (`engine` label) |
|---|---|---|
| `running` | `vllm:num_requests_running` | sum |
| `waiting` | `vllm:num_requests_waiting` | sum |
| `kv_usage` | `vllm:kv_cache_usage_perc` (older vLLM: `vllm:gpu_cache_usage_perc`) | mean |
| `block_size`, `num_gpu_blocks` | labels of `vllm:cache_config_info` | first / sum |
| `tokens` | `vllm:prompt_tokens_total` + `vllm:generation_tokens_total` (moved by engine steps) | sum |

Example: `vllm:num_requests_running{engine="0"} 3`, `vllm:num_requests_waiting{engine="0"} 1`,
`vllm:kv_cache_usage_perc{engine="0"} 0.25`, `vllm:cache_config_info{block_size="16",num_gpu_blocks="256"} 1`
→ `EngineStats(running=3, waiting=1, kv_usage=0.25, block_size=16, num_gpu_blocks=256)`.

Text without the running/waiting gauges is not an engine's (`NotEngineMetrics`): a proxy's page, or an
engine that does not export them; the collector then has no data for it rather than zeros.
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from tandem.router.types import EngineStats

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_CONFIG = "vllm:cache_config_info"
TOKENS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
_WANTED = frozenset({RUNNING, WAITING, CACHE_CONFIG, *KV_USAGE, *TOKENS})


class NotEngineMetrics(ValueError):
    """The text parsed (or not) but has no `vllm:num_requests_running`/`_waiting` samples."""


def parse_engine_metrics(text: str) -> EngineStats:
    """`EngineStats` from Prometheus text format; raises `NotEngineMetrics` (see the module docstring)."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(_relevant(text)):
            for sample in family.samples:
                if sample.name in _WANTED:
                    samples[sample.name].append((sample.labels, float(sample.value)))
    except (ValueError, TypeError, IndexError) as exc:  # the parser's errors on malformed text
        raise NotEngineMetrics(f"unparsable metrics text: {exc}") from None
    if RUNNING not in samples or WAITING not in samples:
        raise NotEngineMetrics(f"no {RUNNING} / {WAITING} samples")
    usage = next((samples[name] for name in KV_USAGE if samples.get(name)), [])
    block_size, num_gpu_blocks = _cache_config(samples.get(CACHE_CONFIG, []))
    tokens = [value for name in TOKENS for _, value in samples.get(name, [])]
    return EngineStats(
        running=round(sum(value for _, value in samples[RUNNING])),
        waiting=round(sum(value for _, value in samples[WAITING])),
        kv_usage=sum(value for _, value in usage) / len(usage) if usage else None,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        tokens=sum(tokens) if tokens else None,
    )


def _relevant(text: str) -> str:
    """Only the sample lines of the wanted metrics: a real vLLM page is tens of kilobytes of
    histograms, and the parser is pure Python running on the router's event loop."""
    return "\n".join(line for line in text.splitlines() if line.split("{", 1)[0].split(" ", 1)[0] in _WANTED)


def _cache_config(samples: list[tuple[dict[str, str], float]]) -> tuple[int | None, int | None]:
    block_size: int | None = None
    total_blocks = 0
    for labels, _ in samples:
        size = _positive_int(labels.get("block_size"))
        if block_size is None:
            block_size = size
        total_blocks += _positive_int(labels.get("num_gpu_blocks")) or 0
    return block_size, total_blocks or None


def _positive_int(raw: str | None) -> int | None:
    try:
        value = int(raw) if raw is not None else 0
    except ValueError:
        return None
    return value if value > 0 else None
