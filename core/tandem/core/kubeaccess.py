"""How a Tandem process reaches the Kubernetes API over HTTP: the gateway's EndpointSlice discovery and
the autoscaler share it.

`KubeAccess.in_cluster(environ)`: the pod's service-account token (re-read on every request, since bound
tokens rotate) and CA from `/var/run/secrets/kubernetes.io/serviceaccount/`, the server from
`KUBERNETES_SERVICE_HOST`/`_PORT` (IPv6 hosts bracketed). `KubeAccess.plain(url)`: an unauthenticated
endpoint such as `kubectl proxy` or a test's emulated API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeAccessError(ValueError):
    """No way to reach the API server: not in a cluster, and no `--kube-api-server` given."""


@dataclass(frozen=True, slots=True)
class KubeAccess:
    """The API server's URL, a bearer token read from `token_file` per request (None: no auth), and the
    CA bundle to verify TLS with (None: the system CAs)."""

    server: str
    token_file: Path | None = None
    ca_file: Path | None = None

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str]) -> KubeAccess:
        """The pod's own API access; raises `KubeAccessError` outside a cluster."""
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeAccessError(
                "not in a cluster (KUBERNETES_SERVICE_HOST/_PORT are unset); outside one, "
                "pass --kube-api-server (e.g. the URL of `kubectl proxy`)"
            )
        host = f"[{host}]" if ":" in host else host
        return cls(
            server=f"https://{host}:{port}",
            token_file=SERVICE_ACCOUNT_DIR / "token",
            ca_file=SERVICE_ACCOUNT_DIR / "ca.crt",
        )

    @classmethod
    def plain(cls, url: str) -> KubeAccess:
        return cls(server=url.rstrip("/"))

    def headers(self) -> dict[str, str]:
        if self.token_file is None:
            return {}
        return {"authorization": f"Bearer {self.token_file.read_text().strip()}"}

    def client(self) -> httpx.AsyncClient:
        verify: str | bool = str(self.ca_file) if self.ca_file is not None else True
        return httpx.AsyncClient(
            base_url=self.server, verify=verify, trust_env=False, timeout=httpx.Timeout(10.0)
        )
