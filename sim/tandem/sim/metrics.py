"""Prometheus metrics: vLLM's names, labels and buckets, in a registry owned by one app.

Every `vllm:` series carries `model_name` (the served name) and `engine="0"`, as vLLM v1's
`PrometheusStatLogger` does; counters are exposed with the `_total` suffix by prometheus_client.
Latencies are simulated seconds. The `tandem_sim_kv_pool_*` series count the simulator's own KV-pool
I/O (there is no vLLM equivalent).
"""

from __future__ import annotations

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


class SimMetrics:
    """The app's metrics; implements the engine loop's `StatsSink`."""

    def __init__(
        self, registry: CollectorRegistry, *, model_name: str, block_size: int, num_gpu_blocks: int
    ) -> None:
        self.registry = registry
        labels = {"model_name": model_name, "engine": ENGINE_INDEX}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, _LABELS, registry=registry).labels(**labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, _LABELS, registry=registry).labels(**labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, _LABELS, registry=registry, buckets=buckets).labels(**labels)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        cache_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"),
            registry=registry,
        )
        cache_info.labels(str(block_size), str(num_gpu_blocks), "True", ENGINE_INDEX).set(1)
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self.external_queries = counter(
            "vllm:external_prefix_cache_queries", "External prefix cache (KV connector) queries, in tokens."
        )
        self.external_hits = counter(
            "vllm:external_prefix_cache_hits", "External prefix cache (KV connector) hits, in tokens."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*_LABELS, "finished_reason"),
            registry=registry,
        )
        self._labels = labels
        for reason in ("stop", "length", "abort"):
            self._success.labels(**labels, finished_reason=reason)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self._init_pool_metrics(registry)

    def _init_pool_metrics(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, (*_LABELS, *extra), registry=registry)

        self._chunks_written = counter("tandem_sim_kv_pool_chunks_written", "KV chunks written to the pool.")
        self._chunks_skipped = counter(
            "tandem_sim_kv_pool_chunks_skipped", "KV chunks not written because the pool already had them."
        )
        self._chunks_read = counter("tandem_sim_kv_pool_chunks_read", "KV chunks read from the pool.")
        self._bytes_written = counter("tandem_sim_kv_pool_bytes_written", "Bytes written to the pool.")
        self._bytes_read = counter("tandem_sim_kv_pool_bytes_read", "Bytes read from the pool.")
        self._pool_errors = counter(
            "tandem_sim_kv_pool_errors", "Failed KV pool operations, by operation.", "operation"
        )
        self._pool_fallbacks = counter(
            "tandem_sim_kv_pool_fallbacks",
            "Requests served without the pool because it was unavailable, by operation.",
            "operation",
        )
        for family in (self._chunks_written, self._chunks_skipped, self._chunks_read):
            family.labels(**self._labels)
        for family in (self._bytes_written, self._bytes_read):
            family.labels(**self._labels)
        for operation in ("lookup", "store"):
            self._pool_errors.labels(**self._labels, operation=operation)
            self._pool_fallbacks.labels(**self._labels, operation=operation)

    def record(self, iteration: IterationStats, scheduler: SchedulerStats) -> None:
        """Fold one step (or an arrival/abort) into the metrics."""
        self.running.set(scheduler.num_running)
        self.waiting.set(scheduler.num_waiting)
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

    def pool_stored(self, *, written: int, skipped: int, nbytes: int) -> None:
        self._chunks_written.labels(**self._labels).inc(written)
        self._chunks_skipped.labels(**self._labels).inc(skipped)
        self._bytes_written.labels(**self._labels).inc(nbytes)

    def pool_read(self, *, chunks: int, nbytes: int) -> None:
        self._chunks_read.labels(**self._labels).inc(chunks)
        self._bytes_read.labels(**self._labels).inc(nbytes)

    def pool_error(self, operation: str) -> None:
        self._pool_errors.labels(**self._labels, operation=operation).inc()

    def pool_fallback(self, operation: str) -> None:
        self._pool_fallbacks.labels(**self._labels, operation=operation).inc()
