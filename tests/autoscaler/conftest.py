"""Fixtures for the in-cluster autoscaler tests: the emulated Kubernetes API (kmock with the
operator tests' `StampingEmulator`: resourceVersions, watches from a version), knowing the built-in
kinds and the InferenceService resource, on 127.0.0.1; and the autoscaler's real `HttpCluster` talking
to it (its EndpointSlice informer made but not run: a test writes the objects it needs)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest

# Helpers are imported as `tests.operator.*` (the name mypy gives them); a bare `pytest` does not
# have the repository root on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.operator.cluster_state import ISVC, NAMESPACE
from tests.operator.emulator import (
    StampingEmulator,
    know_inference_services,
    match_requests_by_index,
    parse_namespace_paths,
)

from tandem.autoscaler.kube import HttpCluster, Informer, slices_path
from tandem.core.kubeaccess import KubeAccess


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    return dict(kmock_options, cls=StampingEmulator)


@pytest.fixture
def api(kmock: kmock_lib.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch) -> kmock_lib.KubernetesEmulator:
    parse_namespace_paths(monkeypatch)
    match_requests_by_index(monkeypatch)
    return know_inference_services(kmock, resource=ISVC)


@pytest.fixture
async def cluster(api: kmock_lib.KubernetesEmulator) -> AsyncIterator[HttpCluster]:
    access = KubeAccess.plain(str(api.url))
    async with access.client() as client:
        slices = Informer(client=client, access=access, path=slices_path(NAMESPACE))
        yield HttpCluster(client=client, access=access, slices=[slices])
