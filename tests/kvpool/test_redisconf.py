"""The pool's Redis configuration (`tandem.kvpool.redisconf`): arguments from the spec, and the
password-from-the-environment start-up script run for real.

Real: `sh` and `redis-server` started with exactly the command the operator puts in the Redis pod;
the test reads the server's /proc command line. Nothing is faked.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from tests.servers import free_port, unretried_redis

from tandem.core.spec import RedisSpec
from tandem.kvpool.redisconf import PoolRedisConfig, authenticated_command, pool_config, server_args
from tandem.local.binaries import find_redis_server


def test_the_spec_gives_maxmemory_in_bytes_and_the_policy() -> None:
    spec = RedisSpec.model_validate({"memory": "1536Mi", "evictionPolicy": "allkeys-lfu"})
    assert pool_config(spec) == PoolRedisConfig(1536 * 2**20, "allkeys-lfu")


def test_server_args_bound_memory_and_turn_persistence_off() -> None:
    args = server_args(PoolRedisConfig(2**30, "allkeys-lru"), port=7000, bind="127.0.0.1", data_dir="/d")
    assert args == [
        "--port", "7000", "--bind", "127.0.0.1", "--dir", "/d",
        "--maxmemory", "1073741824", "--maxmemory-policy", "allkeys-lru",
        "--save", "", "--appendonly", "no",
    ]  # fmt: skip
    assert server_args(PoolRedisConfig(1, "noeviction"), protected_mode=False)[-2:] == [
        "--protected-mode",
        "no",
    ]


@pytest.fixture
def authenticated_redis() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    binary = find_redis_server()
    if binary is None:
        pytest.fail("redis-server is not installed; run `bash scripts/bootstrap.sh`")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tandem-redis-auth-") as data:
        env = {
            **os.environ,
            "PATH": f"{Path(binary).parent}:{os.environ.get('PATH', '')}",
            "TANDEM_KVPOOL_PASSWORD": "pool-pass_1",
            "REDIS_DATA_DIR": data,
        }
        args = server_args(PoolRedisConfig(2**26, "allkeys-lru"), port=port, bind="127.0.0.1", data_dir=data)
        process = subprocess.Popen([*authenticated_command(), *args], env=env)
        try:
            yield port, process
        finally:
            process.terminate()
            process.wait(timeout=10)


def _ping(port: int, password: str | None, process: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 15
    with redis.Redis(port=port, password=password) as client:
        while True:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                assert process.poll() is None, "redis-server exited"
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)


def test_the_authenticated_command_requires_the_password_and_hides_it(
    authenticated_redis: tuple[int, subprocess.Popen[bytes]],
) -> None:
    port, process = authenticated_redis
    assert _ping(port, "pool-pass_1", process)
    with unretried_redis(port) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    with redis.Redis(port=port, password="pool-pass_1") as client:
        assert client.config_get("maxmemory") == {"maxmemory": str(2**26)}
    # `exec` replaced the shell: the server is the container's process, and its argv has no password.
    cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes()
    assert b"redis-server" in cmdline
    assert b"pool-pass_1" not in cmdline
