"""`tandem status`: each component of a local stack with its URL, health and metrics endpoint, and an
exit code with one line saying what is wrong.

Real: a `redis-server` process, a simulated engine (the sim app served by uvicorn) on 127.0.0.1, a
port nothing listens on (a stopped engine), the state file as `tandem up` writes it, the command run
through click's runner. Faked: nothing; the state file's pid is this test's own (a live process) or
one that has exited.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from tests.cli.stacks import small_plan
from tests.servers import RedisServer, free_port, run_uvicorn

from tandem.cli.status import status
from tandem.local.state import STATE_FILE, Component, StackState, stack_state, write_state
from tandem.sim.app import create_app
from tandem.sim.settings import SimSettings


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    settings = SimSettings(profile="tiny-cpu", served_model_name="m", time_scale=1000)
    with run_uvicorn(create_app(settings)) as url:
        yield url


def http_component(name: str, role: str, url: str, *, pid: int | None = 1) -> Component:
    return Component(name=name, role=role, url=url, pid=pid, health=f"{url}/health", metrics=f"{url}/metrics")


def state_of(components: list[Component], *, pid: int | None = None, phase: str = "ready") -> StackState:
    return StackState.model_validate(
        {"name": "demo", "model": "m", "endpoint": "http://127.0.0.1:8080/v1", "pid": pid or os.getpid(),
         "phase": phase, "state_dir": "/state", "components": [c.model_dump() for c in components]}
    )  # fmt: skip


def run_status(*args: str) -> Result:
    return CliRunner().invoke(status, list(args))


def write(state_dir: Path, state: StackState) -> Path:
    write_state(state_dir / STATE_FILE, state)
    return state_dir


def test_a_running_stack_shows_every_component_up_and_exits_0(
    tmp_path: Path, redis_server: RedisServer, engine_url: str
) -> None:
    redis = Component(name="redis", role="kvpool", url=redis_server.url, pid=1, health=redis_server.url,
                      metrics=None)  # fmt: skip
    write(tmp_path, state_of([redis, http_component("decode-0", "decode", engine_url)]))
    result = run_status("--state-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    header, columns, redis_row, engine_row = result.stdout.splitlines()
    assert header == "demo: ready, model 'm' at http://127.0.0.1:8080/v1"
    assert columns.split() == ["component", "pid", "url", "health", "metrics"]
    assert redis_row.split() == ["redis", "1", redis_server.url, "ok", "(PING)", "tandem", "kvpool", "stats",
                                 "--url", redis_server.url]  # fmt: skip
    assert engine_row.split() == ["decode-0", "1", engine_url, "ok", "(GET", "/health)",
                                  f"{engine_url}/metrics"]  # fmt: skip


def test_a_component_that_does_not_answer_is_down_and_named_on_stderr(
    tmp_path: Path, engine_url: str
) -> None:
    gone = f"http://127.0.0.1:{free_port()}"
    write(tmp_path, state_of([http_component("decode-0", "decode", engine_url),
                              http_component("decode-1", "decode", gone)]))  # fmt: skip
    result = run_status("--state-dir", str(tmp_path))
    assert result.exit_code == 1
    rows = {line.split()[0]: line.split(maxsplit=3)[1:] for line in result.stdout.splitlines()[2:]}
    assert rows["decode-0"][2].startswith("ok (GET /health)")
    assert rows["decode-1"] == ["1", gone, f"down (GET /health: unreachable)  {gone}/metrics"]
    assert result.stderr == "tandem: error: demo: down: decode-1 (logs in /state/logs)\n"


def test_a_stack_still_starting_lists_what_is_not_started_yet(tmp_path: Path) -> None:
    starting = stack_state(small_plan(tmp_path), [], name="demo", pid=os.getpid(), phase="starting",
                           state_dir=tmp_path)  # fmt: skip
    write(tmp_path, starting)
    result = run_status("--state-dir", str(tmp_path))
    assert result.exit_code == 1
    assert [line.split()[0] for line in result.stdout.splitlines()[2:]] == [
        "redis", "prefill-0", "decode-0", "router"
    ]  # fmt: skip
    rows = result.stdout.splitlines()[2:]
    assert all(line.split()[1] == "-" and "not started" in line for line in rows)
    assert result.stderr == (
        "tandem: error: demo is still starting (not ready yet: redis, prefill-0, decode-0, router)\n"
    )


def test_json_output_carries_the_state_and_each_check(tmp_path: Path, engine_url: str) -> None:
    write(tmp_path, state_of([http_component("decode-0", "decode", engine_url)]))
    result = run_status("--state-dir", str(tmp_path), "--json")
    assert result.exit_code == 0
    assert '"checks": [' in result.stdout and '"detail": "200"' in result.stdout


def test_nothing_running_is_exit_1_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_status("--state-dir", str(tmp_path))
    assert result.exit_code == 1
    assert result.stderr == (
        f"tandem: error: nothing is running from {tmp_path}: no {tmp_path / STATE_FILE} "
        "(start it with `tandem up`)\n"
    )
    monkeypatch.chdir(tmp_path)
    bare = run_status()
    assert bare.exit_code == 1
    assert bare.stderr.startswith("tandem: error: nothing is running here: no .tandem/*/state.json")


def test_a_state_left_by_a_killed_tandem_up_is_reported_as_not_running(tmp_path: Path) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    write(tmp_path, state_of([], pid=finished.pid))
    result = run_status("--state-dir", str(tmp_path))
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"tandem: error: demo is not running: tandem up (pid {finished.pid}) has exited"
    )


def test_without_a_flag_the_one_stack_here_is_found_and_two_are_ambiguous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine_url: str
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / ".tandem" / "demo", state_of([http_component("decode-0", "decode", engine_url)]))
    assert run_status().exit_code == 0
    write(tmp_path / ".tandem" / "other", state_of([]))
    ambiguous = run_status()
    assert ambiguous.exit_code == 2
    assert ambiguous.stderr == (
        "tandem: error: several stacks run here (demo, other); pick one with -f FILE or --state-dir\n"
    )
