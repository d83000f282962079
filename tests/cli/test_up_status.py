"""The first minutes with `tandem up`, as a person meets them: the summary printed once the stack is
ready (every component, how to look again, a request to try with the model the stack serves),
`tandem status` while it runs, a second `tandem up` on the same state refused, and after Ctrl-C
(SIGINT) no state left and `tandem status` saying nothing runs.

Real: the `tandem` CLI in subprocesses, Redis, one prefill and one decode simulated engine and the
gateway as processes on 127.0.0.1, the request sent with httpx. Nothing is faked.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from tests.cli.upstack import Stack, running_up
from tests.servers import free_port

SPEC = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "first-hour"},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "chatty"},
        "engine": {"kind": "sim", "sim": {"profile": "tiny-cpu", "timeScale": 100}},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
    },
}


def tandem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_up(SPEC, tmp_path_factory.mktemp("first-hour")) as running:
        yield running


def test_the_ready_summary_offers_a_request_that_works(stack: Stack) -> None:
    output = stack.output
    header = next(i for i, line in enumerate(output) if line.startswith("component "))
    assert [line.split()[0] for line in output[header + 1 : header + 5]] == [
        "redis", "prefill-0", "decode-0", "router"
    ]  # fmt: skip
    assert all(" ok (" in line for line in output[header + 1 : header + 5])
    try_it = next(line for line in output if line.startswith("try it: "))
    argv = shlex.split(try_it.removeprefix("try it: "))
    assert argv[:2] == ["curl", "-s"]
    body = json.loads(argv[argv.index("-d") + 1])
    assert body["model"] == "chatty"
    answer = httpx.post(argv[2], json=body, timeout=30, trust_env=False)
    assert answer.status_code == 200, answer.text
    assert any("random words" in line and "docs/sim.md" in line for line in output)


def test_status_shows_the_running_stack_and_a_second_up_is_refused(stack: Stack) -> None:
    shown = tandem("status", "--state-dir", str(stack.state_dir))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].startswith("first-hour: ready, model 'chatty' at http://127.0.0.1:")
    second = tandem(
        "up", "-f", str(stack.spec), "--port", str(free_port()), "--state-dir", str(stack.state_dir)
    )
    assert second.returncode == 1
    assert second.stderr.startswith(
        f"tandem: error: first-hour already runs from {stack.state_dir} (tandem up pid {stack.process.pid}, "
    )


def test_after_ctrl_c_nothing_is_left_and_status_says_so(stack: Stack) -> None:
    stack.process.send_signal(signal.SIGINT)
    assert stack.process.wait(timeout=60) == 0
    assert not (stack.state_dir / "state.json").exists()
    after = tandem("status", "--state-dir", str(stack.state_dir))
    assert after.returncode == 1
    assert after.stderr.startswith(f"tandem: error: nothing is running from {stack.state_dir}")
