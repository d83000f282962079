"""`tandem kvpool stats|flush|exporter` against a real Redis.

Real: a redis-server on 127.0.0.1; the exporter runs as a real `tandem` process and is scraped over
HTTP. The stats and flush commands run in-process through click's runner.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
from click.testing import CliRunner
from tests.kvpool.pool import CHUNK, prompt, store_prompt
from tests.servers import RedisServer, free_port

from tandem.cli.main import cli


def test_stats_prints_a_table_of_chunks_per_model(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(3 * CHUNK))
    result = CliRunner().invoke(cli, ["kvpool", "stats", "--url", redis_server.url])
    assert result.exit_code == 0, result.output
    assert f"KV pool {redis_server.url}" in result.output
    row = next(line for line in result.output.splitlines() if line.startswith("qwen"))
    assert row.split()[1:4] == ["3", "0", "0"]


def test_stats_json_has_memory_models_and_keyspace(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(2 * CHUNK))
    result = CliRunner().invoke(cli, ["kvpool", "stats", "--url", redis_server.url, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["models"]["qwen"]["chunks"] == 2
    assert document["memory"]["used_bytes"] > 0
    assert set(document["keyspace"]) == {"hits", "misses", "hit_ratio", "keys"}


def test_the_password_comes_from_the_named_environment_variable(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        client.config_set("requirepass", "s3cret")
    runner = CliRunner()
    denied = runner.invoke(cli, ["kvpool", "stats", "--url", redis_server.url])
    allowed = runner.invoke(
        cli,
        ["kvpool", "stats", "--url", redis_server.url, "--password-env", "POOL_PW"],
        env={"POOL_PW": "s3cret"},
    )
    assert denied.exit_code == 1
    assert allowed.exit_code == 0, allowed.output


def test_an_unreachable_pool_is_one_error_line_and_exit_1() -> None:
    url = f"redis://:hidden@127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["kvpool", "stats", "--url", url, "--timeout", "1"])
    assert result.exit_code == 1
    assert result.output.startswith("tandem: error: cannot reach the KV pool at redis://:***@127.0.0.1:")
    assert "hidden" not in result.output


def test_flush_deletes_one_model_and_prints_the_count(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(4 * CHUNK))
        store_prompt(client, "llama", prompt(CHUNK))
        result = CliRunner().invoke(
            cli, ["kvpool", "flush", "--url", redis_server.url, "--model", "qwen", "--yes"]
        )
        assert result.exit_code == 0, result.output
        assert result.output.strip() == "flushed 4 chunks (8 keys) of model 'qwen'"
        assert client.dbsize() == 2


def test_flush_without_yes_asks_and_a_no_keeps_everything(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(CHUNK))
        result = CliRunner().invoke(
            cli, ["kvpool", "flush", "--url", redis_server.url, "--model", "qwen"], input="n\n"
        )
        assert result.exit_code == 1
        assert client.dbsize() == 2


def test_the_exporter_serves_pool_metrics(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(2 * CHUNK))
    argv = [
        sys.executable,
        "-m",
        "tandem.cli",
        "kvpool",
        "exporter",
        "--url",
        redis_server.url,
        "--port",
        "0",
    ]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # "serving KV pool metrics of ... at http://127.0.0.1:PORT/metrics"
        assert line.startswith("serving KV pool metrics"), line
        metrics_url = line.rsplit(" ", 1)[1].strip()
        deadline = time.monotonic() + 30
        while True:
            try:
                text = httpx.get(metrics_url).text
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert 'tandem_kvpool_chunks{model="qwen"} 2.0' in text
        assert "tandem_kvpool_up 1.0" in text
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
