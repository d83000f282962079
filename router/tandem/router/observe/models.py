"""The metrics of a gateway in front of many services: each service's registry, its samples labelled
`model="<served name>"`, and the gateway's own registry, exposed as one page.

Each service's components register in a `CollectorRegistry` of their own, exactly as a gateway of
one service does; `ModelsCollector` reads them all at scrape time and merges the families of one
name into one (the text format wants a family's samples together), adding `model` to every sample
of a service. The gateway's registry (process, event-loop lag, API keys, rate limits, the requests
that never reached a service, the names) is merged unlabelled. The `model` values are the configured
served names only: a client's unknown name is counted in `tandem_router_unknown_model_total`, which
has no label. With several workers, each worker's page is this union, then labelled `worker` and
merged again (`tandem.router.workers.exposition`).

Example: a service `qwen-v2`'s `tandem_router_requests_total{route="/v1/completions",status="200"} 3.0`
is exposed as `tandem_router_requests_total{model="qwen-v2",route="/v1/completions",status="200"} 3.0`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

PREFIX = "tandem_router"


class ModelsCollector(Collector):
    """`gateway`'s families, then every service's with `model` added, merged by name."""

    def __init__(self, gateway: CollectorRegistry, services: Sequence[tuple[str, CollectorRegistry]]) -> None:
        self._gateway = gateway
        self._services = tuple(services)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for family in self._gateway.collect():
            _into(merged, family, None)
        for model, registry in self._services:
            for family in registry.collect():
                _into(merged, family, model)
        return iter(merged.values())

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _into(merged: dict[str, Metric], family: Metric, model: str | None) -> None:
    into = merged.get(family.name)
    if into is None:
        into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
    if model is None:
        into.samples.extend(family.samples)
        return
    for s in family.samples:
        into.samples.append(Sample(s.name, {"model": model, **s.labels}, s.value, s.timestamp, s.exemplar))


class NameMetrics:
    """What the names did: each alias's picks by target, and the unknown names (no label: a
    client's name never becomes a label value)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.alias_requests = Counter(
            f"{PREFIX}_alias_requests",
            "Requests that named an alias, by alias and the service it sent them to.",
            ["alias", "target"],
            registry=registry,
        )
        self.unknown_model = Counter(
            f"{PREFIX}_unknown_model",
            "Requests answered 404 because their model is neither a served name nor an alias.",
            registry=registry,
        )

    def aliased(self, alias: str, target: str) -> None:
        self.alias_requests.labels(alias=alias, target=target).inc()

    def unknown(self) -> None:
        self.unknown_model.inc()
