"""Discovery: where the engines of each pool are. One interface, one implementation per
`RouterConfig.discovery` kind; discovery only writes pool membership into the registry.

- `static`: the URLs from the config, set once at start-up.
- `kubernetes`: the ready addresses of each pool's Service's EndpointSlices, listed and watched
  (`tandem.router.endpointslices.KubernetesEndpoints`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tandem.core.routerconfig import KubernetesDiscovery, StaticDiscovery
from tandem.router.endpoints import EndpointRegistry
from tandem.router.endpointslices import KubeAPI, KubernetesEndpoints


class Discovery(Protocol):
    """Keeps an `EndpointRegistry`'s pool membership current.

    `start` fills both pools before returning (so the first request finds endpoints) and may
    start background work that calls `registry.set_pool` on changes; `stop` ends that work.
    """

    async def start(self, registry: EndpointRegistry) -> None: ...

    async def stop(self) -> None: ...


class StaticEndpoints:
    """Fixed engine URLs from the config file."""

    def __init__(self, config: StaticDiscovery) -> None:
        self._config = config

    async def start(self, registry: EndpointRegistry) -> None:
        registry.set_pool("prefill", self._config.prefill)
        registry.set_pool("decode", self._config.decode)

    async def stop(self) -> None:
        return None


def discovery_for(
    config: StaticDiscovery | KubernetesDiscovery,
    *,
    environ: Mapping[str, str],
    kube_api_server: str | None = None,
) -> Discovery:
    """The discovery for a config. Kubernetes: the API server at `kube_api_server` without
    credentials (e.g. `kubectl proxy`) when given, else the pod's in-cluster access from `environ`;
    raises `ConfigurationError` when neither is available."""
    if isinstance(config, StaticDiscovery):
        return StaticEndpoints(config)
    api = KubeAPI.plain(kube_api_server) if kube_api_server else KubeAPI.in_cluster(environ)
    return KubernetesEndpoints(config, api=api)
