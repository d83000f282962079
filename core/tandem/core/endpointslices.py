"""Engine pools as Kubernetes sees them: Service names and the ready members of EndpointSlices.

Pure: names in, names out; EndpointSlice objects (dicts as the API returns them) in, URLs out. Shared by
the router (which routes to the members) and the autoscaler (which scrapes them), so both see the same
engines, and by anything that must name a pool's Service or Deployment without importing the operator.

- **Names**: every child of an InferenceService `demo` is `demo-<suffix>`; a pool's Deployment and its
  headless Service share the name `demo-prefill` / `demo-decode`, the gateway's are `demo-router`.
- **Members** (`ready_urls`): every address of every endpoint whose `conditions.ready` is not false
  (Kubernetes: "nil should be interpreted as ready"), as `http://<address>:<port>` (IPv6 addresses in
  brackets), deduplicated and sorted. Slices are checked against `kubernetes.io/service-name` here too,
  so an API server (or an emulator) that ignores `labelSelector` cannot add another Service's pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: Ports the operator gives engine and gateway pods (and their Services).
ENGINE_PORT = 8000
ROUTER_PORT = 8080
ROUTER_SUFFIX = "router"


def pool_workload_name(service: str, pool: Literal["prefill", "decode"]) -> str:
    """The Deployment (and headless Service) of one pool: `demo` + `decode` → `demo-decode`."""
    return f"{service}-{pool}"


def router_workload_name(service: str) -> str:
    """The gateway's Deployment and Service: `demo` → `demo-router`."""
    return f"{service}-{ROUTER_SUFFIX}"


def ready_urls(slices: Iterable[Mapping[str, Any]], *, service: str, port: int) -> list[str]:
    """The URLs of `service`'s ready endpoints in `slices` (module docstring), sorted."""
    urls: set[str] = set()
    for slice_ in slices:
        labels = (slice_.get("metadata") or {}).get("labels") or {}
        if labels.get(SERVICE_NAME_LABEL) != service:
            continue
        for endpoint in slice_.get("endpoints") or ():
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            for address in endpoint.get("addresses") or ():
                host = f"[{address}]" if ":" in address else address
                urls.add(f"http://{host}:{port}")
    return sorted(urls)
