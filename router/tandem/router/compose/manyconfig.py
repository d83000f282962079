"""What a gateway file (`tandem.core.gateway.GatewayFile`) configures for a gateway in front of many
services (`many`), resolved before anything is built: each service's effective configuration (the
gateway's settings in place of its own, its engines' key, its KV pool's variables), each one's
discovery, and the gateway's tracer."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tandem.core.gateway import GatewayFile, GatewayService, name_conflicts
from tandem.core.routerconfig import RouterConfig
from tandem.core.tracing import settings_from_env
from tandem.kvpool.client import PASSWORD_ENV, POOL_KEY_ENV
from tandem.router.config import EffectiveConfig, resolve
from tandem.router.discovery.sources import Discovery, discovery_for
from tandem.router.errors import ConfigurationError
from tandem.router.http.tracing import GatewayTracer
from tandem.router.settings import RouterSettings


def service_configs(file: GatewayFile, *, api_keys_file: str | None) -> list[RouterConfig]:
    """Each service's router config with the gateway's settings in place of its own (`many`'s module
    docstring), and the gateway's API key file."""
    gateway = file.spec
    out = []
    for service in file.services:
        config = service.config
        router = config.spec.router.model_copy(
            update={
                "auth": gateway.auth,
                "tenants": gateway.tenants,
                "rate_limits": gateway.rate_limits,
                "max_queue": gateway.max_queue,
                "replicas": gateway.replicas,
                "workers": gateway.workers,
            }
        )
        spec = config.spec.model_copy(update={"router": router})
        out.append(config.model_copy(update={"spec": spec, "api_keys_file": api_keys_file}))
    return out


def service_environ(environ: Mapping[str, str], service: GatewayService) -> dict[str, str]:
    """The environment one service's configuration is resolved in: its own pool key and Redis
    password from the variables its entry names (`poolKeyEnv`, `kvPoolPasswordEnv`), in place of
    the single-service ones; an entry that names none keeps those."""
    out = dict(environ)
    for base, named in ((POOL_KEY_ENV, service.pool_key_env), (PASSWORD_ENV, service.kv_pool_password_env)):
        if named is not None:
            out[base] = environ.get(named, "")
    return out


def service_settings(
    settings: RouterSettings, environ: Mapping[str, str], service: GatewayService
) -> RouterSettings:
    """`settings` with the key this service's engines require, from the variable its entry names
    (`engineApiKeyEnv`); an entry that names none keeps the process's (`TANDEM_ENGINE_API_KEY`)."""
    if service.engine_api_key_env is None:
        return settings
    proxy = settings.proxy.model_copy(
        update={"engine_api_key": environ.get(service.engine_api_key_env) or None}
    )
    return settings.model_copy(update={"proxy": proxy})


def resolve_services(
    file: GatewayFile, *, settings: RouterSettings, environ: Mapping[str, str], api_keys_file: str | None
) -> list[EffectiveConfig]:
    """Each service's effective configuration: the gateway's settings in place of its own
    (`service_configs`), its engines' key (`service_settings`), its KV pool's variables
    (`service_environ`). Raises `ConfigurationError` when two services, models or aliases share a
    name."""
    entries = zip(file.services, service_configs(file, api_keys_file=api_keys_file), strict=True)
    configs = [
        resolve(config, service_settings(settings, environ, entry), environ=service_environ(environ, entry))
        for entry, config in entries
    ]
    # The file checked its declared names; a catalog's (`adapterNames`) are first seen here.
    conflicts = name_conflicts(
        {c.service: (c.spec.model.public_name, *c.adapters) for c in configs}, file.spec.aliases
    )
    if conflicts:
        raise ConfigurationError("; ".join(conflicts))
    return configs


def service_discoveries(
    configs: Sequence[EffectiveConfig],
    *,
    given: Mapping[str, Discovery] | None,
    environ: Mapping[str, str],
    settings: RouterSettings,
) -> dict[str, Discovery]:
    """Each service's discovery by service name: the one `given` for it (tests), else the one its
    config names."""
    return {
        c.service: (given or {}).get(c.service)
        or discovery_for(c.discovery, environ=environ, kube_api_server=settings.discovery.kube_api_server)
        for c in configs
    }


def gateway_file_tracer(
    file: GatewayFile,
    configs: Sequence[EffectiveConfig],
    *,
    environ: Mapping[str, str],
    clock: Callable[[], float],
) -> GatewayTracer | None:
    """The gateway's tracer (`spec.tracing`, completed from the environment); None without tracing.
    It records prompts when any service logs them."""
    tracing = settings_from_env(file.spec.tracing, environ)
    if tracing is None:
        return None
    return GatewayTracer(
        tracing,
        service=f"{file.gateway}-gateway",
        clock=clock,
        log_prompts=any(c.log_prompts for c in configs),
    )
