"""A password-protected pool, used by the simulator's producer role with the password only in
`TANDEM_KVPOOL_PASSWORD` (as the operator delivers it from a Secret), then read by `tandem kvpool stats`.

Real: redis-server on 127.0.0.1 with `requirepass`, the simulator app served by uvicorn and called
over HTTP, the CLI in-process. Faked: nothing; the environment variable is set for the test only.
"""

from __future__ import annotations

import httpx
import pytest
from click.testing import CliRunner
from tests.servers import RedisServer, run_uvicorn

from tandem.cli.main import cli
from tandem.sim.app import create_app
from tandem.sim.settings import SimSettings

PASSWORD = "pool-pass"


def test_the_simulator_writes_to_a_password_pool_with_the_password_from_the_environment(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with redis_server.client() as client:
        client.config_set("requirepass", PASSWORD)
    monkeypatch.setenv("TANDEM_KVPOOL_PASSWORD", PASSWORD)
    settings = SimSettings(
        profile="tiny-cpu", model="m", served_model_name="m", time_scale=1000, kv_role="producer",
        kv_pool=redis_server.url,
    )  # fmt: skip
    with run_uvicorn(create_app(settings)) as url:
        body = {"model": "m", "prompt": list(range(1, 600)), "max_tokens": 1}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
    result = CliRunner().invoke(cli, ["kvpool", "stats", "--url", redis_server.url, "--json"])
    assert result.exit_code == 0, result.output
    assert '"chunks": 2' in result.output  # 599 tokens: two full 256-token chunks
