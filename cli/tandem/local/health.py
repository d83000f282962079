"""One health check of a local component: Redis answers PING, an HTTP server answers its health URL.

Used by the supervisor (is a child ready?) and by `tandem status` (is it still up, and if not, why).
Only loopback URLs are probed here; every check is bounded by `timeout_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import redis


@dataclass(frozen=True)
class Health:
    """`ok` and a short reason a person can read: `PING`, `200`, `503`, `unreachable`."""

    ok: bool
    detail: str


def check(url: str, *, timeout_s: float = 0.5) -> Health:
    """PING for `redis://` URLs, else GET `url` (a full health URL such as `http://.../health`)."""
    if url.startswith("redis://"):
        return _ping(url, timeout_s=timeout_s)
    try:
        response = httpx.get(url, timeout=timeout_s, trust_env=False)
    except httpx.ConnectError:
        return Health(ok=False, detail="unreachable")
    except httpx.TimeoutException:
        return Health(ok=False, detail=f"no answer in {timeout_s:g}s")
    except httpx.HTTPError as exc:
        return Health(ok=False, detail=type(exc).__name__)
    return Health(ok=response.status_code == 200, detail=str(response.status_code))


def _ping(url: str, *, timeout_s: float) -> Health:
    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return Health(ok=bool(client.ping()), detail="PING")
    except redis.AuthenticationError:
        # NOAUTH: the pool is up and refuses anonymous clients, as it should (the local runtime's
        # Redis always has a password, which health checks do not need).
        return Health(ok=True, detail="PING (NOAUTH)")
    except redis.ConnectionError:
        return Health(ok=False, detail="unreachable")
    except redis.RedisError as exc:
        return Health(ok=False, detail=type(exc).__name__)
    finally:
        client.close()
