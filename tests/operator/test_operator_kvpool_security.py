"""The KV connector choice (`kvPool.connector`), the pool's password, and least privilege in every
child the operator builds.

Real: the builders and the spec model. Faked: nothing (no I/O involved); the manifests of the same
variants are checked against the Kubernetes schemas in test_operator_manifests.py, and the Redis
start-up command with a password is run for real in tests/kvpool/test_redisconf.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tests.operator.specs import IMAGES, OWNER, VARIANTS, gpu, sim

from tandem.core.spec import InferenceServiceSpec
from tandem.operator.resources import Role, desired_children
from tandem.operator.resources.engine import build_engine_deployment
from tandem.operator.resources.kvpool import build_redis_deployment, lmcache_pool_url

SECRET = {"name": "kv-auth", "key": "password"}
PASSWORD_REF = {"secretKeyRef": SECRET}


def pod_specs(spec: InferenceServiceSpec) -> Iterator[tuple[str, dict[str, Any]]]:
    for child in desired_children(spec, owner=OWNER, images=IMAGES):
        manifest = child.manifest
        if manifest["kind"] == "Deployment":
            yield manifest["metadata"]["name"], manifest["spec"]["template"]["spec"]


def only_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = container
    return result


def env_list(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = only_container(deployment).get("env", [])
    return result


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize(("role", "kv_role"), [(Role.PREFILL, "kv_producer"), (Role.DECODE, "kv_consumer")])
def test_the_tandem_connector_is_configured_by_its_kv_transfer_config_alone(role: Role, kv_role: str) -> None:
    spec = gpu(kvPool={"connector": "tandem", "chunkSize": 128})
    deployment = build_engine_deployment(spec, owner=OWNER, role=role, images=IMAGES)
    c = only_container(deployment)
    config = json.loads(flag(c["args"], "--kv-transfer-config"))
    assert config["kv_connector"] == "TandemConnector"
    assert config["kv_connector_module_path"] == "tandem.kvpool.vllm_connector"
    assert config["kv_role"] == kv_role
    extra = config["kv_connector_extra_config"]
    assert (extra["url"], extra["model"], extra["chunk_size"]) == (
        "redis://demo-kv:6379",
        "Qwen/Qwen2.5-7B-Instruct",
        128,
    )
    names = {e["name"] for e in env_list(deployment)}
    assert not any(name.startswith("LMCACHE_") for name in names)
    assert "lmcache-config" not in {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}


def test_only_lmcache_engines_get_the_lmcache_config_map() -> None:
    def config_maps(spec: InferenceServiceSpec) -> set[str]:
        children = desired_children(spec, owner=OWNER, images=IMAGES)
        return {c.manifest["metadata"]["name"] for c in children if c.manifest["kind"] == "ConfigMap"}

    assert config_maps(gpu()) == {"demo-lmcache", "demo-router"}
    assert config_maps(gpu(kvPool={"connector": "tandem"})) == {"demo-router"}
    assert config_maps(sim()) == {"demo-router"}


def test_with_a_password_the_managed_redis_requires_it_from_the_secret() -> None:
    spec = gpu(kvPool={"redis": {"memory": "1Gi", "passwordSecret": SECRET}})
    deployment = build_redis_deployment(spec, owner=OWNER, images=IMAGES)
    c = only_container(deployment)
    assert c["command"][:2] == ["sh", "-c"]
    assert "requirepass" in c["command"][2]
    assert flag(c["args"], "--maxmemory") == str(2**30)
    assert flag(c["args"], "--protected-mode") == "yes"
    env = {e["name"]: e for e in c["env"]}
    assert env["TANDEM_KVPOOL_PASSWORD"]["valueFrom"] == PASSWORD_REF
    assert env["REDISCLI_AUTH"]["valueFrom"] == PASSWORD_REF  # the readiness probe's redis-cli


def test_without_a_password_secret_the_managed_redis_requires_the_generated_one() -> None:
    children = {(c.ref.kind, c.ref.name): c for c in desired_children(gpu(), owner=OWNER, images=IMAGES)}
    c = only_container(children["Deployment", "demo-kv"].manifest)
    assert c["command"][:2] == ["sh", "-c"]
    assert flag(c["args"], "--protected-mode") == "yes"
    generated = {"secretKeyRef": {"name": "demo-kv-auth", "key": "password"}}
    assert {e["name"]: e.get("valueFrom") for e in c["env"]}["TANDEM_KVPOOL_PASSWORD"] == generated
    secret = children["Secret", "demo-kv-auth"]
    assert set(secret.manifest["data"]) == {"password"}
    assert secret.create_only == (("data",),)  # drawn once: a reconcile never rotates it


@pytest.mark.parametrize(
    "spec",
    [
        gpu(kvPool={"redis": {"passwordSecret": SECRET}}),
        gpu(kvPool={"connector": "tandem", "redis": {"passwordSecret": SECRET}}),
        sim(kvPool={"redis": {"passwordSecret": SECRET}}),
    ],
    ids=["lmcache", "tandem", "sim"],
)
def test_engines_and_router_read_the_password_from_the_secret_and_nowhere_else(
    spec: InferenceServiceSpec,
) -> None:
    children = {
        (c.manifest["kind"], c.manifest["metadata"]["name"]): c.manifest
        for c in desired_children(spec, owner=OWNER, images=IMAGES)
    }
    for name in ("demo-prefill", "demo-decode", "demo-router"):
        variables = env_list(children["Deployment", name])
        refs = [e["valueFrom"] for e in variables if e["name"] == "TANDEM_KVPOOL_PASSWORD"]
        assert refs == [PASSWORD_REF], name
    # The operator never sees the password: the router's config names the pool without one.
    router_config = yaml.safe_load(children["ConfigMap", "demo-router"]["data"]["router.yaml"])
    assert router_config["kvPoolUrl"] == "redis://demo-kv:6379"


def test_lmcache_gets_the_password_in_its_url_by_kubernetes_expansion_not_from_a_file() -> None:
    spec = gpu(kvPool={"redis": {"passwordSecret": SECRET}})
    env = env_list(build_engine_deployment(spec, owner=OWNER, role=Role.DECODE, images=IMAGES))
    names = [e["name"] for e in env]
    url = next(e["value"] for e in env if e["name"] == "LMCACHE_REMOTE_URL")
    assert url == "redis://:$(TANDEM_KVPOOL_PASSWORD)@demo-kv:6379"
    # Kubernetes expands $(VAR) only from variables defined earlier in the list.
    assert names.index("TANDEM_KVPOOL_PASSWORD") < names.index("LMCACHE_REMOTE_URL")
    # LMCache ignores its environment when a config file is given, so none is.
    assert "LMCACHE_CONFIG_FILE" not in names


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://cache:6379/2", "redis://:$(TANDEM_KVPOOL_PASSWORD)@cache:6379/2"),
        ("rediss://user@cache:6380", "rediss://user:$(TANDEM_KVPOOL_PASSWORD)@cache:6380"),
        ("redis://:own@cache:6379", "redis://:own@cache:6379"),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=1&password=$(TANDEM_KVPOOL_PASSWORD)"),
    ],
)
def test_an_external_url_gets_the_password_reference_unless_it_has_its_own(url: str, expected: str) -> None:
    spec = gpu(kvPool={"redis": {"url": url, "passwordSecret": SECRET}})
    assert lmcache_pool_url(spec, OWNER) == expected


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_pod_runs_non_root_with_a_read_only_root_and_no_privileges(variant: str) -> None:
    for name, pod in pod_specs(VARIANTS[variant]):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        writable = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        for c in pod["containers"]:
            context = c["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            assert mounts.get("/tmp") in writable, f"{name}: /tmp must be an emptyDir"


def test_vllm_runs_as_a_fixed_non_root_uid_with_a_writable_home() -> None:
    pod = dict(pod_specs(gpu()))["demo-decode"]
    assert pod["securityContext"]["runAsUser"] == 1000
    c = pod["containers"][0]
    home = next(e["value"] for e in c["env"] if e["name"] == "HOME")
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {home, "/tmp", "/dev/shm"}
    assert pod["automountServiceAccountToken"] is False


def test_redis_writes_only_to_its_data_dir_as_the_redis_user() -> None:
    pod = dict(pod_specs(gpu()))["demo-kv"]
    assert pod["securityContext"]["runAsUser"] == 999
    c = pod["containers"][0]
    assert flag(c["args"], "--dir") == "/data"
    assert "/data" in {m["mountPath"] for m in c["volumeMounts"]}
    assert pod["automountServiceAccountToken"] is False


def test_api_keys_come_from_the_secret_as_a_whole_volume_the_router_config_points_at() -> None:
    spec = gpu(
        router={"auth": {"enabled": True, "apiKeysSecret": {"name": "gateway-keys", "key": "keys.yaml"}}}
    )
    manifests = [c.manifest for c in desired_children(spec, owner=OWNER, images=IMAGES)]
    (router,) = [m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == "demo-router"]
    (configmap,) = [
        m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "demo-router"
    ]
    pod = router["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "api-keys"]
    assert volume["secret"]["secretName"] == "gateway-keys"
    assert volume["secret"]["items"] == [{"key": "keys.yaml", "path": "api-keys"}]
    (mount,) = [m for m in only_container(router)["volumeMounts"] if m["name"] == "api-keys"]
    assert mount == {"name": "api-keys", "mountPath": "/etc/tandem/auth", "readOnly": True}
    assert "subPath" not in mount  # a subPath mount never sees Secret updates
    assert yaml.safe_load(configmap["data"]["router.yaml"])["apiKeysFile"] == "/etc/tandem/auth/api-keys"


def test_without_auth_the_router_mounts_no_key_volume() -> None:
    children = desired_children(gpu(), owner=OWNER, images=IMAGES)
    for child in children:
        if child.manifest["kind"] == "Deployment":
            assert all(v["name"] != "api-keys" for v in child.manifest["spec"]["template"]["spec"]["volumes"])
