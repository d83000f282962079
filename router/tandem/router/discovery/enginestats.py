"""Reading an engine's Prometheus text (`GET /metrics`) into `EngineStats` (pure: text in, numbers out).

The names are vLLM's (research/anchors.md §1.1), which the simulator serves too:

| field | metric | across data-parallel engines (`engine` label) |
|---|---|---|
| `running` | `vllm:num_requests_running` | sum |
| `waiting` | `vllm:num_requests_waiting` | sum |
| `deferred` | `vllm:num_requests_waiting_by_reason{reason="deferred"}` (vLLM 0.32; below) | sum |
| `kv_usage` | `vllm:kv_cache_usage_perc` (older vLLM: `vllm:gpu_cache_usage_perc`) | mean |
| `block_size`, `num_gpu_blocks` | labels of `vllm:cache_config_info` | first / sum |
| `tokens` | `vllm:prompt_tokens_total` + `vllm:generation_tokens_total` (moved by engine steps) | sum |
| `served` | `vllm:request_success_total` (every `finished_reason`) | sum |
| `preemptions` | `vllm:num_preemptions_total` (running requests sent back: the cache ran out) | sum |
| `started` | `vllm:request_success_created` (Unix seconds its counters were created) | earliest |
| `adapters` | labels of `vllm:lora_requests_info` (below) | the series with the largest value |

`deferred` counts the waiting requests a transient constraint, the LoRA adapter budget among them,
held out of the last step's batch; the rest (`reason="capacity"`) wait for room. None on an engine
without the series (an older vLLM).

`vllm:lora_requests_info` (labels `running_lora_adapters`, `waiting_lora_adapters`, `max_lora`)
is a gauge whose value is the time of its last update, with one series
per label combination ever set (old ones stay), so the newest series (the largest value, as
llm-d's extractor picks it) is the current one. Example: `...{max_lora="2",running_lora_adapters="sql",
waiting_lora_adapters="sql"} 1.7e9` and `...{max_lora="2",running_lora_adapters="sql,chat",
waiting_lora_adapters="sql,chat"} 1.8e9` → `AdapterLoad(running={sql, chat}, waiting={sql, chat},
max_loras=2)`.

Example: `vllm:num_requests_running{engine="0"} 3`, `vllm:num_requests_waiting{engine="0"} 1`,
`vllm:kv_cache_usage_perc{engine="0"} 0.25`, `vllm:cache_config_info{block_size="16",num_gpu_blocks="256"} 1`
→ `EngineStats(running=3, waiting=1, kv_usage=0.25, block_size=16, num_gpu_blocks=256)`.

Text without the running/waiting gauges is not an engine's (`NotEngineMetrics`): a proxy's page, or an
engine that does not export them; the collector then has no data for it rather than zeros. So is a
page where a wanted sample is malformed, NaN or infinite.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from tandem.router.types import AdapterLoad, EngineStats

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_CONFIG = "vllm:cache_config_info"
TOKENS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
SERVED = "vllm:request_success_total"
STARTED = "vllm:request_success_created"
PREEMPTIONS = "vllm:num_preemptions_total"
LORA_INFO = "vllm:lora_requests_info"
_WANTED = frozenset(
    {
        RUNNING,
        WAITING,
        WAITING_BY_REASON,
        CACHE_CONFIG,
        *KV_USAGE,
        *TOKENS,
        SERVED,
        STARTED,
        PREEMPTIONS,
        LORA_INFO,
    }
)


class NotEngineMetrics(ValueError):
    """The text parsed (or not) but has no `vllm:num_requests_running`/`_waiting` samples."""


def parse_engine_metrics(text: str) -> EngineStats:
    """`EngineStats` from Prometheus text format; raises `NotEngineMetrics` (see the module docstring)."""
    samples: dict[str, list[tuple[str, float]]] = defaultdict(list)  # name → (label text, value)
    newest_lora: tuple[float, str] | None = None
    for line in _wanted_lines(text):
        if line.startswith(_LORA_LINE):
            time = _lora_time(line)
            if time is not None:
                if newest_lora is None or time >= newest_lora[0]:
                    newest_lora = (time, line)
                continue
        name, label_text, value = _sample(line)
        samples[name].append((label_text, value))
    if newest_lora is not None:
        name, label_text, value = _sample(newest_lora[1])
        samples[name].append((label_text, value))
    if RUNNING not in samples or WAITING not in samples:
        raise NotEngineMetrics(f"no {RUNNING} / {WAITING} samples")
    usage = next((samples[name] for name in KV_USAGE if samples.get(name)), [])
    block_size, num_gpu_blocks = _cache_config(samples.get(CACHE_CONFIG, []))
    tokens = [value for name in TOKENS for _, value in samples.get(name, [])]
    served = [value for _, value in samples.get(SERVED, [])]
    started = [value for _, value in samples.get(STARTED, []) if value > 0]
    preemptions = [value for _, value in samples.get(PREEMPTIONS, [])]
    return EngineStats(
        running=round(sum(value for _, value in samples[RUNNING])),
        waiting=round(sum(value for _, value in samples[WAITING])),
        kv_usage=sum(value for _, value in usage) / len(usage) if usage else None,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        tokens=sum(tokens) if tokens else None,
        served=sum(served) if served else None,
        started=min(started) if started else None,
        preemptions=sum(preemptions) if preemptions else None,
        adapters=_adapters(samples.get(LORA_INFO, [])),
        deferred=_deferred(samples.get(WAITING_BY_REASON, [])),
    )


# A real vLLM page is tens of kilobytes of histograms and this runs on the router's event loop, once
# per engine and scrape interval; so the wanted lines are found with one search for their common
# literal start (`\nvllm:`, which the regex engine looks for as a substring) and only those lines
# are parsed, by hand: 13 µs for the simulator's 20 KB page where `prometheus_client`'s parser over
# the same lines took 210 µs (docs/router-performance.md, "An idle gateway").
_WANTED_LINE = re.compile(
    r"\nvllm:((?:"
    + "|".join(re.escape(name.removeprefix("vllm:")) for name in sorted(_WANTED))
    + r")[{ \t][^\n]*)"
)
# One sample line of the text format: `name{label="value",...} value [timestamp]`.
_VALUE = r'[^"\\\n]*(?:\\.[^"\\\n]*)*'  # a label value between its quotes, with escapes
_LABEL = rf'[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"{_VALUE}"[ \t]*'
_SAMPLE = re.compile(
    rf"([a-zA-Z_:][a-zA-Z0-9_:]*)"  # the name
    rf"(?:\{{((?:{_LABEL}(?:,{_LABEL})*,?)?[ \t]*)\}})?"  # the labels
    rf"[ \t]+(\S+)(?:[ \t]+-?[0-9]+)?[ \t]*\r?"  # the value and a timestamp
)
_LABEL_PAIR = re.compile(rf'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"({_VALUE})"')


# `vllm:lora_requests_info` keeps one series per label combination ever set, so an engine serving
# many adapters lists thousands (about 4.7 ms to parse 1,000 with `_sample`, on the event loop, per
# engine and scrape). Only the newest is read: each line's value is taken from after its last `}`
# (0.4 ms for 1,000) and only the newest line is parsed in full.
_LORA_LINE = LORA_INFO.removeprefix("vllm:") + "{"


def _lora_time(line: str) -> float | None:
    """The value of a `lora_requests_info{...} value` line, read from after its last `}`; None when
    that is not a finite number (the line is then parsed in full, and a malformed one refused)."""
    parts = line[line.rfind("}") + 1 :].split()  # the value, and maybe a timestamp
    if len(parts) not in (1, 2):
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _wanted_lines(text: str) -> list[str]:
    """The sample lines of the wanted metrics, each without its `vllm:` start."""
    return _WANTED_LINE.findall("\n" + text)


def _sample(line: str) -> tuple[str, str, float]:
    """A wanted line (without `vllm:`) → (name, the text between its braces, value); raises
    `NotEngineMetrics` when it is not a well-formed sample."""
    match = _SAMPLE.fullmatch(line)
    if match is None:
        raise NotEngineMetrics(f"unparsable metrics text: {('vllm:' + line)[:200]!r}")
    name, label_text, raw_value = match.groups()
    try:
        value = float(raw_value)
    except ValueError:
        raise NotEngineMetrics(f"unparsable metrics text: value {raw_value[:50]!r} of vllm:{name}") from None
    if not math.isfinite(value):  # no count, share or total is infinite or NaN: a broken page
        raise NotEngineMetrics(f"vllm:{name} is {raw_value}, not a finite number")
    return "vllm:" + name, label_text or "", value


def _labels(text: str) -> dict[str, str]:
    """The text between a well-formed sample's braces → its labels, values as written (escapes are
    kept: the labels read here are numbers)."""
    return dict(_LABEL_PAIR.findall(text))


def _cache_config(samples: list[tuple[str, float]]) -> tuple[int | None, int | None]:
    block_size: int | None = None
    total_blocks = 0
    for label_text, _ in samples:
        labels = _labels(label_text)
        size = _positive_int(labels.get("block_size"))
        if block_size is None:
            block_size = size
        total_blocks += _positive_int(labels.get("num_gpu_blocks")) or 0
    return block_size, total_blocks or None


def _deferred(samples: list[tuple[str, float]]) -> int | None:
    """The `reason="deferred"` series of `vllm:num_requests_waiting_by_reason`, summed; None without one."""
    values = [value for label_text, value in samples if _labels(label_text).get("reason") == "deferred"]
    return round(sum(values)) if values else None


def _adapters(samples: list[tuple[str, float]]) -> AdapterLoad | None:
    """The newest `vllm:lora_requests_info` series (module docstring; of equal times the one written
    last, as a page lists series in the order they were first set); None without one."""
    if not samples:
        return None
    newest = max(range(len(samples)), key=lambda i: (samples[i][1], i))
    labels = _labels(samples[newest][0])
    return AdapterLoad(
        running=_names(labels.get("running_lora_adapters")),
        waiting=_names(labels.get("waiting_lora_adapters")),
        max_loras=_positive_int(labels.get("max_lora")),
    )


def _names(raw: str | None) -> frozenset[str]:
    """A comma-separated label value → its names (`""` → none)."""
    return frozenset(name for name in (raw or "").split(",") if name)


def _positive_int(raw: str | None) -> int | None:
    try:
        value = int(raw) if raw is not None else 0
    except ValueError:
        return None
    return value if value > 0 else None
