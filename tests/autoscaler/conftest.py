"""Fixtures for the in-cluster autoscaler tests: the emulated Kubernetes API (kmock with the
operator tests' `StampingEmulator`: resourceVersions, watches from a version), knowing the built-in
kinds and the InferenceService resource, on 127.0.0.1."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest

# Helpers are imported as `tests.operator.*` (the name mypy gives them); a bare `pytest` does not
# have the repository root on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.operator.cluster_state import ISVC
from tests.operator.emulator import StampingEmulator, know_inference_services, parse_namespace_paths


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    return dict(kmock_options, cls=StampingEmulator)


@pytest.fixture
def api(kmock: kmock_lib.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch) -> kmock_lib.KubernetesEmulator:
    parse_namespace_paths(monkeypatch)
    return know_inference_services(kmock, resource=ISVC)
