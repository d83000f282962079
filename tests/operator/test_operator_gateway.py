"""InferenceGateways against an emulated Kubernetes API: selection, conflicts, status, and the
services' own gateways going and coming back.

Real: the operator as `tandem operator` runs it (kopf, our registry and handlers, Tandem's client,
builders, both reconciles) over HTTP on 127.0.0.1. Emulated: the API server (kmock +
StampingEmulator); the Deployment controller is played by `mark_ready`. Timeouts guard against hangs.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import kmock as kmock_lib
import yaml
from tests.operator import cluster_state as k8s
from tests.operator.cluster_state import NAMESPACE, eventually

from tandem.core.gateway import GatewayFile
from tandem.core.spec import GROUP, VERSION

GATEWAY_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/inferencegateways"
GATEWAY_RESOURCE = kmock_lib.resource(f"{GROUP}/{VERSION}/inferencegateways")
LABEL = {"tandem.dev/gateway": "fleet"}


def service(name: str, served: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(labels or LABEL)},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "servedName": served},
            "engine": {"kind": "sim"},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1},
            "kvPool": {"redis": {"memory": "1Gi"}},
            "router": {"replicas": 1},
        },
    }


def gateway(name: str = "fleet", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceGateway",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"selector": {"matchLabels": LABEL}, "replicas": 1, **spec},
    }


async def apply_gateway(api: kmock_lib.KubernetesEmulator, document: dict[str, Any]) -> None:
    response = await api.post(GATEWAY_PATH, json=document)
    assert response.status == 200, await response.text()


def igw(api: kmock_lib.KubernetesEmulator, name: str = "fleet") -> dict[str, Any]:
    key = (GATEWAY_RESOURCE, NAMESPACE, name)
    assert key in api.objects, f"InferenceGateway {name} does not exist"
    return dict(api.objects[key].raw)


def gw_condition(api: kmock_lib.KubernetesEmulator, ctype: str, name: str = "fleet") -> dict[str, Any]:
    conditions = igw(api, name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c.get("type") == ctype), {})


def events(api: kmock_lib.KubernetesEmulator, kind: str, name: str) -> list[dict[str, Any]]:
    """Events posted about one object (kopf posts them through the core v1 API)."""
    found = []
    for request in list(api):
        body = request.data if isinstance(request.data, dict) else {}
        involved = body.get("involvedObject") or {}
        if body.get("reason") and involved.get("kind") == kind and involved.get("name") == name:
            found.append(body)
    return found


def gateway_file(api: kmock_lib.KubernetesEmulator) -> GatewayFile:
    config = k8s.find(api, "ConfigMap", "fleet-gateway")
    assert config is not None
    return GatewayFile.model_validate(yaml.safe_load(config["data"]["router.yaml"]))


async def ready_services(api: kmock_lib.KubernetesEmulator, *names: str) -> None:
    for name in names:
        await eventually(
            functools.partial(lambda n: k8s.find(api, "Deployment", f"{n}-decode") is not None, name),
            f"{name}",
        )
        for suffix in ("prefill", "decode", "kv"):
            await k8s.mark_ready(api, f"{name}-{suffix}")


async def test_a_gateway_serves_two_services_and_their_own_gateways_go_and_come_back(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await k8s.apply(api, service("qwen-v1", "qwen"))
    await k8s.apply(api, service("llama", "llama"))
    await eventually(lambda: k8s.find(api, "Deployment", "llama-router") is not None, "own gateways first")
    alias = {
        "name": "chat",
        "targets": [{"service": "qwen-v1", "weight": 90}, {"service": "llama", "weight": 10}],
    }
    await apply_gateway(api, gateway(aliases=[alias]))

    await eventually(lambda: k8s.find(api, "Deployment", "fleet-gateway") is not None, "the gateway")
    assert k8s.find(api, "Service", "fleet-gateway") is not None
    document = gateway_file(api)
    assert [s.name for s in document.services] == ["llama", "qwen-v1"]
    assert document.services[1].config.spec.model.public_name == "qwen"
    assert document.services[1].pool_key_env == "TANDEM_KV_POOL_KEY_QWEN_V1"
    await eventually(
        lambda: k8s.names(api, "Deployment") & {"qwen-v1-router", "llama-router"} == set(),
        "the services' own gateways removed",
    )
    assert k8s.find(api, "Service", "qwen-v1-router") is None
    await eventually(
        lambda: k8s.isvc(api, "qwen-v1").get("status", {}).get("gateway") == "fleet", "status.gateway"
    )
    served = k8s.condition(api, "qwen-v1", "ServedByGateway")
    assert served["status"] == "True" and "fleet" in served["message"]
    assert k8s.isvc(api, "qwen-v1")["status"]["endpoint"] == f"http://fleet-gateway.{NAMESPACE}.svc:8080/v1"

    status = igw(api)["status"]
    assert status["models"] == ["llama", "qwen", "chat"]
    assert status["modelNames"] == "llama, qwen, chat"
    assert {s["name"]: s["ready"] for s in status["services"]} == {"llama": False, "qwen-v1": False}
    assert status["readyServices"] == "0/2"
    await ready_services(api, "qwen-v1", "llama")
    await k8s.mark_ready(api, "fleet-gateway")
    await eventually(lambda: gw_condition(api, "Ready").get("status") == "True", "gateway Ready")
    assert igw(api)["status"]["readyServices"] == "2/2"
    assert gw_condition(api, "NamesConflict")["status"] == "False"

    await k8s.patch_object(
        api, "InferenceService", "llama", {"metadata": {"labels": {"tandem.dev/gateway": "none"}}}
    )
    await eventually(
        lambda: k8s.find(api, "Deployment", "llama-router") is not None, "llama's own gateway back"
    )
    assert k8s.find(api, "Service", "llama-router") is not None
    await eventually(lambda: "llama" not in igw(api)["status"].get("models", []), "llama unlisted")
    # The alias still targets llama, which the gateway no longer serves: refused, nothing changed.
    await eventually(
        lambda: gw_condition(api, "Ready").get("reason") == "AliasTargetNotServed", "alias refused"
    )
    assert "llama" in gw_condition(api, "Ready")["message"]
    await eventually(
        lambda: k8s.isvc(api, "llama")["status"].get("gateway") is None, "llama's status.gateway gone"
    )
    assert k8s.condition(api, "llama", "ServedByGateway") == {}


async def test_two_services_claiming_one_name_are_refused_with_events_naming_both(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await k8s.apply(api, service("qwen-a", "qwen"))
    await k8s.apply(api, service("qwen-b", "qwen"))
    await apply_gateway(api, gateway())
    await eventually(lambda: gw_condition(api, "NamesConflict").get("status") == "True", "NamesConflict")
    message = gw_condition(api, "NamesConflict")["message"]
    assert "qwen-a" in message and "qwen-b" in message
    assert gw_condition(api, "Ready")["reason"] == "NamesConflict"
    await eventually(lambda: len(events(api, "InferenceGateway", "fleet")) >= 1, "an Event on the gateway")
    for name in ("qwen-a", "qwen-b"):
        await eventually(
            functools.partial(lambda n: len(events(api, "InferenceService", n)) >= 1, name),
            f"an Event on {name}",
        )
        (event,) = events(api, "InferenceService", name)[:1]
        assert (
            event["reason"] == "NamesConflict"
            and "qwen-a" in event["message"]
            and "qwen-b" in event["message"]
        )
    assert k8s.find(api, "Deployment", "fleet-gateway") is None
    assert k8s.find(api, "ConfigMap", "fleet-gateway") is None
    # Neither service is taken over: both keep their own gateway.
    await eventually(
        lambda: {"qwen-a-router", "qwen-b-router"} <= k8s.names(api, "Deployment"), "their own gateways"
    )


async def test_a_service_two_gateways_select_stays_with_the_older_one(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await k8s.apply(api, service("qwen", "qwen"))
    await apply_gateway(api, gateway())
    await eventually(
        lambda: k8s.isvc(api, "qwen").get("status", {}).get("gateway") == "fleet", "served by fleet"
    )
    await apply_gateway(api, gateway("later"))
    await eventually(
        lambda: gw_condition(api, "NamesConflict", "later").get("status") == "True", "later refused"
    )
    assert "InferenceGateway fleet" in gw_condition(api, "Ready", "later")["message"]
    assert k8s.find(api, "Deployment", "later-gateway") is None
    assert k8s.isvc(api, "qwen")["status"]["gateway"] == "fleet"


async def test_an_alias_targeting_an_unselected_service_is_refused(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await k8s.apply(api, service("qwen", "qwen"))
    await k8s.apply(api, service("other", "other", labels={"team": "b"}))
    alias = {"name": "chat", "targets": [{"service": "other"}]}
    await apply_gateway(api, gateway(aliases=[alias]))
    await eventually(lambda: gw_condition(api, "Ready").get("reason") == "AliasTargetNotServed", "refused")
    assert (
        gw_condition(api, "Ready")["message"]
        == "alias 'chat' targets other, which this gateway does not serve"
    )
    assert gw_condition(api, "NamesConflict")["status"] == "False"
    assert k8s.find(api, "Deployment", "fleet-gateway") is None
    await eventually(lambda: k8s.find(api, "Deployment", "qwen-router") is not None, "qwen's own gateway")


async def test_the_services_policies_admit_the_gateway_pods_to_engines_and_redis(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await k8s.apply(api, copy.deepcopy(service("qwen", "qwen")))
    await apply_gateway(api, gateway())
    gateway_pods = {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "tandem",
                "app.kubernetes.io/instance": "fleet",
                "tandem.dev/role": "gateway",
            }
        }
    }

    def policy(name: str) -> dict[str, Any]:
        key = (kmock_lib.resource("networking.k8s.io/v1/networkpolicies"), NAMESPACE, name)
        return dict(api.objects[key].raw) if key in api.objects and not api.objects[key].deleted else {}

    for name in ("qwen-prefill", "qwen-decode", "qwen-kv"):
        await eventually(
            functools.partial(
                lambda n: gateway_pods in policy(n).get("spec", {}).get("ingress", [{}])[0].get("from", []),
                name,
            ),
            f"{name} admits the gateway",
        )
    ingress = policy("fleet-gateway")["spec"]["ingress"]
    assert ingress == [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 8080}]}]
