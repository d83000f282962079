"""Prometheus metrics: vLLM's names, labels and buckets, in a registry owned by one app.

Every `vllm:` series carries `model_name` (the served name) and `engine="0"`, as vLLM v1's
`PrometheusStatLogger` does; counters are exposed with the `_total` suffix by prometheus_client.
Latencies are simulated seconds. The `tandem_sim_kv_pool_*` series count the simulator's own KV-pool
I/O (there is no vLLM equivalent).

With `--enable-lora` (`max_loras` set) two more: `vllm:lora_requests_info`, exactly as vLLM 0.32's
`PrometheusStatLogger` writes it (a gauge without `model_name`/`engine`, label names declared as
`max_lora`, `waiting_lora_adapters`, `running_lora_adapters` (prometheus_client exposes them sorted:
`max_lora`, `running_lora_adapters`, `waiting_lora_adapters`), set to the wall-clock time of every
update; one series per label combination, old ones keep their last time; in 0.32 both adapter labels
list every adapter with a waiting or running request, comma-separated), and the simulator's
`tandem_sim_lora_loads_total{source="disk"|"cpu"}`: adapters read from disk into the CPU tier, and
copied from the CPU tier into a GPU slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tandem.sim.engine.requests import IterationStats, SchedulerStats

#: vLLM v1 (`vllm/v1/metrics/loggers.py`): note there is no 2.0 s TTFT bucket.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
#: `request_latency_buckets`: e2e, queue, inference, prefill and decode times.
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_LABELS = ("model_name", "engine")
ENGINE_INDEX = "0"


class _Family:
    """Creates metrics in one registry, bound to the engine's `model_name`/`engine` labels."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self.registry = registry
        self.labels = labels

    def gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, _LABELS, registry=self.registry).labels(**self.labels)

    def counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, _LABELS, registry=self.registry).labels(**self.labels)

    def histogram(self, name: str, doc: str, *, buckets: tuple[float, ...]) -> Histogram:
        metric = Histogram(name, doc, _LABELS, registry=self.registry, buckets=buckets)
        return metric.labels(**self.labels)

    def by(self, name: str, doc: str, *, label: str, values: tuple[str, ...]) -> Counter:
        """A counter with one more label, every value exported from the start (at 0)."""
        metric = Counter(name, doc, (*_LABELS, label), registry=self.registry)
        for value in values:
            metric.labels(**self.labels, **{label: value})
        return metric


class SimMetrics:
    """The app's metrics; implements the engine loop's `StatsSink`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        model_name: str,
        block_size: int,
        num_gpu_blocks: int,
        max_loras: int | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self._labels = {"model_name": model_name, "engine": ENGINE_INDEX}
        self._wall = wall
        family = _Family(registry, self._labels)
        self._init_engine(family)
        self._init_latencies(family)
        self._init_pool(family)
        self._max_lora = str(max_loras) if max_loras is not None else None
        self._lora_info: Gauge | None = None
        self._lora_loads: Counter | None = None
        if max_loras is not None:
            self._lora_info = Gauge(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                ("max_lora", "waiting_lora_adapters", "running_lora_adapters"),
                registry=registry,
            )
            self._lora_loads = family.by(
                "tandem_sim_lora_loads",
                "LoRA adapter loads, by source (disk: into the CPU tier; cpu: into a GPU slot).",
                label="source",
                values=("disk", "cpu"),
            )
        cache_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"),
            registry=registry,
        )
        cache_info.labels(str(block_size), str(num_gpu_blocks), "True", ENGINE_INDEX).set(1)

    def _init_engine(self, family: _Family) -> None:
        self.running = family.gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = family.gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
            "status). Sum of all reasons equals vllm:num_requests_waiting.",
            (*_LABELS, "reason"),
            registry=family.registry,
        )
        self.waiting_for_capacity = by_reason.labels(**family.labels, reason="capacity")
        self.waiting_deferred = by_reason.labels(**family.labels, reason="deferred")
        self.kv_usage = family.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = family.counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.")
        self.prefix_hits = family.counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self.external_queries = family.counter(
            "vllm:external_prefix_cache_queries", "External prefix cache (KV connector) queries, in tokens."
        )
        self.external_hits = family.counter(
            "vllm:external_prefix_cache_hits", "External prefix cache (KV connector) hits, in tokens."
        )
        self.prompt_tokens = family.counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = family.counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.preemptions = family.counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self._success = family.by(
            "vllm:request_success",
            "Count of successfully processed requests.",
            label="finished_reason",
            values=("stop", "length", "abort"),
        )

    def _init_latencies(self, family: _Family) -> None:
        self.ttft = family.histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            buckets=TTFT_BUCKETS,
        )
        self.itl = family.histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            buckets=ITL_BUCKETS,
        )
        self.e2e = family.histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.queue = family.histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            buckets=REQUEST_LATENCY_BUCKETS,
        )

    def _init_pool(self, family: _Family) -> None:
        self._chunks_written = family.counter(
            "tandem_sim_kv_pool_chunks_written", "KV chunks written to the pool."
        )
        self._chunks_skipped = family.counter(
            "tandem_sim_kv_pool_chunks_skipped", "KV chunks not written because the pool already had them."
        )
        self._chunks_read = family.counter("tandem_sim_kv_pool_chunks_read", "KV chunks read from the pool.")
        self._chunks_foreign = family.counter(
            "tandem_sim_kv_pool_foreign_chunks",
            "KV chunks loaded that an engine of another --kv-generation wrote (garbage to a real engine).",
        )
        self._bytes_written = family.counter("tandem_sim_kv_pool_bytes_written", "Bytes written to the pool.")
        self._bytes_read = family.counter("tandem_sim_kv_pool_bytes_read", "Bytes read from the pool.")
        operations = ("lookup", "store")
        self._pool_errors = family.by(
            "tandem_sim_kv_pool_errors",
            "Failed KV pool operations, by operation.",
            label="operation",
            values=operations,
        )
        self._pool_fallbacks = family.by(
            "tandem_sim_kv_pool_fallbacks",
            "Requests served without the pool because it was unavailable, by operation.",
            label="operation",
            values=operations,
        )
        self._chunks_rejected = family.by(
            "tandem_sim_kv_pool_chunks_rejected",
            "KV chunks a keyed reader refused and recomputed, by reason (untagged: no tag; mac: wrong tag).",
            label="reason",
            values=("untagged", "mac"),
        )

    def record(self, iteration: IterationStats, scheduler: SchedulerStats) -> None:
        """Fold one step (or an arrival/abort) into the metrics."""
        self.running.set(scheduler.num_running)
        self.waiting.set(scheduler.num_waiting)
        self.waiting_for_capacity.set(scheduler.num_waiting - scheduler.num_deferred)
        self.waiting_deferred.set(scheduler.num_deferred)
        self.kv_usage.set(scheduler.kv_cache_usage)
        self.prefix_queries.inc(iteration.prefix_queries)
        self.prefix_hits.inc(iteration.prefix_hits)
        self.external_queries.inc(iteration.external_queries)
        self.external_hits.inc(iteration.external_hits)
        self.prompt_tokens.inc(iteration.num_prompt_tokens)
        self.generation_tokens.inc(iteration.num_generation_tokens)
        self.preemptions.inc(iteration.num_preemptions)
        for ttft in iteration.ttfts_s:
            self.ttft.observe(ttft)
        for itl in iteration.itls_s:
            self.itl.observe(itl)
        for finished in iteration.finished:
            self._success.labels(**self._labels, finished_reason=finished.finish_reason).inc()
            self.e2e.observe(finished.e2e_s)
            self.queue.observe(finished.queue_s)
        self._record_lora(iteration, scheduler)

    def _record_lora(self, iteration: IterationStats, scheduler: SchedulerStats) -> None:
        if self._lora_info is None or self._lora_loads is None:
            return
        self._lora_loads.labels(**self._labels, source="disk").inc(iteration.lora_disk_loads)
        self._lora_loads.labels(**self._labels, source="cpu").inc(iteration.lora_host_loads)
        names = ",".join(scheduler.lora_adapters)
        info = {"max_lora": self._max_lora, "waiting_lora_adapters": names, "running_lora_adapters": names}
        self._lora_info.labels(**info).set(self._wall())

    def pool_stored(self, *, written: int, skipped: int, nbytes: int) -> None:
        self._chunks_written.inc(written)
        self._chunks_skipped.inc(skipped)
        self._bytes_written.inc(nbytes)

    def pool_read(self, *, chunks: int, nbytes: int, foreign: int = 0) -> None:
        self._chunks_read.inc(chunks)
        self._bytes_read.inc(nbytes)
        self._chunks_foreign.inc(foreign)

    def pool_error(self, operation: str) -> None:
        self._pool_errors.labels(**self._labels, operation=operation).inc()

    def pool_fallback(self, operation: str) -> None:
        self._pool_fallbacks.labels(**self._labels, operation=operation).inc()

    def pool_rejected(self, reason: str) -> None:
        """A chunk read back whose tag was missing (`untagged`) or wrong (`mac`): treated as absent."""
        self._chunks_rejected.labels(**self._labels, reason=reason).inc()
