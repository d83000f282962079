"""Fixtures for the operator tests: the emulated API server and the operator running against it.

Real: the operator (kopf with our registry and handlers, Tandem's Kubernetes client, every builder
and the reconcile), talking HTTP to 127.0.0.1. Emulated: the Kubernetes API (kmock plus
`emulator.StampingEmulator`); the Deployment controller is played by the tests (`mark_ready`).
kopf runs in its own thread and event loop, as `kopf.testing.KopfRunner` does: run in the test's
loop, it would cancel pytest-asyncio's teardown task at shutdown.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest

from tandem.core.kubeaccess import KubeAccess
from tandem.operator.handlers import run_operator
from tandem.operator.kube import KubeCluster
from tandem.operator.settings import OperatorSettings

# Helpers are imported as `tests.operator.*` (the name mypy gives them); `python -m pytest` has the
# repository root on sys.path already, a bare `pytest` does not.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.operator.cluster_state import ISVC, PATIENCE, RESYNC_SECONDS
from tests.operator.emulator import (
    StampingEmulator,
    know_inference_services,
    match_requests_by_index,
    parse_namespace_paths,
)


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    return dict(kmock_options, cls=StampingEmulator)


@pytest.fixture
def api(kmock: kmock_lib.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch) -> kmock_lib.KubernetesEmulator:
    """The emulated API server knowing the built-in kinds and the InferenceService resource."""
    parse_namespace_paths(monkeypatch)
    match_requests_by_index(monkeypatch)
    return know_inference_services(kmock, resource=ISVC)


@pytest.fixture
def kubeconfig(api: kmock_lib.KubernetesEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubeconfig pointing at the emulator, in $KUBECONFIG (kopf reads it at login)."""
    server = str(api.url).rstrip("/")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": server}}],
        "users": [{"name": "kmock", "user": {"token": "test"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


@pytest.fixture
def operator_namespaces() -> tuple[str, ...]:
    """The namespaces the `operator` fixture watches (`tandem operator --namespace`); empty: all of
    them. A test parametrizes this name to run the operator namespaced."""
    return ()


@pytest.fixture
def authorize() -> Callable[[Any], bool] | None:
    """The emulated API server's authorizer while the `operator` fixture runs (None: every request
    allowed); a test module overrides this fixture to run the operator under given rights."""
    return None


@contextmanager
def running_operator(server: str, *, namespaces: tuple[str, ...] = ()) -> Iterator[None]:
    """Run the operator in its own thread until the block ends."""
    settings = OperatorSettings(
        tandem_image="tandem:test", resync_seconds=RESYNC_SECONDS, namespaces=namespaces
    )
    stop, ready = threading.Event(), threading.Event()
    cluster = KubeCluster(KubeAccess(server=server, token="test"), timeout=5.0)
    coroutine = run_operator(settings, cluster=cluster, stop_flag=stop, ready_flag=ready)
    thread = threading.Thread(target=asyncio.run, args=(coroutine,), name="operator")
    thread.start()
    try:
        assert ready.wait(PATIENCE), "the operator did not start"
        yield
    finally:
        stop.set()
        thread.join(PATIENCE)
        cluster.close()
        assert not thread.is_alive(), "the operator did not stop"


@pytest.fixture
async def operator(
    api: kmock_lib.KubernetesEmulator,
    kubeconfig: Path,
    operator_namespaces: tuple[str, ...],
    authorize: Callable[[Any], bool] | None,
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """The operator, running (in `operator_namespaces`, under `authorize`); yields a function that
    restarts it (stop, then start a new one)."""
    assert isinstance(api, StampingEmulator)
    api.authorize = authorize
    server = str(api.url).rstrip("/")
    stack: list[Any] = []

    def start() -> None:
        manager = running_operator(server, namespaces=operator_namespaces)
        manager.__enter__()
        stack.append(manager)

    async def restart() -> None:
        await asyncio.to_thread(stack.pop().__exit__, None, None, None)
        await asyncio.to_thread(start)

    await asyncio.to_thread(start)
    yield restart
    while stack:
        await asyncio.to_thread(stack.pop().__exit__, None, None, None)
