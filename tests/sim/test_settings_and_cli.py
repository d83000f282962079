"""`SimSettings` validation and the `tandem sim` command.

Real: pydantic validation; click's in-process runner; for the last test a real `tandem sim` process
on 127.0.0.1 called over HTTP and stopped with SIGTERM. Nothing is faked.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from pydantic import ValidationError
from tests.servers import free_port, wait_healthy

from tandem.cli.main import cli
from tandem.sim.settings import SimSettings


def test_unset_fields_come_from_the_profile() -> None:
    settings = SimSettings(profile="tiny-cpu")
    assert (settings.model, settings.served_model_name, settings.max_model_len) == ("tiny", "tiny", 2048)
    assert settings.total_gpu_blocks == 256
    seven_b = SimSettings(served_model_name="qwen")
    assert (seven_b.model, seven_b.served_model_name) == ("Qwen/Qwen2.5-7B-Instruct", "qwen")
    assert seven_b.total_gpu_blocks == 61_907


def test_settings_build_the_engine_and_pool_configuration() -> None:
    settings = SimSettings(
        profile="tiny-cpu",
        model="m",
        num_gpu_blocks=300,
        max_num_seqs=3,
        kv_chunk_size=64,
        kv_bytes_scale=0.5,
    )
    config = settings.engine_config()
    assert (config.num_gpu_blocks, config.scheduler.max_num_seqs) == (300, 3)
    layout = settings.pool_layout()
    assert (layout.model_name, layout.chunk_size, layout.payload_size) == ("m", 64, 64 * 1024 // 2)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        pytest.param({"profile": "nope"}, "unknown profile 'nope'", id="unknown-profile"),
        pytest.param({"kv_chunk_size": 300}, "multiple of --block-size (16)", id="chunk-not-multiple"),
        pytest.param({"kv_role": "consumer"}, "needs --kv-pool", id="role-without-pool"),
        pytest.param(
            {"kv_pool": "http://x:1", "kv_role": "both"}, "should match pattern", id="pool-not-redis"
        ),
        pytest.param({"num_gpu_blocks": 10}, "larger than the KV cache", id="context-beyond-cache"),
        pytest.param({"time_scale": 0}, "greater than 0", id="time-scale-zero"),
        pytest.param({"max_num_seqs": 0}, "greater than or equal to 1", id="no-sequences"),
        pytest.param({"served_model_name": ""}, "at least 1 character", id="empty-name"),
    ],
)
def test_bad_settings_are_refused_with_a_reason(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        SimSettings.model_validate({"profile": "tiny-cpu", **fields})


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        SimSettings(profile="tiny-cpu").time_scale = 2.0  # type: ignore[misc]


def test_list_profiles_prints_every_profile_and_exits_0() -> None:
    result = CliRunner().invoke(cli, ["sim", "--list-profiles"])
    assert result.exit_code == 0
    assert "qwen2.5-7b-h100" in result.stdout and "tiny-cpu" in result.stdout
    assert "57344" in result.stdout and "61907" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--kv-chunk-size", "100"], "--kv-chunk-size (100) must be a multiple of --block-size (16)"),
        (["--max-num-seqs", "0"], "--max-num-seqs: Input should be greater than or equal to 1"),
        (["--kv-role", "producer"], "--kv-role producer needs --kv-pool"),
        (["--profile", "nope"], "--profile: unknown profile 'nope'"),
        (["--kv-role", "sideways"], "'sideways' is not one of"),
    ],
)
def test_bad_flags_are_usage_errors_with_exit_code_2(args: list[str], words: str) -> None:
    result = CliRunner().invoke(cli, ["sim", "--profile", "tiny-cpu", *args])
    assert result.exit_code == 2
    assert words in result.stderr


def test_the_command_serves_until_sigterm() -> None:
    port = free_port()
    argv = [sys.executable, "-m", "tandem.cli", "sim", "--profile", "tiny-cpu", "--served-model-name", "qwen"]
    argv += ["--port", str(port), "--time-scale", "1000", "--log-format", "json"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process)
        response = httpx.post(
            f"{url}/v1/completions",
            json={"model": "qwen", "prompt": "hello", "max_tokens": 3},
            headers={"x-request-id": "cli-test-1"},
        )
        assert response.status_code == 200
        assert response.headers["x-request-id"] == "cli-test-1"
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    # uvicorn drains, runs the lifespan shutdown, then re-raises the signal it caught.
    assert process.returncode in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in output
    assert '"request_id":"cli-test-1"' in output and '"path":"/v1/completions"' in output
