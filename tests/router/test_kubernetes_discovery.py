"""Kubernetes discovery: pool members from the ready addresses of each Service's EndpointSlices.

Real: `KubernetesEndpoints` and its httpx list/watch requests over HTTP on 127.0.0.1, the endpoint
registry, and in the last story the whole router and a fake engine found through discovery. Emulated:
the Kubernetes API server (kmock with the operator tests' `StampingEmulator`, which keeps
resourceVersions and replays watches from them; like kmock it ignores `labelSelector`, so the
discovery's own label check is exercised too). Objects are written with plain HTTP, as kubectl would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import kmock as kmock_lib
import pytest
from tests.operator.emulator import StampingEmulator
from tests.router.harness import MODEL, MODEL_NAME, Launcher
from tests.router.servers import closed_port_url

from tandem.core.endpointslices import ready_urls
from tandem.core.kubeaccess import KubeAccess, WatchGone, request_json, watch_events
from tandem.core.kubeerror import KubeError
from tandem.core.routerconfig import KubernetesDiscovery, RouterConfig
from tandem.router.discovery.kubernetes import KubernetesEndpoints, SliceWatch, layouts_of, pod_layouts
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.discovery.sources import discovery_for
from tandem.router.errors import ConfigurationError
from tandem.router.settings import DiscoverySettings, RouterSettings
from tandem.router.types import Pool

NAMESPACE = "llm"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
CONFIG = KubernetesDiscovery(
    namespace=NAMESPACE, prefill_service="demo-prefill", decode_service="demo-decode", port=8000
)


def endpoint_slice(name: str, service: str, *endpoints: tuple[str, bool | None]) -> dict[str, Any]:
    """An EndpointSlice of `service` with one endpoint per (address, ready) pair (None: unset)."""
    items = []
    for address, ready in endpoints:
        conditions = {} if ready is None else {"ready": ready}
        items.append({"addresses": [address], "conditions": conditions})
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": items,
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
    }


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    return dict(kmock_options, cls=StampingEmulator)


@pytest.fixture
async def api(kmock: kmock_lib.KubernetesEmulator) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the emulated API server, which knows the built-in kinds."""
    with warnings.catch_warnings():
        # kmock 0.8 reads its bundled resource list with the legacy importlib.resources API.
        warnings.filterwarnings("ignore", "read_binary is deprecated", DeprecationWarning)
        kmock.resources.load_bundled()
    async with httpx.AsyncClient(base_url=str(kmock.url).rstrip("/"), trust_env=False) as client:
        yield client


async def create(api: httpx.AsyncClient, obj: dict[str, Any]) -> None:
    response = await api.post(SLICES, json=obj)
    assert response.status_code in (200, 201), response.text


PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def pod(name: str, ip: str, layout: str | None) -> dict[str, Any]:
    """An engine pod at `ip` labelled with its KV layout (None: unlabelled, as an older operator's)."""
    labels = {"app.kubernetes.io/component": "decode"} | ({"tandem.dev/kv-layout": layout} if layout else {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {"containers": [{"name": "engine", "image": "vllm"}]},
        "status": {"podIP": ip, "podIPs": [{"ip": ip}]},
    }


async def create_pod(api: httpx.AsyncClient, obj: dict[str, Any]) -> None:
    response = await api.post(PODS, json=obj)
    assert response.status_code in (200, 201), response.text


@pytest.fixture
async def discovered(api: httpx.AsyncClient) -> AsyncIterator[Callable[[], Any]]:
    """Starts discovery against the emulator once called; stops it at the end."""
    started: list[KubernetesEndpoints] = []

    async def start() -> EndpointRegistry:
        registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=lambda: 0.0)
        discovery = KubernetesEndpoints(CONFIG, api=KubeAccess.plain(str(api.base_url)))
        await discovery.start(registry)
        started.append(discovery)
        return registry

    yield start
    for discovery in started:
        await discovery.stop()


def urls(registry: EndpointRegistry, pool: Pool) -> list[str]:
    return [e.url for e in registry.endpoints(pool)]


async def eventually(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the registry never caught up")


async def test_start_fills_both_pools_with_ready_addresses_only(
    api: httpx.AsyncClient, discovered: Callable[[], Any]
) -> None:
    await create(api, endpoint_slice("demo-decode-a", "demo-decode", ("10.0.0.2", True), ("10.0.0.3", False)))
    await create(api, endpoint_slice("demo-decode-b", "demo-decode", ("10.0.0.4", None)))
    await create(api, endpoint_slice("demo-prefill-a", "demo-prefill", ("10.0.1.2", True)))
    await create(api, endpoint_slice("other-a", "other", ("10.9.9.9", True)))  # another Service
    registry = await discovered()
    assert urls(registry, "decode") == ["http://10.0.0.2:8000", "http://10.0.0.4:8000"]
    assert urls(registry, "prefill") == ["http://10.0.1.2:8000"]


async def test_the_watch_follows_pods_becoming_ready_leaving_and_slices_going_away(
    api: httpx.AsyncClient, discovered: Callable[[], Any]
) -> None:
    await create(api, endpoint_slice("demo-decode-a", "demo-decode", ("10.0.0.2", True), ("10.0.0.3", False)))
    registry = await discovered()
    assert urls(registry, "decode") == ["http://10.0.0.2:8000"]

    ready_now = endpoint_slice("demo-decode-a", "demo-decode", ("10.0.0.2", True), ("10.0.0.3", True))
    await api.patch(f"{SLICES}/demo-decode-a", json={"endpoints": ready_now["endpoints"]})
    await eventually(lambda: urls(registry, "decode") == ["http://10.0.0.2:8000", "http://10.0.0.3:8000"])

    await create(api, endpoint_slice("demo-decode-b", "demo-decode", ("10.0.0.9", True)))
    await eventually(lambda: "http://10.0.0.9:8000" in urls(registry, "decode"))

    terminating = endpoint_slice("demo-decode-a", "demo-decode", ("10.0.0.2", False), ("10.0.0.3", True))
    await api.patch(f"{SLICES}/demo-decode-a", json={"endpoints": terminating["endpoints"]})
    await eventually(lambda: urls(registry, "decode") == ["http://10.0.0.3:8000", "http://10.0.0.9:8000"])

    await api.delete(f"{SLICES}/demo-decode-a")
    await eventually(lambda: urls(registry, "decode") == ["http://10.0.0.9:8000"])
    await create(api, endpoint_slice("other-b", "other", ("10.9.9.9", True)))
    await asyncio.sleep(0.05)
    assert urls(registry, "decode") == ["http://10.0.0.9:8000"]


def layouts(registry: EndpointRegistry, pool: Pool) -> dict[str, str | None]:
    return {e.url: e.layout for e in registry.endpoints(pool)}


async def test_members_take_the_kv_layout_of_the_pod_at_their_address_as_pods_come_and_go(
    api: httpx.AsyncClient, discovered: Callable[[], Any]
) -> None:
    await create_pod(api, pod("demo-decode-old", "10.0.0.2", "g1"))
    await create_pod(api, pod("demo-decode-bare", "10.0.0.3", None))  # no label: no layout
    await create(api, endpoint_slice("demo-decode-a", "demo-decode", ("10.0.0.2", True), ("10.0.0.3", True)))
    registry = await discovered()
    assert layouts(registry, "decode") == {"http://10.0.0.2:8000": "g1", "http://10.0.0.3:8000": None}

    # A new-generation pod: its layout is known when its address becomes a member.
    await create_pod(api, pod("demo-decode-new", "10.0.0.9", "g2"))
    await create(api, endpoint_slice("demo-decode-b", "demo-decode", ("10.0.0.9", True)))
    await eventually(lambda: layouts(registry, "decode").get("http://10.0.0.9:8000") == "g2")

    # A member seen before its pod takes the layout once the pod is seen.
    await create(api, endpoint_slice("demo-decode-c", "demo-decode", ("10.0.0.7", True)))
    await eventually(lambda: "http://10.0.0.7:8000" in layouts(registry, "decode"))
    assert layouts(registry, "decode")["http://10.0.0.7:8000"] is None
    await create_pod(api, pod("demo-decode-late", "10.0.0.7", "g2"))
    await eventually(lambda: layouts(registry, "decode")["http://10.0.0.7:8000"] == "g2")

    # The old pod goes: its address, still a member here, has no layout any more.
    await api.delete(f"{PODS}/demo-decode-old")
    await eventually(lambda: layouts(registry, "decode")["http://10.0.0.2:8000"] is None)


def test_pod_layouts_map_every_ip_of_a_labelled_pod_and_members_find_theirs() -> None:
    pods = [
        pod("a", "10.0.0.2", "g1"),
        {"metadata": {"labels": {"tandem.dev/kv-layout": "g2"}}, "status": {"podIPs": [{"ip": "fd00::7"}]}},
        pod("bare", "10.0.0.3", None),
        {"metadata": {"labels": {"tandem.dev/kv-layout": "g3"}}},  # no IP yet (not scheduled)
    ]
    by_ip = pod_layouts(pods)
    assert by_ip == {"10.0.0.2": "g1", "fd00::7": "g2"}
    members = ["http://10.0.0.2:8000", "http://[fd00::7]:8000", "http://10.0.0.3:8000"]
    assert layouts_of(members, by_ip) == {"http://10.0.0.2:8000": "g1", "http://[fd00::7]:8000": "g2"}


async def test_pods_the_router_may_not_list_leave_layouts_unknown_and_discovery_working() -> None:
    """Scripted API server (httpx.MockTransport): pods are forbidden (a Role from before pods were
    granted), the slices list as usual."""
    slice_ = endpoint_slice("a", "demo-decode", ("10.0.0.1", True))

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch") == "true":
            await asyncio.sleep(3600)  # a watch with nothing to say
        if request.url.path == PODS:
            return httpx.Response(403, json={"kind": "Status", "message": "pods is forbidden"})
        items = [slice_] if "demo-decode" in request.url.params["labelSelector"] else []
        return httpx.Response(200, json={"items": items, "metadata": {"resourceVersion": "1"}})

    client = httpx.AsyncClient(base_url="http://api", transport=httpx.MockTransport(handler))
    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=lambda: 0.0)
    discovery = KubernetesEndpoints(CONFIG, api=KubeAccess.plain("http://api"), client=client)
    await discovery.start(registry)
    try:
        assert layouts(registry, "decode") == {"http://10.0.0.1:8000": None}
    finally:
        await discovery.stop()
        await client.aclose()


async def test_an_unreachable_api_server_leaves_the_pools_empty_without_failing_start() -> None:
    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=lambda: 0.0)
    discovery = KubernetesEndpoints(CONFIG, api=KubeAccess.plain(closed_port_url()))
    await discovery.start(registry)
    try:
        assert registry.endpoints("decode") == registry.endpoints("prefill") == ()
    finally:
        await discovery.stop()


async def test_the_router_serves_through_engines_it_discovered(
    api: httpx.AsyncClient, launcher: Launcher
) -> None:
    engine = await launcher.engine("d0")
    port = int(engine.url.rsplit(":", 1)[1])
    await create(api, endpoint_slice("demo-decode-a", "demo-decode", ("127.0.0.1", True)))
    config = RouterConfig.model_validate(
        {
            "service": "demo",
            "spec": {"model": {"name": MODEL_NAME, "servedName": MODEL}, "disaggregation": {"mode": "off"}},
            "discovery": {
                "kind": "kubernetes",
                "namespace": NAMESPACE,
                "prefillService": "demo-prefill",
                "decodeService": "demo-decode",
                "port": port,
            },
        }
    )
    settings = RouterSettings(discovery=DiscoverySettings(kube_api_server=str(api.base_url)))
    router = await launcher.router_for(config, settings=settings)
    answer = await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert answer.choices[0].text == " d0-0 d0-1"
    assert (await router.http.get("/health")).json()["pools"]["decode"] == {"endpoints": 1, "in_rotation": 1}


@pytest.mark.parametrize(
    ("slices", "expected"),
    [
        ([], []),
        (
            [endpoint_slice("a", "demo-decode", ("10.0.0.1", None), ("10.0.0.1", True))],
            ["http://10.0.0.1:8000"],
        ),
        ([endpoint_slice("a", "demo-decode", ("fd00::7", True))], ["http://[fd00::7]:8000"]),
        ([endpoint_slice("a", "demo-decode", ("10.0.0.1", False))], []),
        ([endpoint_slice("a", "elsewhere", ("10.0.0.1", True))], []),
        ([{"metadata": {"name": "empty", "labels": {"kubernetes.io/service-name": "demo-decode"}}}], []),
    ],
    ids=["none", "dedup-and-unset-ready", "ipv6", "not-ready", "other-service", "no-endpoints"],
)
def test_ready_urls(slices: list[dict[str, Any]], expected: list[str]) -> None:
    assert ready_urls(slices, service="demo-decode", port=8000) == expected


def test_in_cluster_access_comes_from_the_service_account() -> None:
    api = KubeAccess.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    assert api.server == "https://10.96.0.1:443"
    assert api.token_file is not None and api.token_file.name == "token"
    assert api.ca_file is not None and api.ca_file.name == "ca.crt"
    v6 = KubeAccess.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})
    assert v6.server == "https://[fd00::1]:443"
    with pytest.raises(ConfigurationError, match="--kube-api-server"):
        discovery_for(CONFIG, environ={})


def test_the_token_is_read_at_each_connect(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    api = KubeAccess(server="https://k", token_file=token)
    assert api.headers() == {"authorization": "Bearer first"}
    token.write_text("rotated")
    assert api.headers() == {"authorization": "Bearer rotated"}


async def test_watches_resume_from_their_last_resource_version_and_relist_when_it_is_gone() -> None:
    """Scripted API server (httpx.MockTransport): a list, a watch that ends after a bookmark and an
    update, a resumed watch answered 410 Gone, a relist, and a watch whose ERROR event says 410."""
    a1 = endpoint_slice("a", "demo-decode", ("10.0.0.1", True))
    a2 = endpoint_slice("a", "demo-decode", ("10.0.0.2", True))
    a3 = endpoint_slice("a", "demo-decode", ("10.0.0.3", True))
    for obj, rv in ((a1, "5"), (a2, "7"), (a3, "20")):
        obj["metadata"]["resourceVersion"] = rv

    def events(*items: dict[str, Any]) -> bytes:
        return b"".join(json.dumps(item).encode() + b"\n" for item in items)

    script: list[tuple[str | None, httpx.Response]] = [
        (None, httpx.Response(200, json={"items": [a1], "metadata": {"resourceVersion": "5"}})),
        ("5", httpx.Response(200, content=events(
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}},
            {"type": "MODIFIED", "object": a2},
        ))),
        ("7", httpx.Response(410, json={"kind": "Status", "code": 410})),
        (None, httpx.Response(200, json={"items": [a3], "metadata": {"resourceVersion": "20"}})),
        ("20", httpx.Response(200, content=events({"type": "ERROR", "object": {"code": 410}}))),
        (None, httpx.Response(200, json={"items": [a3], "metadata": {"resourceVersion": "21"}})),
    ]  # fmt: skip
    seen: list[str | None] = []
    done = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["labelSelector"] == "kubernetes.io/service-name=demo-decode"
        watching = request.url.params.get("watch") == "true"
        rv = request.url.params.get("resourceVersion") if watching else None
        seen.append(rv if watching else None)
        if not script:
            done.set()
            await asyncio.sleep(3600)  # a watch with nothing to say
        expected, response = script.pop(0)
        assert (watching, rv) == (expected is not None, expected)
        return response

    changes: list[list[str]] = []
    client = httpx.AsyncClient(base_url="http://api", transport=httpx.MockTransport(handler))
    watch = SliceWatch(
        client=client, api=KubeAccess.plain("http://api"), namespace=NAMESPACE, service="demo-decode",
        port=8000, on_change=changes.append,
    )  # fmt: skip
    task = asyncio.create_task(watch.run(await watch.list()))
    await asyncio.wait_for(done.wait(), timeout=10)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await client.aclose()
    assert seen == [None, "5", "7", None, "20", None, "21"]
    assert changes == [["http://10.0.0.1:8000"], ["http://10.0.0.2:8000"], ["http://10.0.0.3:8000"]]


async def test_every_failure_of_the_kubernetes_client_is_a_kube_error() -> None:
    """Scripted answers (httpx.MockTransport): a refused request, an answer that is not JSON, no
    answer at all, a malformed watch line, a watch ERROR event and a 410 all surface as `KubeError`
    with the status (0: none), and the 410 as its `WatchGone`."""
    answers = {
        "/forbidden": httpx.Response(403, json={"kind": "Status", "message": "no list for you"}),
        "/html": httpx.Response(502, text="<html>bad gateway</html>"),
        "/garbled": httpx.Response(200, content=b"{not json\n"),
        "/error": httpx.Response(200, json={"type": "ERROR", "object": {"code": 500, "message": "etcd"}}),
        "/gone": httpx.Response(410, json={"kind": "Status", "code": 410}),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/down":
            raise httpx.ConnectError("connection refused")
        return answers[request.url.path]

    api = KubeAccess.plain("http://api")
    async with httpx.AsyncClient(base_url="http://api", transport=httpx.MockTransport(handler)) as client:
        failures: list[KubeError] = []
        for path in ("/forbidden", "/html", "/down"):
            with pytest.raises(KubeError) as caught:
                await request_json(client, api, "GET", path)
            failures.append(caught.value)
        for path in ("/garbled", "/error", "/gone"):
            with pytest.raises(KubeError) as caught:
                async for _ in watch_events(client, api, path, resource_version="1"):
                    pass
            failures.append(caught.value)
    assert [(f.status, f.transient) for f in failures] == [
        (403, False), (502, True), (0, True), (0, True), (500, True), (410, False),
    ]  # fmt: skip
    assert "no list for you" in str(failures[0]) and "bad gateway" in str(failures[1])
    assert isinstance(failures[-1], WatchGone)
