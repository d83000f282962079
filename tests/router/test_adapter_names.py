"""Adapter names that change while the gateway runs: a names file (`adapterNamesFile`, the operator's
ConfigMap `<service>-adapter-names`) re-read by the gateway, so an adapter added there is served and
one removed is refused and unloaded, without a restart (`tandem.router.request.adapters`,
`tandem.router.upstream.adapters.AdapterNamesFile`).

Real: `tandem sim` engines with `--enable-lora`, vLLM's runtime API and filesystem resolver over
adapter directories in tmp_path; the router (`create_app`, `create_many_app`), uvicorn servers on
127.0.0.1, httpx; the names file written as the kubelet writes a mounted ConfigMap (a `..data`
symlink swapped for a new directory). The many-service test uses `fake_engine.FakeEngine` engines.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.router.harness import Launcher
from tests.router.servers import serve
from tests.router.test_gateway_lora import complete, lora_config, lora_engine, many_file, write_adapter
from tests.router.test_routing_sims import samples

from tandem.core.adapternames import names_document, parse_names
from tandem.core.adapters import AdapterError
from tandem.core.gateway import GatewayFile
from tandem.core.routerconfig import RouterConfig, StaticDiscovery
from tandem.core.spec import InferenceServiceSpec
from tandem.operator.resources.lora import build_adapter_names_configmap
from tandem.operator.resources.meta import Owner
from tandem.operator.resources.router import router_config
from tandem.router.app import create_app as router_app
from tandem.router.compose.many import create_many_app, following, name_owners, owned_adapters, retrying
from tandem.router.compose.service import adapter_janitor
from tandem.router.config import EffectiveConfig, resolve
from tandem.router.errors import ConfigurationError
from tandem.router.request.adapters import Change, ServiceAdapters
from tandem.router.request.names import ModelNames
from tandem.router.settings import RouterSettings
from tandem.router.upstream.adapters import AdapterNamesFile
from tandem.router.upstream.client import HTTPUpstream, new_wire


class ConfigMapDir:
    """A directory the way the kubelet keeps a mounted ConfigMap: `names.json` → `..data/names.json`,
    `..data` → a timestamped directory, swapped atomically on each update."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.versions = 0
        root.mkdir(parents=True, exist_ok=True)
        (root / "names.json").symlink_to("..data/names.json")

    @property
    def file(self) -> Path:
        return self.root / "names.json"

    def write(self, text: str) -> None:
        self.versions += 1
        version = self.root / f"..v{self.versions}"
        version.mkdir()
        (version / "names.json").write_text(text)
        link = self.root / "..data_tmp"
        link.symlink_to(version.name)
        os.replace(link, self.root / "..data")

    def names(self, *names: str) -> None:
        self.write(names_document(names))


# -- the names (pure) ---------------------------------------------------------------------------


def test_the_names_document_round_trips_and_refuses_what_is_not_a_list_of_adapter_names() -> None:
    assert parse_names(names_document(["sql", "chat", "sql"])) == ("sql", "chat")
    assert parse_names('{"adapters": []}') == ()
    for bad, why in [
        ("[", "not JSON"),
        ('{"names": []}', 'no "adapters" list'),
        ('{"adapters": [1]}', "must be a string"),
        ('{"adapters": ["../etc"]}', "not an adapter name"),
        ('{"adapters": ["sql", "sql"]}', "listed twice"),
    ]:
        with pytest.raises(AdapterError, match=why):
            parse_names(bad)


def test_a_services_adapters_are_its_fixed_names_then_the_files_and_each_change_is_heard() -> None:
    heard: list[Change] = []
    adapters = ServiceAdapters({"qwen", "org/qwen"}, ("sql", "qwen"))
    adapters.listeners.append(heard.append)
    accepted, names = adapters.accepted, adapters.names  # what the request path holds
    assert adapters.ordered == ("sql",) and accepted == {"qwen", "org/qwen", "sql"}
    change = adapters.replace(["chat", "sql", "qwen", "code"])
    assert change == Change(added=("chat", "code"), removed=())
    assert list(adapters.ordered) == ["sql", "chat", "code"]
    assert "chat" in accepted and "code" in names, "the same sets, changed in place"
    assert adapters.replace(["code"]) == Change(added=(), removed=("chat",))
    assert "chat" not in accepted and "chat" not in names and "sql" in names, "fixed names stay"
    assert not adapters.replace(["code"]) and heard == [
        Change(added=("chat", "code")),
        Change(removed=("chat",)),
    ], "an unchanged list is not a change"


def test_a_name_another_service_model_or_alias_holds_is_refused_and_taken_once_freed() -> None:
    routes = {"qwen": "alpha-route", "llama": "beta-route"}
    names: ModelNames[str] = ModelNames(routes, {"fast": [("qwen", 1)]}, {"sql": "qwen"})

    def config(service: str, model: str, adapters: list[str]) -> EffectiveConfig:
        spec = {
            "model": {"name": f"org/{model}", "servedName": model},
            "engine": {"kind": "sim", "lora": {"maxLoras": 2}},
            "adapters": [{"name": a, "source": f"pvc://loras/{a}"} for a in adapters],
        }
        document = {
            "service": service,
            "spec": spec,
            "discovery": {"kind": "static", "decode": ["http://x:1"]},
        }
        return resolve(RouterConfig.model_validate(document), RouterSettings())

    alpha, beta = config("alpha", "qwen", ["sql"]), config("beta", "llama", [])
    owners, members = name_owners([alpha, beta], {"fast": [("alpha", 1)]}), list[ServiceAdapters]()
    mine, theirs = owned_adapters(alpha, owners, members), owned_adapters(beta, owners, members)
    for adapters, route in ((mine, "alpha-route"), (theirs, "beta-route")):
        adapters.listeners += [following(names, route), retrying(members, adapters)]
    theirs.replace(["sql", "fast", "org/qwen", "llama", "code"])
    assert theirs.ordered == ("code",)
    assert theirs.refused == {
        "sql": "'sql' is already service alpha's adapter",
        "fast": "'fast' is already an alias",
        "org/qwen": "'org/qwen' is already service alpha's model",
    }
    assert names.resolve("code").service == "beta-route" and names.resolve("code").adapter == "code"
    assert mine.replace(["code"]).added == () and mine.refused == {
        "code": "'code' is already service beta's adapter"
    }
    theirs.replace([])  # beta drops code: alpha's refused code is tried again at once
    assert mine.refused == {} and mine.ordered == ("sql", "code")
    assert names.resolve("code").service == "alpha-route"
    assert theirs.replace(["code"]).added == () and "code" in theirs.refused


# -- the file -----------------------------------------------------------------------------------


def test_the_file_is_followed_through_the_kubelets_swaps_and_a_bad_one_keeps_the_names(
    tmp_path: Path,
) -> None:
    mount = ConfigMapDir(tmp_path / "names")
    mount.names("sql")
    adapters = ServiceAdapters({"qwen"})
    follower = AdapterNamesFile(mount.file, adapters)
    assert adapters.ordered == ("sql",)
    assert follower.check() is None, "unchanged"
    mount.names("sql", "chat")
    assert follower.check() == Change(added=("chat",))
    mount.write('{"adapters": ["../x"]}')
    assert follower.check() is None and list(adapters.ordered) == ["sql", "chat"]
    assert follower.reloads == {"ok": 1, "error": 1} and "not an adapter name" in follower.error
    mount.names("chat")
    assert follower.check() == Change(removed=("sql",)) and follower.error == ""


def test_a_names_file_that_cannot_be_read_at_start_up_stops_the_gateway(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigurationError, match='no "adapters" list'):
        AdapterNamesFile(tmp_path / "bad.json", ServiceAdapters({"qwen"}))
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ConfigurationError, match=r"adapterNamesFile .*dir\.json"):
        AdapterNamesFile(tmp_path / "dir.json", ServiceAdapters({"qwen"}))


def test_a_names_file_that_does_not_exist_yet_is_no_names_until_it_appears(tmp_path: Path) -> None:
    adapters = ServiceAdapters({"qwen"}, ("sql",))
    follower = AdapterNamesFile(tmp_path / "names" / "names.json", adapters)
    assert adapters.ordered == ("sql",) and "does not exist" in follower.error
    assert follower.check() is None and follower.reloads == {"ok": 0, "error": 0}, "not a failed reload"
    mount = ConfigMapDir(tmp_path / "names")
    mount.names("chat")
    assert follower.check() == Change(added=("chat",)) and follower.error == ""
    assert follower.reloads == {"ok": 1, "error": 0}


# -- a gateway ----------------------------------------------------------------------------------


def file_config(urls: list[str], names_file: Path) -> RouterConfig:
    """`lora_config` as the operator renders it: no adapters of its own, a names file."""
    document = lora_config(urls).model_dump(by_alias=True, mode="json")
    document["spec"]["adapters"] = []
    document.pop("adapterNames")
    return RouterConfig.model_validate(document | {"adapterNamesFile": str(names_file)})


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait for the gateway's next read of the file (every 2 s)."""
    for _ in range(150):
        if await condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(what)


async def test_an_adapter_added_to_the_file_is_served_and_one_removed_is_refused_and_unloaded(
    tmp_path: Path,
) -> None:
    for name in ("sql", "chat"):
        write_adapter(tmp_path / "adapters", name)
    mount = ConfigMapDir(tmp_path / "names")
    mount.names("sql")
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(serve(lora_engine(tmp_path / "adapters")))
        direct = await stack.enter_async_context(httpx.AsyncClient(base_url=engine.url, trust_env=False))
        router = await stack.enter_async_context(serve(router_app(file_config([engine.url], mount.file))))
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=router.url, timeout=30, trust_env=False)
        )

        async def status(model: str) -> int:
            return (await client.post("/v1/completions", json=complete(model))).status_code

        async def listed(http: httpx.AsyncClient) -> list[str]:
            return [m["id"] for m in (await http.get("/v1/models")).json()["data"]]

        assert [await status("sql"), await status("chat")] == [200, 404]
        mount.names("sql", "chat")

        async def chat_served() -> bool:
            return await status("chat") == 200

        await until(chat_served, "the added adapter was never served")
        assert await listed(client) == ["qwen", "sql", "chat"]
        assert "chat" in await listed(direct), "loaded on the engine by its use"
        metrics = samples((await client.get("/metrics")).text)
        assert metrics["tandem_router_adapters"][()] == 2
        assert metrics["tandem_router_adapter_names_reloads_total"][(("outcome", "ok"),)] >= 1
        mount.names("sql")

        async def chat_gone() -> bool:
            return "chat" not in await listed(direct)

        await until(chat_gone, "the removed adapter was never unloaded from the engine")
        assert [await status("sql"), await status("chat")] == [200, 404]
        assert await listed(client) == ["qwen", "sql"]


async def test_a_gateway_of_many_services_serves_a_name_its_file_adds_and_refuses_another_services(
    launcher: Launcher, tmp_path: Path
) -> None:
    a, b = await launcher.engine("a0"), await launcher.engine("b0")
    mount = ConfigMapDir(tmp_path / "names")
    mount.names("chat", "llama")  # llama: beta's model
    document: dict[str, Any] = many_file(a.url, b.url)
    document["services"][0]["config"]["adapterNamesFile"] = str(mount.file)
    url = await launcher.serve_app(
        create_many_app(GatewayFile.model_validate(document), settings=RouterSettings())
    )
    async with httpx.AsyncClient(base_url=url, timeout=20, trust_env=False) as client:

        async def status(model: str) -> int:
            return (await client.post("/v1/completions", json=complete(model))).status_code

        assert [await status(m) for m in ("sql", "chat", "llama", "code")] == [200, 200, 200, 404]
        metrics = samples((await client.get("/metrics")).text)
        assert metrics["tandem_router_adapters_refused"][(("model", "qwen"),)] == 1
        mount.names("chat", "code")

        async def code_served() -> bool:
            return await status("code") == 200

        await until(code_served, "the added adapter was never served")
        assert await status("chat") == 200
        listed = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
    assert [r.body["model"] for r in a.received] == ["sql", "chat", "code", "chat"]
    assert [r.body["model"] for r in b.received] == ["llama"]
    assert listed == ["qwen", "sql", "chat", "code", "llama"]


def test_the_janitor_stays_on_for_a_volume_catalog_whose_names_a_file_brings(tmp_path: Path) -> None:
    (tmp_path / "names.json").write_text(json.dumps({"adapters": []}))
    document = lora_config(["http://127.0.0.1:1"]).model_dump(by_alias=True, mode="json")
    document["spec"]["adapterCatalog"] = {"source": "pvc://loras/catalog"}
    config = resolve(RouterConfig.model_validate(document), RouterSettings())
    assert config.lora and config.adapter_names_file is None
    with_file = resolve(
        RouterConfig.model_validate(document | {"adapterNamesFile": str(tmp_path / "names.json")}),
        RouterSettings(),
    )
    assert with_file.adapter_names_file == tmp_path / "names.json"
    upstream = HTTPUpstream(new_wire(RouterSettings().proxy), RouterSettings().proxy)
    adapters = ServiceAdapters({"qwen"}, with_file.adapters)
    assert adapter_janitor(config, upstream, adapters) is None
    assert adapter_janitor(with_file, upstream, adapters) is not None


async def test_the_operators_gateway_config_and_names_configmap_serve_a_catalogs_adapters(
    tmp_path: Path,
) -> None:
    """What the operator renders for a service with a `pvc://` catalog (the router config without
    adapters, `<name>-adapter-names` with the names the sidecars reported), run by the gateway in
    front of an engine whose resolver finds the catalog's adapters."""
    for name in ("sql", "chat"):
        write_adapter(tmp_path / "adapters", name)
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"name": "tiny", "servedName": "qwen"},
            "engine": {"kind": "sim", "lora": {"maxLoras": 2}},
            "decode": {"replicas": 1},
            "prefill": {"replicas": 0},
            "disaggregation": {"mode": "off"},
            "adapters": [{"name": "sql", "source": "hf://org/sql"}],
            "adapterCatalog": {"source": "pvc://loras/catalog"},
        }
    )
    owner = Owner(name="lora", namespace="team", uid="u1")
    rendered = router_config(spec, owner=owner)
    assert (
        rendered.spec.adapters == [] and rendered.adapter_names_file == "/etc/tandem/adapter-names/names.json"
    )
    configmap = build_adapter_names_configmap(spec, owner=owner, catalog=["chat", "qwen"])
    assert configmap is not None
    mount = ConfigMapDir(tmp_path / "names")
    mount.write(configmap["data"]["names.json"])
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(serve(lora_engine(tmp_path / "adapters")))
        config = rendered.model_copy(
            update={"adapter_names_file": str(mount.file), "discovery": StaticDiscovery(decode=[engine.url])}
        )
        router = await stack.enter_async_context(serve(router_app(config)))
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=router.url, timeout=30, trust_env=False)
        )
        answers = [
            await client.post("/v1/completions", json=complete(m)) for m in ("qwen", "sql", "chat", "code")
        ]
        assert [a.status_code for a in answers] == [200, 200, 200, 404]
        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["qwen", "sql", "chat"]
