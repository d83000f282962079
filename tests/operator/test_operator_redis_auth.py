"""The managed Redis as `tandem render` renders it refuses clients without the generated password.

Real: `tandem render`'s Redis Deployment and generated Secret; its container's command and arguments
run with the real `sh` and redis-server on 127.0.0.1 (a free port and a temporary data directory
instead of the pod's, and `--bind 127.0.0.1` added so nothing listens beyond loopback), with the
environment Kubernetes would give it from the Secret; the pool's own client (`tandem.kvpool.client`).
Faked: the kubelet (the environment is filled in here).
"""

from __future__ import annotations

import base64
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from tests.operator.specs import example
from tests.servers import free_port, unretried_redis

from tandem.cli.render import render_documents
from tandem.kvpool.client import connect_sync, password_from_env
from tandem.local.binaries import find_redis_server
from tandem.operator.resources import Images


def rendered(tmp: Path) -> tuple[dict[str, Any], str]:  # the render's manifests are plain dicts
    """The Redis container of the rendered example, and the generated password."""
    path = tmp / "isvc.yaml"
    path.write_text(
        (Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-sim.yaml").read_text()
    )
    manifests = render_documents(path, images=Images(tandem="t", redis="redis"))
    name = example("local-sim.yaml")["metadata"]["name"]
    (secret,) = [m for m in manifests if m["kind"] == "Secret" and m["metadata"]["name"] == f"{name}-kv-auth"]
    (redis_deployment,) = [
        m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == f"{name}-kv"
    ]
    (container,) = redis_deployment["spec"]["template"]["spec"]["containers"]
    return container, base64.b64decode(secret["data"]["password"]).decode()


@pytest.fixture
def rendered_redis(tmp_path: Path) -> Iterator[tuple[int, str]]:
    binary = find_redis_server()
    if binary is None:
        pytest.fail("redis-server is not installed; run `bash scripts/bootstrap.sh`")
    container, password = rendered(tmp_path)
    port = free_port()
    args = list(container["args"])
    args[args.index("--port") + 1] = str(port)
    with tempfile.TemporaryDirectory(prefix="tandem-rendered-redis-") as data:
        args[args.index("--dir") + 1] = data
        env = {e["name"]: password for e in container["env"] if "valueFrom" in e}  # from the Secret
        env |= {"REDIS_DATA_DIR": data, "PATH": f"{Path(binary).parent}:{os.environ.get('PATH', '')}"}
        process = subprocess.Popen([*container["command"], *args, "--bind", "127.0.0.1"], env=env)
        try:
            deadline = time.monotonic() + 15
            with redis.Redis(port=port, password=password) as client:
                while True:
                    try:
                        client.ping()
                        break
                    except redis.ConnectionError:
                        assert process.poll() is None and time.monotonic() < deadline, "redis did not start"
                        time.sleep(0.05)
            yield port, password
        finally:
            process.terminate()
            process.wait(timeout=10)


def test_an_unauthenticated_client_is_refused_with_noauth(rendered_redis: tuple[int, str]) -> None:
    port, _ = rendered_redis
    with unretried_redis(port) as anonymous:
        with pytest.raises(redis.AuthenticationError, match=r"(?i)authenticat"):
            anonymous.get("any-tenant-chunk")
        with pytest.raises(redis.AuthenticationError):
            anonymous.flushall()


def test_the_pool_client_with_the_password_from_its_environment_works_and_protected_mode_is_on(
    rendered_redis: tuple[int, str],
) -> None:
    port, password = rendered_redis
    client = connect_sync(
        f"redis://127.0.0.1:{port}", password=password_from_env({"TANDEM_KVPOOL_PASSWORD": password})
    )
    try:
        client.set("k", b"v")
        assert client.get("k") == b"v"
        assert client.config_get("protected-mode") == {"protected-mode": "yes"}
    finally:
        client.close()
