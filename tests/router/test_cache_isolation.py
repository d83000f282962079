"""Tenants' caches kept apart: the gateway's `cache_salt`, its prefix index, and what a client can see.

The attack (issue: "the P/D decision is visible to clients"): tenant B wants to know whether another
tenant recently sent a prompt. It sends the prompt (the probe) and a prompt nobody sent (the
control), and compares everything it can see: status, headers, body, and the gateway's public
/metrics. With isolation on (the default) the two are indistinguishable; with it off, the gateway's
own metrics tell them apart (the discriminating control of this test).

Real: two `tandem sim` engines and the router, uvicorn servers on 127.0.0.1, httpx. Unit tests of
the salts (`CacheScopes`) and of the spec's fields come first.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from tests.router.harness import MODEL, Launcher
from tests.router.servers import serve
from tests.router.test_routing_sims import samples

from tandem.core.routerconfig import RouterConfig
from tandem.core.spec import RouterSpec
from tandem.router.app import create_app as router_app
from tandem.router.identity.cachescope import CacheScopes
from tandem.router.settings import RouterSettings
from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import SimSettings

KEY = b"k" * 32


# -- the salts ---------------------------------------------------------------------------------


def test_each_tenant_has_its_own_stable_salt_and_a_group_shares_one() -> None:
    scopes = CacheScopes(key=KEY, groups={"docs-a": "public", "docs-b": "public"})
    a, b = scopes.salt("alice"), scopes.salt("bob")
    assert a is not None and b is not None and a != b
    assert scopes.salt("alice") == a  # stable
    assert scopes.salt("docs-a") == scopes.salt("docs-b") not in (a, b)
    assert a.startswith("t1-") and len(a) == 35


def test_a_salt_depends_on_the_key_so_nobody_without_it_can_produce_one() -> None:
    assert CacheScopes(key=KEY).salt("alice") != CacheScopes(key=b"j" * 32).salt("alice")
    # a group named like a tenant is not that tenant
    assert CacheScopes(key=KEY, groups={"x": "alice"}).salt("x") != CacheScopes(key=KEY).salt("alice")


def test_isolation_off_sets_no_salt_and_a_short_key_is_refused() -> None:
    assert CacheScopes(key=b"", mode="off").salt("alice") is None
    with pytest.raises(ValueError, match="16 bytes"):
        CacheScopes(key=b"short")


def test_the_spec_takes_cache_groups_and_isolation_and_refuses_bad_values() -> None:
    spec = RouterSpec.model_validate(
        {"cacheIsolation": "off", "tenants": [{"name": "a", "cacheGroup": "public-docs"}]}
    )
    assert spec.cache_isolation == "off" and spec.tenants[0].cache_group == "public-docs"
    assert RouterSpec().cache_isolation == "tenant"
    with pytest.raises(ValidationError):
        RouterSpec.model_validate({"cacheIsolation": "sometimes"})
    with pytest.raises(ValidationError):
        RouterSpec.model_validate({"tenants": [{"name": "a", "cacheGroup": "../x"}]})


# -- the gateway sets it ------------------------------------------------------------------------


async def test_the_engine_gets_the_tenants_salt_never_the_clients(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    spec = {
        "tenants": [{"name": "team-a", "cacheGroup": "shared"}, {"name": "team-b", "cacheGroup": "shared"}]
    }
    router = await launcher.router(decode=[engine], spec={"router": spec})
    for tenant, salt in [
        ("alice", "mine"),
        ("bob", None),
        ("alice", None),
        ("team-a", None),
        ("team-b", None),
    ]:
        body: dict[str, Any] = {"model": MODEL, "prompt": "x", "max_tokens": 1}
        if salt is not None:
            body["cache_salt"] = salt
        response = await router.http.post("/v1/completions", json=body, headers={"x-tenant-id": tenant})
        assert response.status_code == 200
    alice, bob, alice_again, team_a, team_b = (r.body["cache_salt"] for r in engine.received)
    assert alice == alice_again != bob and "mine" not in (alice, alice_again)
    assert team_a == team_b not in (alice, bob)


async def test_with_isolation_off_no_salt_reaches_the_engine(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine], spec={"router": {"cacheIsolation": "off"}})
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1, "cache_salt": "client-chosen"}
    assert (await router.http.post("/v1/completions", json=body)).status_code == 200
    assert "cache_salt" not in engine.received[0].body


# -- probe pairs ---------------------------------------------------------------------------------

#: The public metric families whose samples could tell a cached prompt from another: the routing
#: decision's reason and the prefix match it saw.
REVEALING = ("tandem_router_schedule_decisions_total", "tandem_router_prefix_match_ratio")


def prompt(seed: int) -> str:
    rng = random.Random(seed)
    return "Policy. " + " ".join(f"w{rng.randint(100, 999)}" for _ in range(300))


@asynccontextmanager
async def stack(isolation: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    async with AsyncExitStack() as exits:
        urls = []
        for index in range(2):
            settings = SimSettings(
                profile="tiny-cpu", served_model_name="qwen", time_scale=100, num_gpu_blocks=400, seed=index
            )
            urls.append((await exits.enter_async_context(serve(sim_app(settings)))).url)
        config = RouterConfig.model_validate(
            {
                "service": "isolation-test",
                "spec": {
                    "model": {"name": "tiny", "servedName": "qwen"},
                    "engine": {"kind": "sim"},
                    "decode": {"replicas": 2},
                    "disaggregation": {"mode": "off"},
                    "router": {"policy": "tandem", "cacheIsolation": isolation},
                },
                "discovery": {"kind": "static", "decode": urls},
            }
        )
        router = await exits.enter_async_context(serve(router_app(config, settings=RouterSettings())))
        client = await exits.enter_async_context(httpx.AsyncClient(timeout=60, trust_env=False))
        yield client, router.url


async def seen(client: httpx.AsyncClient, url: str, tenant: str, text: str) -> dict[str, Any]:
    """Everything a client sees of one request: status, headers, body, the revealing metrics' change."""
    before = samples((await client.get(f"{url}/metrics")).text)
    body = {"model": "qwen", "prompt": text, "max_tokens": 2, "ignore_eos": True, "temperature": 0}
    response = await client.post(f"{url}/v1/completions", json=body, headers={"x-tenant-id": tenant})
    after = samples((await client.get(f"{url}/metrics")).text)
    answer = response.json()
    changed = {
        (name, labels): value - before.get(name, {}).get(labels, 0.0)
        for name, family in after.items()
        if name.startswith(REVEALING)
        for labels, value in family.items()
        if value != before.get(name, {}).get(labels, 0.0)
    }
    return {
        "status": response.status_code,
        "headers": sorted(k for k in response.headers if k not in ("date", "content-length")),
        "fields": sorted(answer),
        "usage": {k: v for k, v in answer["usage"].items() if k != "prompt_tokens"},
        "metrics": changed,
    }


async def probe(isolation: str, text: str) -> dict[str, Any]:
    """What the attacker sees of `text` on fresh engines and gateway, after the victim's prompt."""
    async with stack(isolation) as (client, url):
        for _ in range(3):  # the victim's prompt, cached
            await seen(client, url, "victim", prompt(1))
        return await seen(client, url, "attacker", text)


async def probe_pair(isolation: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same history; then the victim's prompt, or one nobody sent."""
    return await probe(isolation, prompt(1)), await probe(isolation, prompt(2))


async def test_a_prompt_another_tenant_sent_looks_like_one_nobody_sent() -> None:
    probe, control = await probe_pair("tenant")
    assert probe == control
    assert probe["status"] == 200 and probe["metrics"]  # the metrics moved, the same way


async def test_without_isolation_the_gateways_metrics_tell_the_probe_apart() -> None:
    probe, control = await probe_pair("off")
    assert probe["metrics"] != control["metrics"]
