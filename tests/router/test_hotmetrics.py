"""The request path's cheap metric families write what `prometheus_client`'s own would for the same
recordings (their `_created` series aside), and refuse what Prometheus would not accept."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tandem.router.observe.hotmetrics import LabeledCounter, LabeledHistogram

BUCKETS = (0.0, 1e-5, 0.001, 0.5, 1.0, 10.0)
VALUES = [0.0, -1.0, 1e-5, 2e-5, 0.3, 0.5, 0.5000001, 7.0, 10.0, 11.0, 1e9]


def exposition(registry: CollectorRegistry) -> list[str]:
    lines = generate_latest(registry).decode().splitlines()
    return [line for line in lines if "_created" not in line]


def test_a_histogram_writes_the_same_series_as_prometheus_clients() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hot = LabeledHistogram("x_seconds", "Doc.", ["pool", "plugin"], buckets=BUCKETS, registry=ours)
    reference = Histogram("x_seconds", "Doc.", ["pool", "plugin"], buckets=BUCKETS, registry=theirs)
    for i, value in enumerate(VALUES):
        plugin = "prefix" if i % 3 else "load"
        hot.labels("decode", plugin).observe(value)
        reference.labels(pool="decode", plugin=plugin).observe(value)
    assert exposition(ours) == exposition(theirs)
    assert 'x_seconds_bucket{le="+Inf",plugin="prefix",pool="decode"}' in generate_latest(ours).decode()


def test_a_counter_writes_the_same_series_as_prometheus_clients() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hot = LabeledCounter("y_total", "Doc.", ["route", "status"], registry=ours)
    reference = Counter("y_total", "Doc.", ["route", "status"], registry=theirs)
    for status, amount in [("200", 1.0), ("200", 2.5), ("429", 1.0)]:
        hot.labels("completions", status).inc(amount)
        reference.labels(route="completions", status=status).inc(amount)
    assert exposition(ours) == exposition(theirs)


def test_a_child_is_looked_up_once_per_label_values() -> None:
    counter = LabeledCounter("z", "Doc.", ["pool"], registry=CollectorRegistry())
    assert counter.labels("decode") is counter.labels("decode")
    assert counter.labels("decode") is not counter.labels("prefill")


def test_bad_labels_buckets_and_amounts_are_refused() -> None:
    registry = CollectorRegistry()
    counter = LabeledCounter("a", "Doc.", ["pool"], registry=registry)
    with pytest.raises(ValueError, match=r"expected labels \['pool'\]"):
        counter.labels("decode", "extra")
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("decode").inc(-1)
    with pytest.raises(ValueError, match="needs label names"):
        LabeledCounter("b", "Doc.", [], registry=registry)
    for buckets in ([], [1.0, 0.5], [0.5, 0.5], [1.0, float("inf")]):
        with pytest.raises(ValueError, match="buckets must be"):
            LabeledHistogram("c", "Doc.", ["pool"], buckets=buckets, registry=registry)


def test_a_name_already_registered_is_refused() -> None:
    registry = CollectorRegistry()
    LabeledHistogram("d_seconds", "Doc.", ["pool"], buckets=BUCKETS, registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Histogram("d_seconds", "Doc.", ["pool"], buckets=BUCKETS, registry=registry)
