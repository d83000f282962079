"""`tandem up` of a spec with per-pool engine settings: each pool's engines run with the shared
arguments and environment plus their own, and what a local run cannot apply (a pool's pod template
and image) is named in one warning line while the stack starts anyway.

Real: the `tandem` CLI in a subprocess, Redis, one prefill and one decode simulated engine and the
gateway as processes on 127.0.0.1; the engines' real command lines and environments are read from
/proc through the pids `tandem up` records in its state file, their effect from the decode engine's
own /metrics (`vllm:cache_config_info` reports the `--num-gpu-blocks` it parsed), and a request goes
through the gateway (prefill then decode). Nothing is faked.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.cli.upstack import Stack, running_up

NODE_SELECTOR = {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H20"}}}
SPEC = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "per-pool"},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "chatty"},
        "engine": {
            "kind": "sim",
            "sim": {"profile": "tiny-cpu", "timeScale": 100},
            "args": ["--max-num-seqs", "64"],
            "env": [{"name": "TANDEM_TEST_SHARED", "value": "shared"}],
        },
        "prefill": {
            "replicas": 1,
            "engine": {
                "args": ["--max-num-batched-tokens", "1024"],
                "env": [{"name": "TANDEM_TEST_POOL", "value": "prefill"}],
            },
        },
        "decode": {
            "replicas": 1,
            "engine": {
                "image": "vllm/vllm-openai:decode",
                "args": ["--max-num-seqs", "8", "--num-gpu-blocks", "777"],
                "env": [
                    {"name": "TANDEM_TEST_POOL", "value": "decode"},
                    {"name": "TANDEM_TEST_SHARED", "value": "decode's own"},
                ],
            },
            "template": NODE_SELECTOR,
        },
    },
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_up(SPEC, tmp_path_factory.mktemp("per-pool")) as running:
        yield running


def component(stack: Stack, name: str) -> dict[str, str]:
    state = json.loads((stack.state_dir / "state.json").read_text(encoding="utf-8"))
    (found,) = [c for c in state["components"] if c["name"] == name]
    return dict(found)


def argv_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def env_of(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


def flag(argv: list[str], name: str) -> list[str]:
    """Every value given to `name`, in order (the engine's parser keeps the last)."""
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == name]


def test_what_cannot_apply_locally_is_one_warning_line(stack: Stack) -> None:
    warnings = [line for line in stack.output if "not applied locally" in line]
    assert warnings == [
        "warning: InferenceService per-pool: not applied locally (processes here, not pods): "
        "pod templates spec.decode.template; images spec.decode.engine.image"
    ]


def test_each_engine_runs_with_the_shared_settings_and_its_pools(stack: Stack) -> None:
    prefill = int(component(stack, "prefill-0")["pid"])
    decode = int(component(stack, "decode-0")["pid"])
    prefill_argv, decode_argv = argv_of(prefill), argv_of(decode)
    assert prefill_argv[1:4] == decode_argv[1:4] == ["-m", "tandem.cli", "sim"]
    assert flag(prefill_argv, "--max-num-batched-tokens") == ["1024"]
    assert flag(prefill_argv, "--max-num-seqs") == ["64"]
    assert flag(decode_argv, "--max-num-batched-tokens") == []
    assert flag(decode_argv, "--max-num-seqs") == ["64", "8"]  # shared, then decode's: 8 wins
    assert flag(decode_argv, "--num-gpu-blocks") == ["777"]
    prefill_env, decode_env = env_of(prefill), env_of(decode)
    assert (prefill_env["TANDEM_TEST_SHARED"], prefill_env["TANDEM_TEST_POOL"]) == ("shared", "prefill")
    assert (decode_env["TANDEM_TEST_SHARED"], decode_env["TANDEM_TEST_POOL"]) == ("decode's own", "decode")


def test_the_decode_engine_took_its_own_setting_and_requests_pass_both_pools(stack: Stack) -> None:
    blocks = {}
    for name in ("prefill-0", "decode-0"):
        page = httpx.get(component(stack, name)["metrics"], timeout=10, trust_env=False).text
        (info,) = [line for line in page.splitlines() if line.startswith("vllm:cache_config_info{")]
        blocks[name] = info.split('num_gpu_blocks="', 1)[1].split('"', 1)[0]
    assert blocks["decode-0"] == "777" and blocks["prefill-0"] != "777"
    endpoint = next(line for line in stack.output if line.startswith("endpoint: ")).removeprefix("endpoint: ")
    body = {"model": "chatty", "prompt": "hello " * 40, "max_tokens": 4}
    answer = httpx.post(f"{endpoint}/completions", json=body, timeout=30, trust_env=False)
    assert answer.status_code == 200, answer.text


def test_the_stack_stops_cleanly_with_exit_code_0(stack: Stack) -> None:
    stack.process.send_signal(signal.SIGINT)
    assert stack.process.wait(timeout=60) == 0
