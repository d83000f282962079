"""Discovery: where the engines of each pool are. One interface, one implementation per
`RouterConfig.discovery` kind; discovery only writes pool membership into the registry.

- `static`: the URLs from the config, set once at start-up.
- `kubernetes`: the EndpointSlices of each pool's headless Service (next issue; refused at
  start-up for now with a clear error).
"""

from __future__ import annotations

from typing import Protocol

from tandem.core.routerconfig import KubernetesDiscovery, StaticDiscovery
from tandem.router.endpoints import EndpointRegistry
from tandem.router.errors import ConfigurationError


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


def discovery_for(config: StaticDiscovery | KubernetesDiscovery) -> Discovery:
    """The discovery for a config; raises `ConfigurationError` for kinds not implemented yet."""
    if isinstance(config, StaticDiscovery):
        return StaticEndpoints(config)
    raise ConfigurationError(
        f"discovery kind {config.kind!r} is not implemented yet; use kind 'static' with the engines' URLs"
    )
