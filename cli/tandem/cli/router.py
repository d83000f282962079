"""`tandem router --config FILE`: serve the OpenAI gateway for one InferenceService, or for several.

The config file is a `tandem.core.routerconfig.RouterConfig` in YAML or JSON (what the operator puts
in a ConfigMap and `tandem up` writes), or, with `kind: gateway`, a `tandem.core.gateway.GatewayFile`:
one gateway in front of several services, routed by the body's `model` (docs/router.md, "Many models
behind one gateway"). An invalid file ends with one line naming the field and
exit code 2; so does a configuration this build cannot serve (e.g. `--shared-counters redis`
without a KV pool, or a `tokenizerPath` without the model's tokenizer files).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import click
import yaml
from pydantic import SecretStr, ValidationError

from tandem.cli.exits import fail
from tandem.cli.options import logging_options
from tandem.cli.router_workers import Supervisor, WorkerPlan, bind, gateway_server
from tandem.cli.routerflags import settings_from_flags, tuning_options
from tandem.core.gateway import GatewayFile
from tandem.core.logs import configure_logging
from tandem.core.routerconfig import RouterConfig
from tandem.core.specrules import check_rules
from tandem.router.app import create_app
from tandem.router.errors import ConfigurationError
from tandem.router.observe.metrics import ConnectionTally
from tandem.router.settings import RouterSettings

EXIT_BAD_CONFIG = 2


def _fail(message: str) -> NoReturn:
    fail(message, code=EXIT_BAD_CONFIG)


def _field_path(loc: tuple[int | str, ...]) -> str:
    # Pydantic puts the tag of a discriminated union in the path (`discovery.static.decode`).
    parts = [str(p) for i, p in enumerate(loc) if not (i and loc[i - 1] == "discovery")]
    return ".".join(parts) or "<document>"


def load_router_config(path: Path) -> RouterConfig:
    """`load_config` for a file that must be one service's `RouterConfig`."""
    config = load_config(path)
    if isinstance(config, GatewayFile):
        _fail(f"{path}: kind: expected a RouterConfig, not a gateway file")
    return config


def load_config(path: Path) -> RouterConfig | GatewayFile:
    """Parse and validate the config file (a `GatewayFile` when its `kind` is `gateway`); exits 2
    with a one-line reason when it is invalid."""
    try:
        document: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror}")
    except yaml.YAMLError as exc:
        _fail(f"{path}: not valid YAML or JSON: {exc}".replace("\n", " "))
    if not isinstance(document, dict):
        _fail(f"{path}: expected a mapping (a RouterConfig), got {type(document).__name__}")
    model = GatewayFile if document.get("kind") == "gateway" else RouterConfig
    try:
        config = model.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
        _fail(f"{path}: {_field_path(first['loc'])}: {message}")
    specs = (
        [(f"services[{i}].config.", s.config.spec) for i, s in enumerate(config.services)]
        if isinstance(config, GatewayFile)
        else [("", config.spec)]
    )
    for where, spec in specs:
        errors = check_rules(spec)
        if errors:
            _fail(f"{path}: {where}{errors[0]}")
    return config


@click.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="RouterConfig file (YAML or JSON).",
)
@click.option(
    "--api-keys-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="API key table (key: tenant lines; docs/security.md): every /v1 request then needs a key. "
    "Overrides the config's apiKeysFile.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=None,
    help="Gateway processes serving the port [default: the spec's router.workers, 1].",
)
@logging_options
@tuning_options
def router(
    config_path: Path,
    api_keys_file: Path | None,
    host: str,
    port: int,
    workers: int | None,
    log_level: str,
    log_format: str,
    **tuning: Any,
) -> None:
    """Serve the OpenAI-compatible gateway (/v1/completions, /v1/chat/completions, /v1/models,
    /health, /metrics) in front of the engines named in the config."""
    config = load_config(config_path)
    if api_keys_file is not None:
        config = config.model_copy(update={"api_keys_file": str(api_keys_file)})
    try:
        settings = settings_from_flags(tuning)  # the tuning flags, validated into RouterSettings
        settings = with_cache_key(with_engine_key(settings, os.environ), os.environ)
        settings = with_metrics_token(settings, os.environ)
    except click.UsageError as exc:
        _fail(exc.message)
    configure_logging(log_level, json_lines=log_format == "json")
    if log_level != "debug":
        # httpx logs every upstream request at info; our one line per request names the engines.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    tally = ConnectionTally(cap=settings.access.max_connections)
    try:
        # In the parent too: a bad config stops here.
        app = create_app(config, settings=settings, own_process=True, connections=tally)
    except ConfigurationError as exc:
        _fail(exc.message if exc.message.startswith("API keys:") else f"{config_path}: {exc.message}")
    isolated = (
        any(s.config.spec.router.cache_isolation != "off" for s in config.services)
        if isinstance(config, GatewayFile)
        else config.spec.router.cache_isolation != "off"
    )
    if not os.environ.get(CACHE_KEY_ENV) and isolated:
        logging.getLogger("tandem.router").warning(
            f"{CACHE_KEY_ENV} is not set: the tenants' cache salts use a key drawn for this process; "
            "other gateways in front of the same engines will not reuse its cache entries"
        )
    count = workers or (
        config.spec.workers if isinstance(config, GatewayFile) else config.spec.router.workers
    )
    if count > 1:
        plan = WorkerPlan(
            config_path=config_path,
            api_keys_file=api_keys_file,
            settings=settings,
            log_level=log_level,
            log_format=log_format,
        )
        raise SystemExit(_run_workers(plan, host=host, port=port, count=count))
    server = gateway_server(app, tally, settings=settings, log_level=log_level, host=host, port=port)
    if settings.access.metrics_port is None:
        server.run()
    else:
        server.run(sockets=listening(host, port, settings.access.metrics_port))
    if not server.started:
        raise SystemExit(1)  # uvicorn has logged why (e.g. the port is taken)


#: Where `tandem router` reads the key engines require (a Secret in a cluster; `tandem up` sets it).
ENGINE_KEY_ENV = "TANDEM_ENGINE_API_KEY"


def with_engine_key(settings: RouterSettings, environ: Mapping[str, str]) -> RouterSettings:
    """`settings` with the engine API key from `environ[ENGINE_KEY_ENV]` (unset or empty: none); the
    key is never a flag, where `ps` and the pod spec would show it."""
    key = environ.get(ENGINE_KEY_ENV) or None
    proxy = settings.proxy.model_copy(update={"engine_api_key": key})
    return settings.model_copy(update={"proxy": proxy})


#: Where `tandem router` reads the token of its diagnostics port (`--metrics-port`).
METRICS_TOKEN_ENV = "TANDEM_METRICS_TOKEN"


def with_metrics_token(settings: RouterSettings, environ: Mapping[str, str]) -> RouterSettings:
    """`settings` with the diagnostics port's token from `environ[METRICS_TOKEN_ENV]` (unset or
    empty: none, the port is open to whoever reaches it)."""
    token = SecretStr(environ.get(METRICS_TOKEN_ENV) or "")
    access = settings.access.model_copy(update={"metrics_token": token})
    return settings.model_copy(update={"access": access})


def listening(host: str, port: int, metrics_port: int) -> list[socket.socket]:
    """The client socket and the diagnostics socket, both listening; exits 1 with a one-line reason
    when one cannot be had."""
    out: list[socket.socket] = []
    for which, number in (("the client port", port), ("the diagnostics port", metrics_port)):
        try:
            out.append(bind(host, number, listen=True))
        except OSError as exc:
            for sock in out:
                sock.close()
            click.echo(f"tandem: error: cannot listen on {host}:{number} ({which}): {exc.strerror}", err=True)
            raise SystemExit(1) from None
    return out


#: Where `tandem router` reads the key of the tenants' cache salts (a Secret in a cluster).
CACHE_KEY_ENV = "TANDEM_CACHE_KEY"


def with_cache_key(settings: RouterSettings, environ: Mapping[str, str]) -> RouterSettings:
    """`settings` with the cache-salt key from `environ[CACHE_KEY_ENV]`; unset or empty: one drawn
    now, which this process's workers share (they get the settings). Gateways that do not share a
    key do not share their tenants' cache entries (`tandem router` warns)."""
    key = environ.get(CACHE_KEY_ENV) or secrets.token_urlsafe(32)
    access = settings.access.model_copy(update={"cache_key": SecretStr(key)})
    return settings.model_copy(update={"access": access})


def _run_workers(plan: WorkerPlan, *, host: str, port: int, count: int) -> int:
    """`count` workers on one socket (tandem.cli.router_workers); returns the exit code."""
    try:
        reserved = bind(host, port, listen=False)  # holds the address; the workers listen on it
    except OSError as exc:
        click.echo(f"tandem: error: cannot listen on {host}:{port}: {exc.strerror}", err=True)
        return 1
    metrics_port = plan.settings.access.metrics_port
    try:
        diagnostics = bind(host, metrics_port, listen=False) if metrics_port is not None else None
    except OSError as exc:
        reserved.close()
        click.echo(f"tandem: error: cannot listen on {host}:{metrics_port} (the diagnostics port): "
                   f"{exc.strerror}", err=True)  # fmt: skip
        return 1
    with reserved, diagnostics or contextlib.nullcontext():
        bound = int(reserved.getsockname()[1])
        logging.getLogger("tandem.router").info(
            "router workers", extra={"workers": count, "address": f"{host}:{bound}"}
        )
        return Supervisor(replace(plan, host=host, port=bound), count=count).run()
