"""An adapter's life in the cluster, against the emulated Kubernetes API: declared, installed by the
engine pods' sidecar, failed with a reason, removed and added while the pods run; the status, the
count and the Events; the engine and gateway pod templates that never change with the adapters; a
catalog's names, as the sidecars report them, reaching the gateway's `<name>-adapter-names`.

Real: the operator process as `tandem operator` runs it (kopf, handlers, reconcile, builders) over
HTTP on 127.0.0.1, and its HTTP reads of the sidecars' reports. Emulated: the API server (kmock +
StampingEmulator); the kubelet, played by writing an engine pod as it reports it (IP 127.0.0.1, the
sidecar started); the sidecar, played by a loopback HTTP server whose `/adapters` answer the test
sets (the real sidecar: tests/cli/test_adapter_sync.py). Timeouts guard against hangs; nothing
asserts on speed.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kmock as kmock_lib
import pytest
from tests.operator import cluster_state as k8s
from tests.operator.cluster_state import NAMESPACE, eventually

LORA_DEMO: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "demo", "namespace": NAMESPACE},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "qwen"},
        "engine": {"kind": "sim", "lora": {"maxLoras": 2, "maxRank": 16}},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
        "kvPool": {"redis": {"memory": "1Gi"}},
        "adapters": [
            {"name": "sql", "source": "hf://org/sql-lora@v2"},
            {"name": "chat", "source": "s3://loras/chat"},
        ],
    },
}
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def adapter_events(api: kmock_lib.KubernetesEmulator) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events posted about `demo` for its adapters."""
    found = []
    for request in list(api):
        body = request.data if isinstance(request.data, dict) else {}
        involved = body.get("involvedObject") or {}
        if str(body.get("reason", "")).startswith("Adapter") and involved.get("name") == "demo":
            found.append((body["type"], body["reason"], body["message"]))
    return found


def adapters(api: kmock_lib.KubernetesEmulator) -> dict[str, tuple[str, str]]:
    status = k8s.isvc(api, "demo").get("status", {})
    return {a["name"]: (a["state"], a.get("reason", "")) for a in status.get("adapters") or []}


class Sidecar:
    """A loopback `/adapters` endpoint answering `adapters` as a sidecar's report."""

    def __init__(self) -> None:
        self.adapters: dict[str, dict[str, str]] = {}
        self.catalog: list[str] = []
        sidecar = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                report = {"digest": "", "passes": 1, "listError": "", "adapters": sidecar.adapters}
                body = json.dumps(report | {"catalog": sidecar.catalog})
                self.send_response(200 if self.path == "/adapters" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def set(self, **states: tuple[str, str, str]) -> None:
        """Each adapter's (source, state, reason) as the next pass reports it."""
        self.adapters = {n: {"source": s, "state": st, "reason": r} for n, (s, st, r) in states.items()}


@pytest.fixture
def sidecar() -> Iterator[Sidecar]:
    found = Sidecar()
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()
    thread.join(timeout=5)


async def engine_pod(api: kmock_lib.KubernetesEmulator, name: str, *, role: str, port: int) -> None:
    """A running pod of the `role` pool as the kubelet reports it, its sidecar listening on `port`."""
    deployment = k8s.find(api, "Deployment", f"demo-{role}")
    assert deployment is not None
    template = deployment["spec"]["template"]
    [sync] = copy.deepcopy(template["spec"]["initContainers"])
    sync["ports"] = [{"name": "adapter-sync", "containerPort": port, "protocol": "TCP"}]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": template["metadata"]["labels"]},
        "spec": {"initContainers": [sync], "containers": template["spec"]["containers"]},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "initContainerStatuses": [
                {"name": "adapters-sync", "started": True, "ready": False, "state": {"running": {}}}
            ],
        },
    }
    response = await api.post(PODS, json=pod)
    assert response.status == 200, await response.text()


def adapter_list(api: kmock_lib.KubernetesEmulator) -> list[dict[str, str]]:
    found = k8s.find(api, "ConfigMap", "demo-adapters")
    assert found is not None
    return list(json.loads(found["data"]["adapters.json"])["adapters"])


def adapter_names(api: kmock_lib.KubernetesEmulator) -> list[str] | None:
    """The names the gateway reads (`demo-adapter-names`), None before the ConfigMap exists."""
    found = k8s.find(api, "ConfigMap", "demo-adapter-names")
    return None if found is None else list(json.loads(found["data"]["names.json"])["adapters"])


def decode_template(api: kmock_lib.KubernetesEmulator) -> dict[str, Any]:
    decode = k8s.find(api, "Deployment", "demo-decode")
    assert decode is not None
    return dict(decode["spec"]["template"])


def router_template(api: kmock_lib.KubernetesEmulator) -> dict[str, Any]:
    router = k8s.find(api, "Deployment", "demo-router")
    assert router is not None
    return dict(router["spec"]["template"])


SQL, CHAT, DOCS = "hf://org/sql-lora@v2", "s3://loras/chat", "hf://org/docs-lora"
NO_BUCKET = "s3://loras/chat: NoSuchBucket: The specified bucket does not exist"


async def test_remote_adapters_come_and_go_on_running_pods_with_events_and_a_count(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]], sidecar: Sidecar
) -> None:
    await k8s.apply(api, copy.deepcopy(LORA_DEMO))
    await eventually(lambda: k8s.find(api, "Deployment", "demo-decode") is not None, "the decode pool")
    template = decode_template(api)
    [sync] = template["spec"]["initContainers"]
    assert (sync["name"], sync["restartPolicy"]) == ("adapters-sync", "Always")
    assert "sql-lora" not in json.dumps(template) and "loras/chat" not in json.dumps(template)
    assert adapter_list(api) == [{"name": "sql", "source": SQL}, {"name": "chat", "source": CHAT}]
    assert adapter_names(api) == ["sql", "chat"]
    await eventually(lambda: k8s.find(api, "Deployment", "demo-router") is not None, "the gateway")
    gateway = router_template(api)
    await eventually(lambda: k8s.isvc(api, "demo").get("status", {}).get("adapterSummary") == "0/2", "0/2")
    assert set(adapters(api).values()) == {("Pending", "no engine pod is running yet")}
    assert k8s.condition(api, "demo", "AdaptersReady")["reason"] == "AdaptersPending"

    sidecar.set(sql=(SQL, "Ready", "fetched"), chat=(CHAT, "Failed", NO_BUCKET))
    await engine_pod(api, "demo-decode-1", role="decode", port=sidecar.port)
    await eventually(lambda: adapters(api).get("chat", ("",))[0] == "Failed", "chat Failed")
    assert adapters(api) == {"sql": ("Ready", "installed on 1/1 engine pods"), "chat": ("Failed", NO_BUCKET)}
    assert k8s.isvc(api, "demo")["status"]["adapterSummary"] == "1/2"
    condition = k8s.condition(api, "demo", "AdaptersReady")
    assert (condition["status"], condition["reason"]) == ("False", "AdaptersFailed")
    await eventually(lambda: ("Warning", "AdapterFailed") in [e[:2] for e in adapter_events(api)], "event")
    assert ("Warning", "AdapterFailed", f"adapter 'chat' ({CHAT}) is Failed: {NO_BUCKET}") in adapter_events(
        api
    )
    assert ("Normal", "AdapterReady") in [e[:2] for e in adapter_events(api)]

    # chat removed, docs added: only the list changes; the pods keep running.
    await k8s.patch_spec(
        api, "demo", {"adapters": [{"name": "sql", "source": SQL}, {"name": "docs", "source": DOCS}]}
    )
    await eventually(lambda: "docs" in adapters(api), "docs in the status")
    assert adapter_list(api) == [{"name": "sql", "source": SQL}, {"name": "docs", "source": DOCS}]
    assert decode_template(api) == template, "adding or removing an adapter must not roll the engines"
    assert adapter_names(api) == ["sql", "docs"]
    assert router_template(api) == gateway, "nor the gateway"
    assert adapters(api)["docs"][0] == "Pending"
    await eventually(lambda: ("Normal", "AdapterRemoved") in [e[:2] for e in adapter_events(api)], "removed")

    sidecar.set(sql=(SQL, "Ready", "cached"), docs=(DOCS, "Ready", "fetched"))
    await eventually(lambda: k8s.condition(api, "demo", "AdaptersReady").get("status") == "True", "ready")
    assert adapters(api) == {
        "sql": ("Ready", "installed on 1/1 engine pods"),
        "docs": ("Ready", "installed on 1/1 engine pods"),
    }
    assert k8s.isvc(api, "demo")["status"]["adapterSummary"] == "2/2"
    assert decode_template(api) == template


async def test_a_catalogs_names_reach_the_gateways_list_as_the_sidecars_report_them(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]], sidecar: Sidecar
) -> None:
    document = copy.deepcopy(LORA_DEMO)
    document["spec"]["adapters"] = [{"name": "sql", "source": SQL}]
    document["spec"]["adapterCatalog"] = {"source": "pvc://catalog/adapters"}
    await k8s.apply(api, document)
    await eventually(lambda: adapter_names(api) == ["sql"], "the declared name, before any pod reports")
    await eventually(lambda: k8s.find(api, "Deployment", "demo-router") is not None, "the gateway")
    gateway = router_template(api)
    assert "catalog" not in json.dumps(gateway)

    sidecar.catalog = ["support", "billing"]
    await engine_pod(api, "demo-decode-1", role="decode", port=sidecar.port)
    await eventually(lambda: adapter_names(api) == ["sql", "billing", "support"], "the catalog's names")
    sidecar.catalog = ["billing", "support", "sql", "onboarding"]  # a new adapter in the catalog
    await eventually(lambda: adapter_names(api) == ["sql", "billing", "onboarding", "support"], "a new one")
    assert router_template(api) == gateway, "the gateway pods are not rolled for the names"
