"""Fixtures for the router tests: real fake engines and a real router, each a uvicorn server on
127.0.0.1, and the official `openai` client as the caller (see `launcher`)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import httpx2
import pytest
from openai import AsyncOpenAI
from starlette.types import ASGIApp

# Helpers are imported as `tests.router.*` (the name mypy gives them); `python -m pytest` has the
# repository root on sys.path already, a bare `pytest` does not.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.router.fake_engine import Behaviour, FakeEngine
from tests.router.servers import Served, serve

from tandem.core.routerconfig import RouterConfig
from tandem.router.app import create_app
from tandem.router.settings import RouterSettings

MODEL = "qwen"
MODEL_NAME = "Qwen/Qwen2.5-7B-Instruct"


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
    *, decode: Sequence[str], prefill: Sequence[str] = (), mode: Literal["always", "auto", "off"] = "off"
) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "service": "test",
            "spec": {
                "model": {"name": MODEL_NAME, "servedName": MODEL},
                "engine": {"kind": "sim"},
                "prefill": {"replicas": len(prefill)},
                "decode": {"replicas": max(1, len(decode))},
                "disaggregation": {"mode": mode},
                "router": {"fairness": {"tenantHeader": "x-tenant-id"}},
            },
            "discovery": {"kind": "static", "prefill": list(prefill), "decode": list(decode)},
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
    ) -> RunningRouter:
        config = router_config(decode=_urls(decode), prefill=_urls(prefill), mode=mode)
        extra: dict[str, Any] = {"clock": clock} if clock is not None else {}
        app = create_app(config, settings=settings, **extra)
        url = await self._serve(app)
        http = await self._stack.enter_async_context(
            httpx.AsyncClient(base_url=url, trust_env=False, timeout=20)
        )
        openai = await self._stack.enter_async_context(
            AsyncOpenAI(
                base_url=f"{url}/v1",
                api_key="x",
                max_retries=0,
                timeout=20,
                http_client=httpx2.AsyncClient(trust_env=False, timeout=20),  # openai's httpx fork
            )
        )
        return RunningRouter(url=url, openai=openai, http=http)


def _urls(engines: Sequence[FakeEngine | str]) -> list[str]:
    return [e.url if isinstance(e, FakeEngine) else e for e in engines]


@pytest.fixture
async def launcher() -> AsyncIterator[Launcher]:
    async with AsyncExitStack() as stack:
        launcher = Launcher(stack)
        try:
            yield launcher
        finally:
            launcher.stop_servers_soon()  # all at once; the stack then waits for each
