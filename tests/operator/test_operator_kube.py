"""The operator's API access (`tandem.operator.kube.connect`): kubeconfig files, the pod's service
account, and what happens with neither.

Real: the kubeconfig reader, `KubeAccess` and its TLS context. Faked: kubeconfig files and token files
in a temporary folder, the environment as a dict. No request is sent (the operator's requests are
exercised against kmock by the lifecycle tests).
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import pytest

from tandem.core.kubeaccess import SERVICE_ACCOUNT_DIR
from tandem.operator.cluster import ClusterError
from tandem.operator.kube import connect


def kubeconfig(tmp_path: Path, *, cluster: dict[str, Any], user: dict[str, Any]) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "dev",
        "contexts": [
            {"name": "other", "context": {"cluster": "other", "user": "other"}},
            {"name": "dev", "context": {"cluster": "dev", "user": "dev"}},
        ],
        "clusters": [{"name": "dev", "cluster": cluster}],
        "users": [{"name": "dev", "user": user}],
    }
    path = tmp_path / "config"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_kubeconfig_gives_its_current_contexts_server_and_token(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, cluster={"server": "http://127.0.0.1:8001/"}, user={"token": "abc"})
    access = connect(path)
    assert access.server == "http://127.0.0.1:8001"
    assert access.headers() == {"authorization": "Bearer abc"}
    assert access.tls is None


def test_an_auth_providers_cached_token_is_used_as_kopf_uses_it(tmp_path: Path) -> None:
    provider = {"auth-provider": {"name": "oidc", "config": {"access-token": "cached"}}}
    access = connect(kubeconfig(tmp_path, cluster={"server": "http://api"}, user=provider))
    assert access.headers() == {"authorization": "Bearer cached"}


def test_a_token_file_is_found_next_to_the_kubeconfig_and_read_per_request(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")
    access = connect(kubeconfig(tmp_path, cluster={"server": "http://api"}, user={"tokenFile": "token"}))
    assert access.headers() == {"authorization": "Bearer first"}
    (tmp_path / "token").write_text("rotated")
    assert access.headers() == {"authorization": "Bearer rotated"}


def test_an_https_cluster_gets_a_tls_context_that_verifies_unless_told_not_to(tmp_path: Path) -> None:
    verified = connect(kubeconfig(tmp_path, cluster={"server": "https://api:6443"}, user={}))
    assert verified.tls is not None and verified.tls.verify_mode == ssl.CERT_REQUIRED
    insecure = connect(
        kubeconfig(
            tmp_path, cluster={"server": "https://api:6443", "insecure-skip-tls-verify": True}, user={}
        )
    )
    assert insecure.tls is not None and insecure.tls.verify_mode == ssl.CERT_NONE
    assert insecure.headers() == {}


def test_in_a_cluster_the_service_account_is_used() -> None:
    access = connect(None, environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    assert access.server == "https://10.0.0.1:443"
    assert access.token_file == SERVICE_ACCOUNT_DIR / "token"


@pytest.mark.parametrize(
    "content",
    ["", json.dumps({"current-context": "dev", "contexts": []}), "clusters: [unclosed"],
    ids=["empty", "no such context", "not yaml"],
)
def test_an_unusable_kubeconfig_is_a_cluster_error_naming_the_problem(tmp_path: Path, content: str) -> None:
    path = tmp_path / "config"
    path.write_text(content)
    with pytest.raises(ClusterError) as caught:
        connect(str(path))
    assert caught.value.status == 0
    assert "no usable Kubernetes credentials" in str(caught.value)


def test_a_missing_kubeconfig_is_a_cluster_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="no usable Kubernetes credentials"):
        connect(str(tmp_path / "absent"))
