"""`tandem router`: config files, exit codes and messages, and one real start-up as a process.

Real: config files on disk, click's in-process runner, and (last test) `python -m tandem.cli router`
as a child process on a free 127.0.0.1 port in front of a fake engine. Nothing else is faked.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from tests.router.harness import MODEL, Launcher, router_config
from tests.servers import free_port

from tandem.cli.main import cli
from tandem.cli.router import load_router_config
from tandem.cli.routerflags import FLAGS, settings_from_flags


def config_document(**overrides: Any) -> dict[str, Any]:
    document = router_config(decode=["http://127.0.0.1:8101"]).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    document.update(overrides)
    return document


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["router", *args])
    return result.exit_code, result.stderr


def write(tmp_path: Path, document: object, *, name: str = "router.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document) if name.endswith(".yaml") else json.dumps(document))
    return path


@pytest.mark.parametrize("name", ["router.yaml", "router.json"])
def test_a_config_file_may_be_yaml_or_json(tmp_path: Path, name: str) -> None:
    config = load_router_config(write(tmp_path, config_document(), name=name))
    assert config.spec.model.public_name == MODEL
    assert config.discovery.kind == "static"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param(
            config_document(discovery={"kind": "static"}),
            "discovery.decode: Field required",
            id="missing-field",
        ),
        pytest.param(
            config_document(discovery={"kind": "static", "decode": ["ftp://x"]}),
            "discovery.decode.0: String should match pattern",
            id="bad-url",
        ),
        pytest.param(config_document(colour="blue"), "colour: unknown field", id="unknown-field"),
        pytest.param(
            config_document(spec={**config_document()["spec"], "disaggregation": {"mode": "always"}}),
            "spec.prefill.replicas: disaggregation.mode 'always' needs at least one prefill replica",
            id="cross-field-rule",
        ),
        pytest.param(["not", "a", "mapping"], "expected a mapping", id="not-a-mapping"),
    ],
)
def test_an_invalid_config_exits_2_with_one_line_naming_the_field(
    tmp_path: Path, document: object, message: str
) -> None:
    path = write(tmp_path, document)
    code, err = run("--config", str(path))
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(f"tandem: error: {path}: ")
    assert message in err


def test_kubernetes_discovery_outside_a_cluster_needs_an_api_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    discovery = {
        "kind": "kubernetes",
        "namespace": "default",
        "prefillService": "demo-prefill",
        "decodeService": "demo-decode",
    }
    code, err = run("--config", str(write(tmp_path, config_document(discovery=discovery))))
    assert code == 2
    assert "kubernetes discovery: not in a cluster" in err
    assert "--kube-api-server" in err
    assert "--kube-api-server" in err


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    code, err = run("--config", str(tmp_path / "absent.yaml"))
    assert code == 2
    assert "cannot read" in err


def test_a_bad_tuning_flag_exits_2_naming_it(tmp_path: Path) -> None:
    code, err = run("--config", str(write(tmp_path, config_document())), "--prefill-timeout", "-1")
    assert code == 2
    assert err == "tandem: error: --prefill-timeout: Input should be greater than 0\n"


async def test_the_command_serves_the_gateway_with_json_logs(launcher: Launcher, tmp_path: Path) -> None:
    engine = await launcher.engine("d0")
    path = write(tmp_path, config_document(discovery={"kind": "static", "decode": [engine.url]}))
    port = free_port()
    argv = [sys.executable, "-m", "tandem.cli", "router", "--config", str(path), "--port", str(port)]
    process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
            for _ in range(300):  # up to about 30 s for the child to import and bind
                try:
                    if (await http.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
            response = await http.post("/v1/completions", json=body, headers={"x-request-id": "cli-1"})
        assert response.json()["choices"][0]["text"] == " d0-0"
    finally:
        process.terminate()
        _, stderr = await process.communicate()
    assert process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
    lines = [json.loads(line) for line in stderr.decode().splitlines()]
    [done] = [line for line in lines if line.get("request_id") == "cli-1"]  # one line per request
    assert (done["msg"], done["status"], done["logger"]) == ("request", 200, "tandem.router")
    assert done["decode_endpoint"] == engine.url.removeprefix("http://")


def test_admission_flags_reach_the_settings() -> None:
    values: dict[str, object] = {flag.dest: flag.default for flag in FLAGS}
    values.update(
        fairness="fcfs",
        max_in_flight_per_endpoint=4,
        max_waiting_per_endpoint=5,
        engine_capacity=8,
        lookahead=0.25,
        tenant_weight=("gold=2", "team=a=0.5"),
        kube_api_server="http://127.0.0.1:8001",
    )
    settings = settings_from_flags(values)
    admission = settings.admission
    assert (admission.fairness, admission.max_in_flight_per_endpoint, admission.max_kv_usage) == (
        "fcfs",
        4,
        None,  # off by default
    )
    assert (admission.max_waiting_per_endpoint, admission.engine_capacity, admission.lookahead) == (
        5,
        8,
        0.25,
    )
    assert admission.tenant_weights == {"gold": 2.0, "team=a": 0.5}
    assert settings.discovery.kube_api_server == "http://127.0.0.1:8001"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-kv-usage", "1.5"], "--max-kv-usage: Input should be less than or equal to 1"),
        (["--tenant-weight", "gold=0"], "--tenant-weight: Input should be greater than 0"),
        (["--max-in-flight-per-endpoint", "0"], "--max-in-flight-per-endpoint: Input should be greater"),
    ],
)
def test_bad_admission_flags_exit_2_naming_the_flag(tmp_path: Path, flags: list[str], message: str) -> None:
    code, err = run("--config", str(write(tmp_path, config_document())), *flags)
    assert code == 2
    assert err.startswith(f"tandem: error: {message}")


def test_an_off_able_flag_takes_a_number_or_off(tmp_path: Path) -> None:
    code, err = run("--config", str(write(tmp_path, config_document())), "--max-waiting-per-endpoint", "soon")
    assert code == 2 and "'soon' is not a number or 'off'" in err
