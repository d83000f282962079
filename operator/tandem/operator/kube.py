"""`Cluster` over Tandem's Kubernetes client (`tandem.core.kubeaccess`, httpx; synchronous, since the
kopf handlers that call it run in kopf's thread pool).

Objects are plain dicts on both sides: one small path table covers every kind the operator manages,
and every failure is `tandem.core.kubeerror.KubeError` (`ClusterError`), translated in `kubeaccess`.

Credentials (`connect`): a kubeconfig file's current context, read with the fields kopf's own
kubeconfig login reads (server; CA file or data, `insecure-skip-tls-verify`; token, token file, an
auth provider's cached access token, or client certificate and key as files or data; relative paths
from the file's folder; exec plugins are not run), else the pod's
service account (`KubeAccess.in_cluster`: the token re-read per request), else `~/.kube/config`.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tandem.core.gateway import GATEWAY_KIND, GATEWAY_PLURAL
from tandem.core.kubeaccess import KubeAccess, KubeAccessError, send_json
from tandem.core.spec import API_VERSION, KIND, PLURAL
from tandem.operator.cluster import ClusterError
from tandem.operator.objects import ObjectRef

#: Resource (plural) of every kind the operator manages, by (apiVersion, kind).
PLURALS = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("apps/v1", "Deployment"): "deployments",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("v1", "Secret"): "secrets",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkersets",
}
#: Kinds the operator only reads, for the adapters' status (tandem.operator.adapterstatus): a pvc://
#: adapter's claim (get), the engine pods' fetch results (list).
READ_PLURALS = {("v1", "PersistentVolumeClaim"): "persistentvolumeclaims", ("v1", "Pod"): "pods"}
#: Tandem's own kinds, which the operator lists and patches (annotations) but never creates.
OWN_PLURALS = {(API_VERSION, KIND): PLURAL, (API_VERSION, GATEWAY_KIND): GATEWAY_PLURAL}


def connect(kubeconfig: str | None, *, environ: Mapping[str, str] | None = None) -> KubeAccess:
    """The API access (module docstring): the kubeconfig file `kubeconfig` when given, else the pod's
    service account when `environ` (default: the process's) says it runs in a cluster, else
    `~/.kube/config`; ClusterError if none of them works."""
    try:
        if kubeconfig:
            return from_kubeconfig(Path(kubeconfig))
        try:
            return KubeAccess.in_cluster(os.environ if environ is None else environ)
        except KubeAccessError:
            return from_kubeconfig(Path.home() / ".kube" / "config")
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError, ssl.SSLError) as exc:
        raise ClusterError(0, f"no usable Kubernetes credentials: {exc!r}") from None


def from_kubeconfig(path: Path) -> KubeAccess:
    """The access of the kubeconfig's current context (module docstring); KeyError, ValueError,
    OSError or ssl.SSLError for a file that does not describe one."""
    doc = yaml.safe_load(path.read_text()) or {}

    def entry(section: str, name: object) -> dict[str, Any]:
        key = section.rstrip("s")  # "clusters" -> "cluster"
        for item in doc.get(section) or ():
            if item.get("name") == name:
                return dict(item.get(key) or {})
        raise KeyError(f"{path}: no {key} named {name!r}")

    context = entry("contexts", doc.get("current-context"))
    cluster, user = entry("clusters", context["cluster"]), entry("users", context.get("user"))
    server = str(cluster["server"]).rstrip("/")
    token_file = user.get("tokenFile")
    # An auth provider's cached token, as kopf uses it (the provider itself is not run).
    provider_token = ((user.get("auth-provider") or {}).get("config") or {}).get("access-token")
    return KubeAccess(
        server=server,
        token_file=path.parent / token_file if token_file else None,
        token=user.get("token") or provider_token,
        tls=_tls(cluster, user, base=path.parent) if server.startswith("https:") else None,
    )


def _tls(cluster: Mapping[str, Any], user: Mapping[str, Any], *, base: Path) -> ssl.SSLContext:
    """The TLS context of a kubeconfig's cluster and user entries."""
    ca_file, ca_data = cluster.get("certificate-authority"), cluster.get("certificate-authority-data")
    context = ssl.create_default_context(
        cafile=str(base / ca_file) if ca_file else None,
        cadata=base64.b64decode(ca_data).decode() if ca_data else None,
    )
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert_file, key_file = user.get("client-certificate"), user.get("client-key")
    cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
    if cert_file and key_file:
        context.load_cert_chain(str(base / cert_file), str(base / key_file))
    elif cert_data and key_data:
        # ssl loads a certificate chain from files only: write them to a private folder for the call.
        with tempfile.TemporaryDirectory() as folder:
            cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
            cert.write_bytes(base64.b64decode(cert_data))
            key.write_bytes(base64.b64decode(key_data))
            context.load_cert_chain(str(cert), str(key))
    return context


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    """`/apis/apps/v1/namespaces/ns/deployments` for ("apps/v1", "Deployment", "ns")."""
    try:
        plural = (PLURALS | OWN_PLURALS | READ_PLURALS)[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not manage {kind} ({api_version})") from None
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{root}/namespaces/{namespace}/{plural}"


def object_path(ref: ObjectRef) -> str:
    """The URL path of one object."""
    return f"{collection_path(ref.api_version, ref.kind, ref.namespace)}/{ref.name}"


class KubeCluster:
    """`tandem.operator.cluster.Cluster` over `access`; `timeout` is per request, in seconds."""

    def __init__(self, access: KubeAccess, *, timeout: float = 30.0) -> None:
        self._access = access
        self._client = access.sync_client(timeout_s=timeout)

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        try:
            return send_json(self._client, self._access, "GET", object_path(ref))
        except ClusterError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        found = send_json(self._client, self._access, "GET", collection_path(api_version, kind, namespace))
        items: list[dict[str, Any]] = (found or {}).get("items") or []
        # A list's items carry no apiVersion and kind; the objects' readers (Events, owners) need them.
        return [{"apiVersion": api_version, "kind": kind, **item} for item in items]

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        ref = ObjectRef.of(manifest)
        path = collection_path(ref.api_version, ref.kind, ref.namespace)
        return send_json(self._client, self._access, "POST", path, body=manifest)

    def patch(self, ref: ObjectRef, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (`kubeaccess` sends a PATCH's body as one)."""
        return send_json(self._client, self._access, "PATCH", object_path(ref), body=patch)

    def delete(self, ref: ObjectRef) -> None:
        try:
            send_json(
                self._client,
                self._access,
                "DELETE",
                object_path(ref),
                body={"propagationPolicy": "Background"},
            )
        except ClusterError as exc:
            if exc.status != 404:
                raise

    def close(self) -> None:
        self._client.close()
