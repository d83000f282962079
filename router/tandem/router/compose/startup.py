"""What a gateway loads from its configuration before it builds anything: its API key file and each
service's tokenizer, with errors that name the field to fix (a single service's `config` names
`apiKeysFile` and `tokenizerPath`; a gateway file, the field within its `services[...]`)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import httpx

from tandem.core.modeltokens import ModelTokenizer, TandemTokenizer
from tandem.core.tokenizer_files import TokenizerFilesError, load_tokenizer
from tandem.router.config import EffectiveConfig
from tandem.router.errors import ConfigurationError
from tandem.router.identity.auth.keyfile import KeyFile
from tandem.router.identity.auth.keys import KeyTableError
from tandem.router.settings import ProxySettings
from tandem.router.upstream.client import new_wire
from tandem.router.upstream.wire import Wire


def load_key_file(
    config: EffectiveConfig, *, auth_field: str = "spec.router.auth.enabled", source: str = "the config"
) -> KeyFile | None:
    """The API key file of `config` (None: auth off). Raises `ConfigurationError` when `auth_field`
    enables auth without a key file, or when the file cannot be read or parsed."""
    if config.api_keys_file is None:
        if config.spec.router.auth.enabled:
            raise ConfigurationError(
                f"{auth_field} is true but no API key file is configured "
                f"(apiKeysFile in {source}, or --api-keys-file)"
            )
        return None
    try:
        return KeyFile(config.api_keys_file, interval_s=config.settings.access.api_keys_reload_seconds)
    except KeyTableError as exc:
        raise ConfigurationError(f"API keys: {exc}") from None


def model_tokenizer(config: EffectiveConfig, *, field: str = "tokenizerPath") -> ModelTokenizer:
    """The model's tokenizer from `tokenizerPath`, else Tandem's (`tandem.router.config`'s docstring)."""
    if config.tokenizer_path is None:
        return TandemTokenizer()
    try:
        return load_tokenizer(config.tokenizer_path)
    except TokenizerFilesError as exc:
        raise ConfigurationError(f"{field}: {exc}") from None


async def engine_clients(stack: AsyncExitStack, proxy: ProxySettings) -> tuple[Wire, httpx.AsyncClient]:
    """The wire requests go to engines on, and the client the metrics collector reads the engines'
    /metrics with (its own, off the request path); both closed with `stack`."""
    wire = new_wire(proxy)
    stack.callback(wire.close)
    scrapes = await stack.enter_async_context(
        httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=64), trust_env=False)
    )
    return wire, scrapes
