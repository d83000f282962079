"""The connector's counters as vLLM's connector-stats hooks carry them: `TandemConnectorStats` (increments
since the last report, aggregated across workers and the scheduler) and `TandemPromMetrics` (the
`tandem_kvpool_connector_<name>_total` Prometheus counters vLLM's frontend serves). Imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from tandem.kvpool.connector_plan import COUNTER_HELP, empty_counters

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass
class TandemConnectorStats(KVConnectorStats):  # type: ignore[misc]
    """Counter increments since the last report (`connector_plan.COUNTER_HELP` names)."""

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data = empty_counters()

    def add(self, name: str, value: int = 1) -> None:
        self.data[name] = self.data.get(name, 0) + value

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            self.add(name, int(value))
        return self

    def reduce(self) -> dict[str, int | float]:
        return {name: value for name, value in self.data.items() if value}

    def is_empty(self) -> bool:
        return not any(self.data.values())

    def take(self) -> TandemConnectorStats | None:
        """The increments so far (None when there are none), then start again from zero."""
        if self.is_empty():
            return None
        taken = TandemConnectorStats(data=dict(self.data))
        self.reset()
        return taken


class TandemPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """`tandem_kvpool_connector_<name>_total` counters, one child per engine."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[str, dict[int, Any]] = {}
        for name, help_text in COUNTER_HELP.items():
            counter = self._counter_cls(f"tandem_kvpool_connector_{name}", help_text, labelnames=labelnames)
            self._counters[name] = {
                engine: counter.labels(*values) for engine, values in per_engine_labelvalues.items()
            }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            child = self._counters.get(name, {}).get(engine_idx)
            if child is not None and value:
                child.inc(value)
