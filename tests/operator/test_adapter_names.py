"""The gateway's LoRA adapter names: ConfigMap `<name>-adapter-names` (the declared adapters, then the
catalog's names the engine pods' sidecars report), mounted whole into the gateway pods, and a router
config without adapters, so that no adapter change rolls a gateway.

Real: the pure builders (`desired_children`, `gateway_children`), one reconcile pass
(`tandem.operator.reconcile`, `adapterstatus`, `sidecars.read_reports`), the RouterConfig and
GatewayFile models, kubernetes-validate's strict schemas. Faked: the Kubernetes API (test_adapter_status'
`ListingCluster`, with engine pods written as the kubelet reports them) and each sidecar's
`/adapters` answer (`Sidecars`, in place of HTTP).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from tests.operator.specs import IMAGES, OWNER, sim
from tests.operator.test_adapter_status import ListingCluster, engine_pod
from tests.operator.test_operator_reconcile import NOW, body

from tandem.core.adapternames import parse_names
from tandem.core.gateway import GatewayFile, InferenceGatewaySpec
from tandem.core.routerconfig import RouterConfig
from tandem.core.spec import InferenceServiceSpec
from tandem.operator.objects import Child, ObjectRef
from tandem.operator.reconcile import Outcome, reconcile
from tandem.operator.resources import Owner, desired_children
from tandem.operator.resources.gateway import Member, gateway_children, gateway_owner
from tandem.operator.resources.meta import Role
from tandem.operator.resources.secrets import with_generated_secrets
from tandem.operator.sidecars import SidecarError

LORA: dict[str, Any] = {"engine": {"kind": "sim", "lora": {"maxRank": 16}}}
HUB = {"name": "sql", "source": "hf://org/sql-lora@v2"}
BUCKET = {"name": "chat", "source": "s3://loras/chat"}
CLAIM = {"name": "legal", "source": "pvc://legal-loras/v1"}
CATALOG = {"source": "pvc://catalog/adapters"}
NAMES_REF = ObjectRef("v1", "ConfigMap", OWNER.namespace, "demo-adapter-names")
MOUNT = {"name": "lora-names", "mountPath": "/etc/tandem/adapter-names", "readOnly": True}
VOLUME = {"name": "lora-names", "configMap": {"name": "demo-adapter-names"}}


#: A sidecar that has not scanned its catalog yet (its report's `catalog` is null).
NOT_SCANNED = object()


class Sidecars(dict[str, Any]):
    """Each pod's `/adapters` answer by pod name: its catalog's names (a string: the pod does not
    answer, with that reason; `NOT_SCANNED`: `catalog: null`). `read` is the reconcile's `ReportReader`;
    `reads` counts whom it read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    def read(self, pod: Any) -> dict[str, Any]:
        name = pod["metadata"]["name"]
        self.reads[name] += 1
        found = self.get(name)
        if found is NOT_SCANNED:
            found = None
        elif found is None or isinstance(found, str):
            raise SidecarError(found or f"http://10.0.0.7:8095/adapters: connection refused ({name})")
        return {"digest": "d", "passes": 1, "listError": "", "adapters": {}, "catalog": found}


def reconciled(cluster: ListingCluster, spec: dict[str, Any], sidecars: Sidecars) -> Outcome:
    return reconcile(body(spec), cluster=cluster, images=IMAGES, now=NOW, read_report=sidecars.read)


def names_in(cluster: ListingCluster) -> tuple[str, ...]:
    return parse_names(cluster.objects[NAMES_REF]["data"]["names.json"])


def children(spec: InferenceServiceSpec, catalog: tuple[str, ...] = ()) -> dict[tuple[str, str], Child]:
    built = desired_children(spec, owner=OWNER, images=IMAGES, adapter_catalog=catalog)
    return {(c.ref.kind, c.ref.name): c for c in built}


def router_parts(spec: InferenceServiceSpec, catalog: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """What the gateway is rolled by: its ConfigMap's data and its Deployment (the template's
    annotations carry the config's hash)."""
    found = children(spec, catalog)
    deployment = found[("Deployment", "demo-router")].manifest
    return (
        found[("ConfigMap", "demo-router")].manifest["data"],
        deployment["spec"]["template"]["metadata"]["annotations"],
        deployment,
    )


def adapter_names(spec: InferenceServiceSpec, catalog: tuple[str, ...] = ()) -> dict[str, Any]:
    return dict(children(spec, catalog)[("ConfigMap", "demo-adapter-names")].manifest["data"])


def router_container(deployment: dict[str, Any]) -> dict[str, Any]:
    [found] = deployment["spec"]["template"]["spec"]["containers"]
    return dict(found)


def test_the_names_are_the_declared_ones_in_order_then_the_reported_catalog_sorted_once_each() -> None:
    cluster, sidecars = ListingCluster(), Sidecars()
    engine_pod(cluster, "d-1")
    engine_pod(cluster, "p-1", role=Role.PREFILL)
    sidecars["d-1"] = ["zeta", "sql", "chat", "../etc"]  # `sql`: also declared; `../etc`: not a name
    sidecars["p-1"] = ["alpha", "chat", "qwen"]  # `qwen`: the model's served name
    reconciled(cluster, LORA | {"adapters": [HUB, CLAIM], "adapterCatalog": CATALOG}, sidecars)
    assert names_in(cluster) == ("sql", "legal", "alpha", "chat", "zeta")
    configmap = cluster.objects[NAMES_REF]
    assert configmap["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert json.loads(configmap["data"]["catalog.json"]) == {
        "adapters": ["alpha", "chat", "qwen", "sql", "zeta"]
    }


def test_the_model_names_never_become_adapters() -> None:
    spec = sim(**LORA, adapterCatalog=CATALOG)
    names = adapter_names(spec, ("Qwen/Qwen2.5-7B-Instruct", "qwen", "sql"))
    assert parse_names(names["names.json"]) == ("sql",)


def test_without_a_readable_report_the_live_catalog_names_are_kept() -> None:
    cluster, sidecars = ListingCluster(), Sidecars()
    spec = LORA | {"adapters": [HUB], "adapterCatalog": CATALOG}
    engine_pod(cluster, "d-1")
    sidecars["d-1"] = ["b", "a"]
    reconciled(cluster, spec, sidecars)
    assert names_in(cluster) == ("sql", "a", "b")

    sidecars["d-1"] = "http://10.0.0.7:8095/adapters: timed out"
    reconciled(cluster, spec, sidecars)
    assert names_in(cluster) == ("sql", "a", "b"), "a sidecar not answering empties nothing"

    sidecars["d-1"] = NOT_SCANNED  # restarted, its catalog not scanned yet
    reconciled(cluster, spec, sidecars)
    assert names_in(cluster) == ("sql", "a", "b"), "nor does one that does not know its catalog yet"

    del cluster.objects[ObjectRef("v1", "Pod", OWNER.namespace, "d-1")]
    reconciled(cluster, spec | {"adapters": [BUCKET]}, sidecars)
    assert names_in(cluster) == ("chat", "a", "b"), "no pod: the catalog's names stay, the declared follow"

    engine_pod(cluster, "d-2")
    sidecars["d-2"] = ["b"]
    reconciled(cluster, spec, sidecars)
    assert names_in(cluster) == ("sql", "b"), "a readable report replaces them"


def test_without_a_catalog_the_sidecars_catalog_names_are_not_listed() -> None:
    cluster, sidecars = ListingCluster(), Sidecars()
    engine_pod(cluster, "d-1")
    sidecars["d-1"] = ["left-over"]  # a pod of the template that still had the catalog
    reconciled(cluster, LORA | {"adapters": [HUB]}, sidecars)
    assert names_in(cluster) == ("sql",)


def test_with_a_catalog_only_each_sidecar_is_read_once_per_reconcile() -> None:
    cluster, sidecars = ListingCluster(), Sidecars()
    for name in ("d-1", "d-2"):
        engine_pod(cluster, name)
        sidecars[name] = ["a"]
    outcome = reconciled(cluster, LORA | {"adapterCatalog": CATALOG}, sidecars)
    assert sidecars.reads == {"d-1": 1, "d-2": 1}
    assert names_in(cluster) == ("a",)
    assert outcome.error is None
    assert outcome.status.adapter_summary == "1 catalog", "kubectl get counts the catalog's adapters"


def test_with_remote_adapters_and_a_catalog_the_status_and_the_names_come_from_one_read() -> None:
    cluster, sidecars = ListingCluster(), Sidecars()
    engine_pod(cluster, "d-1")
    sidecars["d-1"] = ["a"]
    sidecars["d-1"] = ["a", "sql", "qwen"]  # `sql` is declared, `qwen` the model: not counted
    outcome = reconciled(cluster, LORA | {"adapters": [HUB], "adapterCatalog": CATALOG}, sidecars)
    assert sidecars.reads == {"d-1": 1}
    assert [(a.name, a.state) for a in outcome.status.adapters or []] == [("sql", "Pending")]
    assert outcome.status.adapter_summary == "0/1 +1 catalog"
    without = reconciled(cluster, LORA | {"adapters": [HUB]}, sidecars)
    assert without.status.adapter_summary == "0/1"


def test_a_catalog_too_large_for_one_configmap_is_cut_by_name_and_said_once() -> None:
    """5,000 catalog names of 128 characters would be ~1.3 MiB in each key: the API server refuses a
    ConfigMap over 1 MiB, so the names past the limit are left out, counted and warned about."""
    cluster, sidecars = ListingCluster(), Sidecars()
    engine_pod(cluster, "d-1")
    catalog = [f"a{i:0127d}" for i in range(5000)]
    sidecars["d-1"] = list(reversed(catalog))
    spec = LORA | {"adapters": [HUB], "adapterCatalog": CATALOG}
    outcome = reconciled(cluster, spec, sidecars)
    data = cluster.objects[NAMES_REF]["data"]
    assert sum(len(value.encode()) for value in data.values()) <= 1_000_000
    served = names_in(cluster)
    assert served[0] == "sql" and served[1:] == tuple(catalog[: len(served) - 1])
    kept = len(served) - 1
    assert 3700 < kept < 3800, "as many as fit, not a round guess"
    assert outcome.status.adapter_summary == f"0/1 +{kept} catalog ({5000 - kept} not served)"
    [warning] = [e for e in outcome.events if e.reason == "AdapterNamesOverLimit"]
    assert warning.type == "Warning" and f"{5000 - kept} catalog adapters are not served" in warning.message
    assert repr(catalog[kept]) in warning.message, "names the first one left out"

    status = {"adapterSummary": outcome.status.adapter_summary}
    again = reconcile(
        body(spec, status=status), cluster=cluster, images=IMAGES, now=NOW, read_report=sidecars.read
    )
    assert not [e for e in again.events if e.reason == "AdapterNamesOverLimit"], "not on every pass"
    sidecars["d-1"] = catalog[:10]
    fewer = reconcile(
        body(spec, status=status), cluster=cluster, images=IMAGES, now=NOW, read_report=sidecars.read
    )
    assert names_in(cluster) == ("sql", *catalog[:10]) and fewer.status.adapter_summary == "0/1 +10 catalog"
    assert not [e for e in fewer.events if e.reason == "AdapterNamesOverLimit"]


@pytest.mark.parametrize(
    "change",
    [
        {"adapters": [HUB]},
        {"adapters": [HUB, BUCKET]},
        {"adapters": [HUB | {"source": "hf://org/sql-lora@v3"}]},
        {"adapters": [CLAIM]},
        {"adapterCatalog": CATALOG},
    ],
    ids=["an hf adapter", "an s3 adapter", "a changed source", "a pvc adapter", "a catalog"],
)
def test_an_adapter_change_leaves_the_gateway_as_it_was(change: dict[str, Any]) -> None:
    before = sim(**LORA)
    after = sim(**LORA | change)
    assert router_parts(after) == router_parts(before)
    assert router_parts(after, ("new",)) == router_parts(before), "nor do the catalog's names"
    assert adapter_names(after, ("new",)) != adapter_names(before)


def test_the_router_config_names_the_mounted_file_and_carries_no_adapters() -> None:
    spec = sim(**LORA, adapters=[HUB, CLAIM], adapterCatalog=CATALOG)
    data, _, deployment = router_parts(spec)
    config = RouterConfig.model_validate(yaml.safe_load(data["router.yaml"]))
    assert config.adapter_names_file == "/etc/tandem/adapter-names/names.json"
    assert config.adapter_load_dir == "/adapters"  # the engines' resolver folder: copies come from it
    assert config.spec.adapters == [] and config.spec.adapter_catalog is None
    assert config.spec.engine.lora == spec.engine.lora
    served = with_generated_secrets(spec, OWNER)  # as every builder sees it
    assert config.spec == served.model_copy(update={"adapters": [], "adapter_catalog": None})
    assert VOLUME in deployment["spec"]["template"]["spec"]["volumes"]
    assert MOUNT in router_container(deployment)["volumeMounts"], "whole (no subPath), read-only"
    kubernetes_validate.validate(deployment, "1.30", strict=True)
    names = children(spec)[("ConfigMap", "demo-adapter-names")].manifest
    kubernetes_validate.validate(names, "1.30", strict=True)


def test_the_names_configmap_is_created_before_the_gateway_that_mounts_it() -> None:
    order = list(children(sim(**LORA)))
    assert order.index(("ConfigMap", "demo-adapter-names")) < order.index(("Deployment", "demo-router"))


def test_without_lora_there_are_no_names_no_mount_and_no_names_file() -> None:
    spec = sim()
    found = children(spec)
    assert ("ConfigMap", "demo-adapter-names") not in found
    data, _, deployment = router_parts(spec)
    assert "adapterNamesFile" not in yaml.safe_load(data["router.yaml"])
    assert "adapterLoadDir" not in yaml.safe_load(data["router.yaml"])
    assert all(v["name"] != "lora-names" for v in deployment["spec"]["template"]["spec"]["volumes"])
    assert all(m["name"] != "lora-names" for m in router_container(deployment)["volumeMounts"])


def test_switching_lora_off_deletes_the_names_configmap() -> None:
    cluster, sidecars = ListingCluster(), Sidecars()
    reconciled(cluster, LORA, sidecars)
    assert NAMES_REF in cluster.objects
    outcome = reconciled(cluster, {}, sidecars)
    assert NAMES_REF not in cluster.objects
    assert ("deleted", NAMES_REF) in [(a.verb, a.ref) for a in outcome.actions]


def member(name: str, **spec: Any) -> Member:
    return Member(owner=Owner(name=name, namespace=OWNER.namespace, uid=f"uid-{name}"), spec=sim(**spec))


def test_an_inference_gateway_mounts_each_lora_services_names_where_its_config_says() -> None:
    long = "s" * 52  # the longest service name: its volume name still fits 63 characters
    members = [
        member("a", **LORA, adapters=[HUB], adapterCatalog=CATALOG, model={"name": "m-a"}),
        member("b", model={"name": "m-b"}),
        member(long, **LORA, model={"name": "m-long"}),
    ]
    fleet = gateway_owner(name="fleet", namespace=OWNER.namespace, uid="uid-fleet")
    built = {
        (c.ref.kind, c.ref.name): c.manifest
        for c in gateway_children(fleet, InferenceGatewaySpec(), members, images=IMAGES)
    }
    text = built[("ConfigMap", "fleet-gateway")]["data"]["router.yaml"]
    document = GatewayFile.model_validate(yaml.safe_load(text))
    configs = {s.name: s.config for s in document.services}
    assert configs["a"].adapter_names_file == "/etc/tandem/adapter-names-a/names.json"
    assert configs["a"].spec.adapters == [] and configs["a"].spec.adapter_catalog is None
    assert configs[long].adapter_names_file == f"/etc/tandem/adapter-names-{long}/names.json"
    assert configs["b"].adapter_names_file is None
    assert "adapterNamesFile" not in yaml.safe_load(text)["services"][1]["config"]
    deployment = built[("Deployment", "fleet-gateway")]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    mounts = router_container(deployment)["volumeMounts"]
    for name in ("a", long):
        volume = {
            "name": f"lora-names-{name}",
            "configMap": {"name": f"{name}-adapter-names", "optional": True},
        }
        assert volume in volumes and len(volume["name"]) <= 63
        mount = {
            "name": f"lora-names-{name}",
            "mountPath": f"/etc/tandem/adapter-names-{name}",
            "readOnly": True,
        }
        assert mount in mounts
    assert not any(v["name"] == "lora-names-b" for v in volumes)
    kubernetes_validate.validate(deployment, "1.30", strict=True)


def test_an_inference_gateway_does_not_roll_for_its_services_adapters() -> None:
    fleet = gateway_owner(name="fleet", namespace=OWNER.namespace, uid="uid-fleet")

    def gateway_of(**spec: Any) -> list[dict[str, Any]]:
        found = gateway_children(fleet, InferenceGatewaySpec(), [member("a", **spec)], images=IMAGES)
        return [c.manifest for c in found if c.ref.kind in ("ConfigMap", "Deployment")]

    assert gateway_of(**LORA) == gateway_of(**LORA, adapters=[HUB, CLAIM], adapterCatalog=CATALOG)
