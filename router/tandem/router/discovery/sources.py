"""Discovery: where the engines of each pool are. One interface, one implementation per
`RouterConfig.discovery` kind; discovery only writes pool membership into the registry.

- `static`: the URLs from the config, set once at start-up.
- `kubernetes`: the ready addresses of each pool's Service's EndpointSlices, listed and watched
  (`tandem.router.discovery.kubernetes.KubernetesEndpoints`).
- `file`: an `EndpointList` JSON file, re-read when its inode, modification time or size changes (checked
  every `pollSeconds`); the local runtime rewrites it atomically as engines start and drain. A file
  that is missing or unreadable at start leaves both pools empty; one that becomes unreadable later
  keeps the last good membership (logged), since a half-done edit must not empty the pools.
  Its optional `layouts` maps engine URLs to their KV layouts (`EndpointFile`), which the gateway
  pairs prefill and decode engines by (`tandem.router.pd.disagg`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from pydantic import Field

from tandem.core.kubeaccess import KubeAccess, KubeAccessError
from tandem.core.routerconfig import EndpointList, FileDiscovery, KubernetesDiscovery, StaticDiscovery
from tandem.core.tasks import stop_task
from tandem.router.discovery.kubernetes import KubernetesEndpoints
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.errors import ConfigurationError

log = logging.getLogger(__name__)


class Discovery(Protocol):
    """Keeps an `EndpointRegistry`'s pool membership current.

    `start` fills both pools before returning (so the first request finds endpoints) and may
    start background work that calls `registry.set_pool` on changes; `stop` ends that work.
    """

    async def start(self, registry: EndpointRegistry) -> None: ...

    async def stop(self) -> None: ...


class EndpointFile(EndpointList):
    """A `kind: file` discovery's file: an `EndpointList`, plus each engine's KV layout by URL
    (`Endpoint.layout`; the value of its pod's `tandem.dev/kv-layout` label). An engine not in
    `layouts` has none and pairs with any other. Example:

        {"prefill": ["http://127.0.0.1:8101"], "decode": ["http://127.0.0.1:8201"],
         "layouts": {"http://127.0.0.1:8101": "3f1c0a9e", "http://127.0.0.1:8201": "3f1c0a9e"}}
    """

    layouts: dict[str, str] = Field(default_factory=dict)


def read_endpoints(path: Path) -> EndpointFile:
    """Parse an endpoint file. Raises OSError when it cannot be read and ValueError (pydantic's
    ValidationError included) when it is not an `EndpointFile` in JSON."""
    return EndpointFile.model_validate_json(path.read_bytes())


class StaticEndpoints:
    """Fixed engine URLs from the config file."""

    def __init__(self, config: StaticDiscovery) -> None:
        self._config = config

    async def start(self, registry: EndpointRegistry) -> None:
        registry.set_pool("prefill", self._config.prefill)
        registry.set_pool("decode", self._config.decode)

    async def stop(self) -> None:
        return None


class FileEndpoints:
    """Engine URLs from an endpoint file, followed while it changes (module docstring)."""

    def __init__(self, config: FileDiscovery) -> None:
        self._path = Path(config.path)
        self._poll_s = config.poll_seconds
        self._seen: tuple[int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, registry: EndpointRegistry) -> None:
        self.reload(registry)
        self._task = asyncio.create_task(self._follow(registry), name="watch-endpoint-file")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)

    def reload(self, registry: EndpointRegistry) -> bool:
        """Re-read the file if it changed since the last read; True when the pools were rewritten."""
        try:
            stat = self._path.stat()
        except OSError as exc:
            if self._seen is None:
                log.warning("endpoint file unreadable", extra={"path": str(self._path), "error": repr(exc)})
                self._seen = (-1, -1, -1)
            return False
        # The inode too: an atomic replace makes a new one even within the clock's mtime granularity.
        seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            endpoints = read_endpoints(self._path)
        except (OSError, ValueError) as exc:
            log.warning(
                "endpoint file invalid; keeping the last membership",
                extra={"path": str(self._path), "error": repr(exc)},
            )
            return False
        registry.set_pool("prefill", endpoints.prefill, layouts=endpoints.layouts)
        registry.set_pool("decode", endpoints.decode, layouts=endpoints.layouts)
        log.info(
            "pool members changed",
            extra={
                "path": str(self._path),
                "prefill": endpoints.prefill,
                "decode": endpoints.decode,
                "layouts": endpoints.layouts,
            },
        )
        return True

    async def _follow(self, registry: EndpointRegistry) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            self.reload(registry)


def discovery_for(
    config: StaticDiscovery | KubernetesDiscovery | FileDiscovery,
    *,
    environ: Mapping[str, str],
    kube_api_server: str | None = None,
) -> Discovery:
    """The discovery for a config. Kubernetes: the API server at `kube_api_server` without
    credentials (e.g. `kubectl proxy`) when given, else the pod's in-cluster access from `environ`;
    raises `ConfigurationError` when neither is available."""
    if isinstance(config, StaticDiscovery):
        return StaticEndpoints(config)
    if isinstance(config, FileDiscovery):
        return FileEndpoints(config)
    try:
        api = KubeAccess.plain(kube_api_server) if kube_api_server else KubeAccess.in_cluster(environ)
    except KubeAccessError as exc:
        raise ConfigurationError(f"kubernetes discovery: {exc}") from None
    return KubernetesEndpoints(config, api=api)
