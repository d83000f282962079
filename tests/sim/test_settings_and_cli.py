"""`SimSettings` validation and the `tandem sim` command.

Real: pydantic validation; click's in-process runner and parser; for the last two tests a real
`tandem sim` process on 127.0.0.1 called over HTTP and stopped with SIGTERM (the LoRA one serves an
adapter directory written to tmp_path). Nothing is faked.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from pydantic import ValidationError
from tests.servers import free_port, wait_healthy

from tandem.cli.main import cli
from tandem.cli.sim import build_settings
from tandem.cli.sim import sim as sim_command
from tandem.sim.settings import LoRAModule, SimSettings


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
        (["--enable-lora", "--max-lora-rank", "7"], "'7' is not one of '1', '8', '16'"),
        (["--enable-lora", "--max-loras", "0"], "--max-loras: Input should be greater than or equal to 1"),
        (
            ["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "1"],
            "max_cpu_loras (1) must be >= max_loras (2).",
        ),
        (["--lora-modules", "sql=/a"], "--lora-modules needs --enable-lora"),
        (
            ["--enable-lora", "--lora-modules", "{nope"],
            "--lora-modules: Invalid JSON format for --lora-modules: {nope",
        ),
    ],
)
def test_bad_flags_are_usage_errors_with_exit_code_2(args: list[str], words: str) -> None:
    result = CliRunner().invoke(cli, ["sim", "--profile", "tiny-cpu", *args])
    assert result.exit_code == 2
    assert words in result.stderr


def flags(*args: str) -> SimSettings:
    """The settings `tandem sim ARGS` would serve: click parses the command line, then the command's
    own build_settings validates it."""
    params = sim_command.make_context("sim", ["--profile", "tiny-cpu", *args]).params
    return build_settings(
        {k: v for k, v in params.items() if k not in ("host", "port", "log_level", "log_format")}
    )


def test_a_lora_module_that_does_not_load_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    args = ["sim", "--profile", "tiny-cpu", "--enable-lora", "--lora-modules", f"sql={missing}"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: Loading lora sql failed: No adapter found for {missing}"
    )


def test_lora_flags_reach_the_settings_with_every_module_kept() -> None:
    modules = ["sql=/a/sql", '{"name": "chat", "path": "/a/chat", "base_model_name": "tiny"}']
    settings = flags(
        "--enable-lora", "--max-loras", "3", "--max-lora-rank", "64", "--max-cpu-loras", "5",
        "--lora-modules", modules[0], "--lora-modules", modules[1],
    )  # fmt: skip
    assert (settings.enable_lora, settings.max_loras, settings.max_lora_rank, settings.max_cpu_loras) == (
        True, 3, 64, 5,
    )  # fmt: skip
    assert settings.lora_modules == (
        LoRAModule(name="sql", path="/a/sql"),
        LoRAModule(name="chat", path="/a/chat", base_model_name="tiny"),
    )


def test_lora_flags_default_to_vllms() -> None:
    settings = flags()
    assert (settings.enable_lora, settings.max_loras, settings.max_lora_rank) == (False, 1, 16)
    assert (settings.max_cpu_loras, settings.lora_modules) == (None, ())


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


def test_the_command_serves_its_lora_modules(tmp_path: Path) -> None:
    adapter = tmp_path / "sql"
    adapter.mkdir()
    config = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "peft_type": "LORA"}
    (adapter / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": "tiny"}))
    port = free_port()
    argv = [sys.executable, "-m", "tandem.cli", "sim", "--profile", "tiny-cpu", "--served-model-name", "qwen"]
    argv += ["--port", str(port), "--time-scale", "1000", "--enable-lora", "--max-loras", "2"]
    argv += ["--lora-modules", f"sql={adapter}"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process)
        cards = httpx.get(f"{url}/v1/models").json()["data"]
        body = {"model": "sql", "prompt": "hello", "max_tokens": 3}
        completion = httpx.post(f"{url}/v1/completions", json=body)
        metrics = httpx.get(f"{url}/metrics").text
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=20)
    assert [(c["id"], c["parent"]) for c in cards] == [("qwen", None), ("sql", "qwen")]
    assert cards[1]["root"] == str(adapter)
    assert (completion.status_code, completion.json()["model"]) == (200, "sql")
    assert 'max_lora="2"' in metrics and 'running_lora_adapters="sql"' in metrics
