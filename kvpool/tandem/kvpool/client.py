"""Redis clients for the KV pool, built one way everywhere: fail fast, and a password when there is one.

The password comes from the URL's userinfo (`redis://:secret@host:6379`) or is passed in; callers at the
application edge read it from an environment variable (`TANDEM_KVPOOL_PASSWORD` by default, filled from
a Kubernetes Secret in a cluster) with `password_from_env`, so that it never sits in a command line.
When both are given, the URL's wins (redis-py's rule).

The pool secret (`TANDEM_KV_POOL_KEY`, from the `<name>-cache-keys` Secret in a cluster) is read the
same way, by `pool_key_from_env`, into the 32-byte key of the keyed chunk hashes and tags
(`tandem.kvpool.keys.pool_key`).

Clients connect lazily (on first use) and reconnect on later commands. "Fail fast" means no retries and
`timeout_s` both to connect and per command: the pool is an optimisation, and a caller that waits on a
dead pool is worse off than one that recomputes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from tandem.kvpool.engine_config import PASSWORD_ENV, POOL_KEY_ENV
from tandem.kvpool.keys import pool_key

__all__ = [
    "PASSWORD_ENV",
    "POOL_ERRORS",
    "POOL_KEY_ENV",
    "connect",
    "connect_sync",
    "password_from_env",
    "pool_key_from_env",
    "redact_url",
]

#: What a pool operation may raise when the pool is unreachable, slow or refuses us.
POOL_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


def password_from_env(environ: Mapping[str, str], var: str = PASSWORD_ENV) -> str | None:
    """The password in `environ[var]`; None when unset or empty (an empty password means none)."""
    return environ.get(var) or None


def pool_key_from_env(environ: Mapping[str, str] | None = None, var: str = POOL_KEY_ENV) -> bytes | None:
    """The pool key derived from the secret in `environ[var]` (default: this process's environment);
    None when unset or empty (the pool is then unkeyed: chunk hashes anyone can compute, no tags)."""
    secret = (os.environ if environ is None else environ).get(var)
    return pool_key(secret) if secret else None


def redact_url(url: str) -> str:
    """`url` with any password replaced by `***`, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port is not None else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))


def connect(url: str, *, timeout_s: float = 2.0, password: str | None = None) -> AsyncRedis:
    """An asyncio client that fails fast (module docstring)."""
    extra: dict[str, Any] = {} if password is None else {"password": password}
    client: AsyncRedis = AsyncRedis.from_url(
        url,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=AsyncRetry(NoBackoff(), 0),
        **extra,
    )
    return client


def connect_sync(url: str, *, timeout_s: float = 2.0, password: str | None = None) -> redis.Redis:
    """A blocking client that fails fast, for the CLI and the metrics exporter."""
    extra: dict[str, Any] = {} if password is None else {"password": password}
    client: redis.Redis = redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        **extra,
    )
    return client
