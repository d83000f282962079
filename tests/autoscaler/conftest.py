"""Fixtures for the in-cluster autoscaler tests: the emulated Kubernetes API (kmock with the
operator tests' `StampingEmulator`: resourceVersions, watches from a version), knowing the built-in
kinds and the InferenceService resource, on 127.0.0.1."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest

# Helpers are imported as `tests.operator.*` (the name mypy gives them); a bare `pytest` does not
# have the repository root on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.operator.cluster_state import ISVC
from tests.operator.emulator import StampingEmulator


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    return dict(kmock_options, cls=StampingEmulator)


@pytest.fixture
def api(kmock: kmock_lib.KubernetesEmulator) -> kmock_lib.KubernetesEmulator:
    with warnings.catch_warnings():
        # kmock 0.8 reads its bundled resource list with the legacy importlib.resources API.
        warnings.filterwarnings("ignore", "read_binary is deprecated", DeprecationWarning)
        kmock.resources.load_bundled()
    kmock.resources[ISVC] = kmock_lib.ResourceInfo(
        kind="InferenceService",
        singular="inferenceservice",
        namespaced=True,
        verbs={"list", "watch", "get", "patch", "create", "delete"},
        subresources={"status"},
    )
    return kmock
