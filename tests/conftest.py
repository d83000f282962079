"""Fixtures shared by every test package.

Test helpers import as `tests.<package>.<module>` (the names mypy gives them): `python -m pytest` has
the repository root on sys.path already, a bare `pytest` does not, so it is added here.

- `redis_server`: a real `redis-server` on a free 127.0.0.1 port for one test (an error when the
  binary is missing: `scripts/bootstrap.sh` installs it, and a skipped KV test would hide a gap);
  yields a `tests.servers.RedisServer` with `.url`, `.port` and `.client()`.
For uvicorn servers use `tests.servers.run_uvicorn(app)`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import RedisServer, run_redis_server

from tandem.local.binaries import find_redis_server


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    if find_redis_server() is None:
        pytest.fail("redis-server is not installed; run `bash scripts/bootstrap.sh`")
    with run_redis_server() as server:
        yield server
