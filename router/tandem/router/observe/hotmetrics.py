"""Prometheus counters and histograms for the request path, at a fraction of `prometheus_client`'s cost.

`prometheus_client`'s `labels(**kw)` builds and checks a label tuple on every call, and every `inc` or
`observe` takes a lock (two for a histogram observation). The gateway records several of them per
request (one per scheduler plugin per decision), which made metrics a third of a routing decision's
CPU (docs/router-performance.md). Here a child is looked up once per label tuple in a dict, and
recording is plain arithmetic:

- `LabeledCounter(...).labels("decode", "ok").inc()`;
- `LabeledHistogram(...).labels("decode", "prefix").observe(1.2e-5)`: `bisect` to the first bucket
  whose upper bound is ≥ the value (Prometheus' `le`), then one addition to that bucket and one to
  the sum.

No lock: the gateway's event loop is the only thread that records (each worker process has its own
registry). A scrape runs on the same loop, between two recordings, so it always reads a consistent
histogram; the `_count` and `+Inf` bucket are derived from the buckets, never stored apart. Label
values are given positionally, in `labelnames` order. The exposition is `prometheus_client`'s own
(`CounterMetricFamily`, `HistogramMetricFamily` on the same `CollectorRegistry`); unlike its
`Counter` and `Histogram` there is no `_created` series.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["CounterChild", "HistogramChild", "LabeledCounter", "LabeledHistogram"]

Child = TypeVar("Child", "CounterChild", "HistogramChild")

#: How `prometheus_client` writes a bucket's `le` (untyped there).
_le: Callable[[float], str] = floatToGoString


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up, not by {amount}")
        self.value += amount


class HistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf only)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value


class _Family(Collector, Generic[Child]):
    """What both families share: the name, the label names, and the children by label values."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        if not labelnames:
            raise ValueError(f"{name}: a labeled metric needs label names")
        self._name, self._documentation, self._labelnames = name, documentation, list(labelnames)
        self._children: dict[tuple[str, ...], Child] = {}

    def labels(self, *values: str) -> Child:
        """The child for `values` (in `labelnames` order), made on first use."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: expected labels {self._labelnames}, got {list(values)}")
            child = self._children[values] = self._new_child()
        return child

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def _new_child(self) -> Child:
        raise NotImplementedError

    def _family(self) -> Metric:
        raise NotImplementedError


class LabeledCounter(_Family[CounterChild]):
    """A counter family (`<name>_total`); `labels(*values)` returns the cached child."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], *, registry: CollectorRegistry
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames)
        registry.register(self)

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in list(self._children.items()):
            family.add_metric(list(values), child.value)
        yield family


class LabeledHistogram(_Family[HistogramChild]):
    """A histogram family with fixed finite `buckets` (upper bounds, ascending; `+Inf` is added);
    `labels(*values)` returns the cached child."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        super().__init__(name, documentation, labelnames)
        bounds = tuple(float(b) for b in buckets)
        if not bounds or list(bounds) != sorted(set(bounds)) or bounds[-1] == float("inf"):
            raise ValueError(f"{name}: buckets must be finite, distinct and ascending, got {list(buckets)}")
        self._bounds = bounds
        self._labels = [_le(b) for b in bounds] + ["+Inf"]
        registry.register(self)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in list(self._children.items()):
            cumulative, running = [], 0
            for label, count in zip(self._labels, child.counts, strict=True):
                running += count
                cumulative.append((label, running))
            family.add_metric(list(values), buckets=cumulative, sum_value=child.sum)
        yield family
