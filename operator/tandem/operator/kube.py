"""`Cluster` implemented with the official `kubernetes` client (synchronous; the kopf handlers that
call it run in kopf's thread pool).

Objects are plain dicts on both sides: requests go through the client's generic `call_api`, so one
small path table covers every kind the operator manages, and foreign errors are translated into
`ClusterError` here, at the boundary.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

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
}
MERGE_PATCH = "application/merge-patch+json"


def connect(kubeconfig: str | None) -> client.ApiClient:
    """An API client: the kubeconfig file `kubeconfig` when given (its current context), else the
    pod's service account when running in a cluster, else `~/.kube/config`; ClusterError if none
    of them works."""
    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as exc:
        raise ClusterError(0, f"no usable Kubernetes credentials: {exc}") from None
    return client.ApiClient(configuration)


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    """`/apis/apps/v1/namespaces/ns/deployments` for ("apps/v1", "Deployment", "ns")."""
    try:
        plural = PLURALS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not manage {kind} ({api_version})") from None
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{root}/namespaces/{namespace}/{plural}"


def object_path(ref: ObjectRef) -> str:
    """The URL path of one object."""
    return f"{collection_path(ref.api_version, ref.kind, ref.namespace)}/{ref.name}"


class KubeCluster:
    """`tandem.operator.cluster.Cluster` over an `ApiClient`; `timeout` is per request, in seconds."""

    def __init__(self, api: client.ApiClient, *, timeout: float = 30.0) -> None:
        self._api = api
        self._timeout = timeout

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        try:
            return self._call("GET", object_path(ref))
        except ClusterError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        ref = ObjectRef.of(manifest)
        path = collection_path(ref.api_version, ref.kind, ref.namespace)
        return self._call("POST", path, body=manifest)

    def patch(self, ref: ObjectRef, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", object_path(ref), body=patch, content_type=MERGE_PATCH)

    def delete(self, ref: ObjectRef) -> None:
        try:
            self._call("DELETE", object_path(ref), body={"propagationPolicy": "Background"})
        except ClusterError as exc:
            if exc.status != 404:
                raise

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        request = self._api.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(*request, _request_timeout=self._timeout)
            response.read()  # type: ignore[no-untyped-call]
        except ApiException as exc:
            raise ClusterError(int(exc.status or 0), str(exc.reason)) from None
        except urllib3.exceptions.HTTPError as exc:
            raise ClusterError(0, f"{method} {path}: {exc}") from None
        try:
            data = json.loads(response.data or b"{}")
        except ValueError:
            data = {"message": (response.data or b"")[:200].decode(errors="replace")}
        if not 200 <= response.status <= 299:
            raise ClusterError(response.status, str(data.get("message") or response.reason))
        if not isinstance(data, dict):
            raise ClusterError(response.status, f"{method} {path}: answer is not an object")
        return data
