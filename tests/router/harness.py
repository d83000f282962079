"""The router tests' harness: real fake engines and a real router, each a uvicorn server on
127.0.0.1, the official `openai` client as the caller, a hand-moved clock, and a /metrics reader."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import httpx2
from openai import AsyncOpenAI
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp
from tests.router.fake_engine import Behaviour, FakeEngine
from tests.router.servers import Served, serve

from tandem.core.routerconfig import RouterConfig
from tandem.router.app import create_app
from tandem.router.compose.routing import Routing, build_routing
from tandem.router.config import resolve
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.settings import RouterSettings
from tandem.router.workers.bus import SoloBus

MODEL = "qwen"
MODEL_NAME = "Qwen/Qwen2.5-7B-Instruct"
#: What a prefill engine answers with vLLM's NIXL connector: where the decode engine finds the KV.
NIXL_PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "prefill-engine-1",
    "remote_block_ids": [3, 4, 5],
    "remote_host": "10.0.0.7",
    "remote_port": 5600,
    "tp_size": 1,
}


class FakeClock:
    """A monotonic clock tests move by hand (seconds)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class RunningRouter:
    url: str
    openai: AsyncOpenAI
    http: httpx.AsyncClient  # raw calls; base_url is the router


def router_config(
    *,
    decode: Sequence[str],
    prefill: Sequence[str] = (),
    mode: Literal["always", "auto", "off"] = "off",
    spec: Mapping[str, Mapping[str, Any]] | None = None,
    kv_pool_url: str | None = None,
) -> RouterConfig:
    """A config for these engines; `spec` is merged into the spec's sections (one level deep)."""
    sections: dict[str, dict[str, Any]] = {
        "model": {"name": MODEL_NAME, "servedName": MODEL},
        "engine": {"kind": "sim"},
        "prefill": {"replicas": len(prefill)},
        "decode": {"replicas": max(1, len(decode))},
        "disaggregation": {"mode": mode},
        "router": {"fairness": {"tenantHeader": "x-tenant-id"}},
    }
    for name, values in (spec or {}).items():
        sections[name] = {**sections.get(name, {}), **values}
    return RouterConfig.model_validate(
        {
            "service": "test",
            "spec": sections,
            "discovery": {"kind": "static", "prefill": list(prefill), "decode": list(decode)},
            "kvPoolUrl": kv_pool_url,
        }
    )


class Launcher:
    """Starts servers and clients for one test; everything stops when the test ends."""

    def __init__(self, stack: AsyncExitStack) -> None:
        self._stack = stack
        self._servers: list[Served] = []

    async def _serve(self, app: ASGIApp) -> str:
        served = await self._stack.enter_async_context(serve(app))
        self._servers.append(served)
        return served.url

    def stop_servers_soon(self) -> None:
        for served in self._servers:
            served.request_stop()

    async def serve_app(self, app: ASGIApp) -> str:
        """Serve any ASGI app (e.g. a simulated engine) for the test; returns its base URL."""
        return await self._serve(app)

    async def engine(self, name: str, **behaviour: Any) -> FakeEngine:
        engine = FakeEngine(name, Behaviour(**behaviour))
        engine.url = await self._serve(engine.app)
        return engine

    async def router(
        self,
        *,
        decode: Sequence[FakeEngine | str],
        prefill: Sequence[FakeEngine | str] = (),
        mode: Literal["always", "auto", "off"] = "off",
        settings: RouterSettings | None = None,
        clock: FakeClock | None = None,
        spec: Mapping[str, Mapping[str, Any]] | None = None,
        kv_pool_url: str | None = None,
        **app_options: Any,
    ) -> RunningRouter:
        """A router for these engines; `app_options` go to `create_app` (predictor, prefix, ...)."""
        config = router_config(
            decode=_urls(decode), prefill=_urls(prefill), mode=mode, spec=spec, kv_pool_url=kv_pool_url
        )
        return await self.router_for(config, settings=settings, clock=clock, **app_options)

    async def router_for(
        self,
        config: RouterConfig,
        *,
        settings: RouterSettings | None = None,
        clock: FakeClock | None = None,
        **app_options: Any,
    ) -> RunningRouter:
        """A router for any config (e.g. Kubernetes discovery), with its clients. The tests read which
        engines served a request from the `x-tandem-*` headers, so they are on unless `settings`
        says otherwise explicitly (`topology_headers` set)."""
        extra: dict[str, Any] = {"clock": clock} if clock is not None else {}
        settings = settings or RouterSettings()
        if "topology_headers" not in settings.access.model_fields_set:
            access = settings.access.model_copy(update={"topology_headers": True})
            settings = settings.model_copy(update={"access": access})
        app = create_app(config, settings=settings, **extra, **app_options)
        url = await self._serve(app)
        # verify=False: plain http on loopback, and it skips loading the CA bundle (~0.1 s a client).
        http = await self._stack.enter_async_context(
            httpx.AsyncClient(base_url=url, trust_env=False, timeout=20, verify=False)
        )
        openai = await self._stack.enter_async_context(
            AsyncOpenAI(
                base_url=f"{url}/v1",
                api_key="x",
                max_retries=0,
                timeout=20,
                http_client=httpx2.AsyncClient(trust_env=False, timeout=20, verify=False),
            )
        )
        return RunningRouter(url=url, openai=openai, http=http)


def _urls(engines: Sequence[FakeEngine | str]) -> list[str]:
    return [e.url if isinstance(e, FakeEngine) else e for e in engines]


async def metric(router: RunningRouter, name: str, **labels: str) -> float:
    """The sum of the samples called `name` on the router's /metrics whose labels include `labels`
    (0 when there are none)."""
    text = (await router.http.get("/metrics")).text
    return sum(
        float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


@dataclass
class BuiltRouting:
    """The gateway's scheduling side without a server (`built_routing`)."""

    routing: Routing
    registry: EndpointRegistry
    prometheus: CollectorRegistry


async def built_routing(config: RouterConfig, decode: Sequence[str]) -> BuiltRouting:
    """`build_routing` for `config` (resolved with default settings) over static decode endpoints,
    on its own Prometheus registry and a hand-moved clock: what `/metrics` and the scheduler see."""
    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=1.0, clock=FakeClock())
    registry.set_pool("decode", list(decode))
    prometheus = CollectorRegistry()
    async with httpx.AsyncClient() as scrapes:
        routing = build_routing(
            resolve(config, RouterSettings()),
            registry=registry,
            prometheus=prometheus,
            scrapes=scrapes,
            clock=FakeClock(),
            bus=SoloBus(),
        )
    return BuiltRouting(routing=routing, registry=registry, prometheus=prometheus)
