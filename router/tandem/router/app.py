"""The composition root: `create_app(config)` returns the gateway as an ASGI app.

At creation, what can be checked without a running loop is checked (the configuration resolved,
the API key file read, the model's tokenizer loaded: `ConfigurationError` for any of them, and the
CLI exits with its one-line reason). Everything with a lifetime (the upstream HTTP session, the
metrics collector, discovery, the key file's watch) is built by `compose` in the lifespan and handed
to requests as lifespan state; nothing lives at module level, so two apps in one process share
nothing.

With `own_process` (the `tandem router` command and each of its workers, never tests or an embedding
application) the objects alive once start-up is over (modules, the tokenizer, the composed stages) are
moved out of the cyclic garbage collector's reach (`gc.freeze`): they live as long as the process,
and each of the collector's full passes walked them all again. In the shared-prefix benchmark, round
robin, the gateway spent 1.15 s of CPU per 1,000 requests against 1.24 s before, and its slow
repeats were gone (docs/router-performance.md, "Start-up's objects out of the collector's reach").
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp

from tandem.core.gateway import GatewayFile
from tandem.core.modeltokens import PromptEncoder
from tandem.core.routerconfig import RouterConfig
from tandem.router.admission.policy import TTFTPredictor
from tandem.router.compose import compose
from tandem.router.compose.many import create_many_app
from tandem.router.compose.startup import engine_clients, load_key_file, model_tokenizer
from tandem.router.config import EffectiveConfig, resolve
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.discovery.sources import Discovery, discovery_for
from tandem.router.http.diagnostics import DiagnosticsGuard
from tandem.router.http.server import GatewayApp
from tandem.router.http.side import side_app
from tandem.router.identity.auth.keyfile import KeyFile
from tandem.router.observe.metrics import ConnectionsCollector, ConnectionTally
from tandem.router.settings import RouterSettings

log = logging.getLogger("tandem.router")


def create_app(
    config: RouterConfig | GatewayFile,
    *,
    settings: RouterSettings | None = None,
    clock: Callable[[], float] = time.monotonic,
    predictor: TTFTPredictor | None = None,
    prefix: PrefixSource | None = None,
    discovery: Discovery | None = None,
    environ: Mapping[str, str] | None = None,
    own_process: bool = False,
    connections: ConnectionTally | None = None,
) -> ASGIApp:
    """The gateway for `config`; with `settings.access.metrics_port`, wrapped in the diagnostics
    port's guard (`tandem.router.http.diagnostics`).

    `clock`: monotonic seconds for durations, cool-downs and queue deadlines. `predictor`: TTFT
    predictions for early rejection (default: the scheduler's learned one). `prefix`: decode
    endpoints' prefix caches for the P/D decision (default: the scheduler's prefix source).
    `discovery`: replaces the one `config.discovery` names (tests). `environ`: the environment
    (default `os.environ`). `own_process`: this app is the process's only one and lives as long as
    it (module docstring). `connections`: the counts of the HTTP server that serves this app
    (`tandem.cli.connections`), shown on /metrics. Raises `ConfigurationError` at once for a
    configuration this build cannot serve.

    A `GatewayFile` (`kind: gateway`) makes one gateway in front of several services
    (`tandem.router.compose.many`; `predictor`, `prefix` and `discovery` are for one service only).
    """
    app = _create_app(
        config, settings=settings, clock=clock, predictor=predictor, prefix=prefix, discovery=discovery,
        environ=environ, own_process=own_process, connections=connections,
    )  # fmt: skip
    access = (settings or RouterSettings()).access
    if access.metrics_port is None:
        return app
    token = access.metrics_token.get_secret_value() or None
    return DiagnosticsGuard(app, port=access.metrics_port, token=token)


def _create_app(
    config: RouterConfig | GatewayFile,
    *,
    settings: RouterSettings | None,
    clock: Callable[[], float],
    predictor: TTFTPredictor | None,
    prefix: PrefixSource | None,
    discovery: Discovery | None,
    environ: Mapping[str, str] | None,
    own_process: bool,
    connections: ConnectionTally | None,
) -> GatewayApp:
    env = os.environ if environ is None else environ
    if isinstance(config, GatewayFile):
        return create_many_app(
            config,
            settings=settings,
            clock=clock,
            environ=env,
            collectors=[ConnectionsCollector(connections)] if connections is not None else (),
            own_process=own_process,
        )
    effective = resolve(config, settings or RouterSettings(), environ=env)
    key_file = load_key_file(effective)
    encoder = PromptEncoder(model_tokenizer(effective))
    found = discovery or discovery_for(
        effective.discovery, environ=env, kube_api_server=effective.settings.discovery.kube_api_server
    )
    lifespan = _lifespan(
        effective,
        encoder=encoder,
        key_file=key_file,
        discovery=found,
        clock=clock,
        predictor=predictor,
        prefix=prefix,
        own_process=own_process,
        connections=connections,
    )
    side = side_app(lifespan=lifespan, served=effective.served_models, auth=key_file is not None, clock=clock)
    return GatewayApp(side)


def _lifespan(
    config: EffectiveConfig,
    *,
    encoder: PromptEncoder,
    key_file: KeyFile | None,
    discovery: Discovery,
    clock: Callable[[], float],
    predictor: TTFTPredictor | None,
    prefix: PrefixSource | None,
    own_process: bool,
    connections: ConnectionTally | None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[dict[str, Any]]]:
    """Builds the components at start-up (discovery fills the registry before the first request)
    and tears down in reverse order at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            wire, scrapes = await engine_clients(stack, config.settings.proxy)
            parts = compose(
                config,
                wire=wire,
                scrapes=scrapes,
                encoder=encoder,
                key_file=key_file,
                clock=clock,
                predictor=predictor,
                prefix=prefix,
            )
            if parts.kv_pool is not None:
                stack.push_async_callback(parts.kv_pool.aclose)
            if parts.gateway.tracer is not None:
                stack.callback(parts.gateway.tracer.shutdown)
            if connections is not None:
                parts.prometheus.register(ConnectionsCollector(connections))
            await discovery.start(parts.registry)
            stack.push_async_callback(discovery.stop)
            for service in parts.services:
                await service.start()
                stack.push_async_callback(service.stop)
            _log_ready(config, encoder, parts.registry)
            if own_process:
                gc.collect()  # what start-up left behind goes now, not into the frozen set
                gc.freeze()
            yield {"gateway": parts.gateway, "operations": parts.operations}

    return lifespan


def _log_ready(config: EffectiveConfig, encoder: PromptEncoder, registry: Any) -> None:
    if not config.tokenizer_exact:
        log.warning(
            "prompt tokens are estimates: the gateway has no tokenizer files for this model "
            "(set tokenizerPath, or spec.model.tokenizer; docs/router.md, 'Prompt tokens')"
        )
    if config.kv_pool_off is not None:
        log.warning(
            "kv pool look-ups off: the gateway cannot compute the engines' chunk keys, so P/D "
            "decisions use the local prefix only and there is no KV barrier",
            extra={"reason": config.kv_pool_off},
        )
    log.info(
        "router ready",
        extra={
            **config.describe(),
            "tokenizer_segments": encoder.splits,
            "tokenizer_backend": encoder.tokenizer.backend,
            "tokenizer_fast_refused": encoder.tokenizer.fast_refused,
            "decode": [e.name for e in registry.endpoints("decode")],
            "prefill": [e.name for e in registry.endpoints("prefill")],
        },
    )
