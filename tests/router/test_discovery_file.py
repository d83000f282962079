"""File discovery: pool members from an endpoint file that the local runtime rewrites.

Real: `FileEndpoints` polling a real file in a temporary directory, the endpoint registry, the atomic
writer from `tandem.core.routerconfig`, and in the last story the whole router and two fake engines
found through the file. Nothing is emulated; waits poll the registry with a generous deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from tests.router.harness import MODEL, MODEL_NAME, Launcher, RunningRouter

from tandem.core.routerconfig import EndpointList, FileDiscovery, RouterConfig, write_endpoint_file
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.discovery.sources import EndpointFile, FileEndpoints, discovery_for
from tandem.router.types import Pool

A, B, C = "http://127.0.0.1:8101", "http://127.0.0.1:8102", "http://127.0.0.1:8103"


def urls(registry: EndpointRegistry, pool: Pool) -> list[str]:
    return [e.url for e in registry.endpoints(pool)]


async def eventually(check: Callable[[], bool]) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the registry never caught up with the file")


@pytest.fixture
async def followed(tmp_path: Path) -> AsyncIterator[tuple[Path, EndpointRegistry]]:
    """A registry following `<tmp>/endpoints.json` (polled every 20 ms) until the test ends."""
    path = tmp_path / "endpoints.json"
    write_endpoint_file(path, EndpointList(prefill=[A], decode=[B]))
    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=lambda: 0.0)
    discovery = discovery_for(FileDiscovery(path=str(path), poll_seconds=0.02), environ={})
    assert isinstance(discovery, FileEndpoints)
    await discovery.start(registry)
    yield path, registry
    await discovery.stop()


async def test_start_fills_both_pools_from_the_file(followed: tuple[Path, EndpointRegistry]) -> None:
    _, registry = followed
    assert urls(registry, "prefill") == [A] and urls(registry, "decode") == [B]


async def test_the_file_gives_engines_their_kv_layouts_and_a_changed_layout_is_taken(
    followed: tuple[Path, EndpointRegistry],
) -> None:
    path, registry = followed
    path.write_text(EndpointFile(prefill=[A], decode=[B, C], layouts={A: "g1", B: "g1"}).model_dump_json())
    await eventually(lambda: urls(registry, "decode") == [B, C])
    layouts = {e.url: e.layout for pool in ("prefill", "decode") for e in registry.endpoints(pool)}
    assert layouts == {A: "g1", B: "g1", C: None}  # C has none: it pairs with anything
    path.write_text(EndpointFile(prefill=[A], decode=[B, C], layouts={A: "g2", B: "g1"}).model_dump_json())
    await eventually(lambda: registry.endpoints("prefill")[0].layout == "g2")
    assert [v.endpoint.layout for v in registry.snapshots("prefill")] == ["g2"]


async def test_an_added_engine_joins_and_a_removed_one_leaves(
    followed: tuple[Path, EndpointRegistry],
) -> None:
    path, registry = followed
    write_endpoint_file(path, EndpointList(prefill=[A], decode=[B, C]))
    await eventually(lambda: urls(registry, "decode") == [B, C])
    write_endpoint_file(path, EndpointList(prefill=[], decode=[C]))
    await eventually(lambda: urls(registry, "decode") == [C] and urls(registry, "prefill") == [])


async def test_a_broken_file_keeps_the_last_membership_until_it_is_fixed(
    followed: tuple[Path, EndpointRegistry],
) -> None:
    path, registry = followed
    path.write_text('{"decode": ["not a url"]}')
    discovery = FileEndpoints(FileDiscovery(path=str(path)))
    assert discovery.reload(registry) is False  # invalid: nothing rewritten
    assert urls(registry, "decode") == [B]
    write_endpoint_file(path, EndpointList(decode=[C]))
    await eventually(lambda: urls(registry, "decode") == [C])


async def test_a_missing_file_leaves_the_pools_empty_without_failing_start(tmp_path: Path) -> None:
    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=lambda: 0.0)
    discovery = FileEndpoints(FileDiscovery(path=str(tmp_path / "absent.json"), poll_seconds=0.02))
    await discovery.start(registry)
    try:
        assert urls(registry, "decode") == []
        write_endpoint_file(tmp_path / "absent.json", EndpointList(decode=[A]))
        await eventually(lambda: urls(registry, "decode") == [A])
    finally:
        await discovery.stop()


async def test_the_router_sends_only_to_engines_in_the_file(tmp_path: Path, launcher: Launcher) -> None:
    first, second = await launcher.engine("d0"), await launcher.engine("d1")
    path = tmp_path / "endpoints.json"
    write_endpoint_file(path, EndpointList(decode=[first.url]))
    config = RouterConfig.model_validate(
        {
            "service": "demo",
            "spec": {"model": {"name": MODEL_NAME, "servedName": MODEL}, "disaggregation": {"mode": "off"}},
            "discovery": {"kind": "file", "path": str(path), "pollSeconds": 0.02},
        }
    )
    router = await launcher.router_for(config)
    answer = await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert answer.choices[0].text == " d0-0"
    write_endpoint_file(path, EndpointList(decode=[second.url]))
    for _ in range(1000):
        pools = (await router.http.get("/health")).json()["pools"]
        if pools["decode"]["endpoints"] == 1 and (await _answer(router)) == " d1-0":
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the router never switched to the engine now in the file")
    assert all([await _answer(router) == " d1-0" for _ in range(3)])


async def _answer(router: RunningRouter) -> str:
    answer = await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)
    return str(answer.choices[0].text)
