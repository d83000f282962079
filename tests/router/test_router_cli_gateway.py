"""`tandem router --config` with a gateway file (`kind: gateway`): one process, or two workers, in front
of two services.

Real: gateway files on disk, click's in-process runner, and `python -m tandem.cli router` as a child
process on a free 127.0.0.1 port. Faked: the engines (`fake_engine.FakeEngine`).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from tests.router.harness import Launcher
from tests.router.test_gateway_many_models import gateway_document, gateway_file
from tests.servers import free_port

from tandem.cli.main import cli
from tandem.cli.router import load_config
from tandem.core.gateway import GatewayFile


def document(**aliases: list[tuple[str, int]]) -> dict[str, Any]:
    return gateway_document(
        {"alpha": ("qwen", ["http://127.0.0.1:8101"]), "beta": ("llama", ["http://127.0.0.1:8102"])},
        aliases=aliases,
    )


def write(tmp_path: Path, content: object) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(content))
    return path


def test_a_gateway_file_is_read_as_one(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, document(chat=[("alpha", 9), ("beta", 1)])))
    assert isinstance(loaded, GatewayFile)
    assert [s.config.spec.model.public_name for s in loaded.services] == ["qwen", "llama"]


def _with(content: dict[str, Any], path: list[str | int], value: object) -> dict[str, Any]:
    node: Any = content
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return content


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(
            document(chat=[("gamma", 1)]),
            "alias 'chat' targets services not served: gamma",
            id="unknown-target",
        ),
        pytest.param(
            document(qwen=[("beta", 1)]), "alias 'qwen' is the model name of service alpha", id="alias-clash"
        ),
        pytest.param(
            _with(document(), ["services", 1, "config", "spec", "model", "servedName"], "qwen"),
            "model name 'qwen' is claimed by services alpha and beta",
            id="name-clash",
        ),
        pytest.param(
            _with(document(), ["services", 0, "config", "spec", "disaggregation", "mode"], "always"),
            "services[0].config.spec.prefill.replicas: disaggregation.mode 'always' needs",
            id="a-service's-rule",
        ),
        pytest.param(
            _with(document(), ["spec", "colour"], "blue"), "spec.colour: unknown field", id="unknown"
        ),
    ],
)
def test_an_invalid_gateway_file_exits_2_with_one_line(tmp_path: Path, content: object, message: str) -> None:
    path = write(tmp_path, content)
    result = CliRunner().invoke(cli, ["router", "--config", str(path)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"tandem: error: {path}: ")
    assert message in result.stderr


async def test_two_workers_serve_both_models_and_merge_their_metrics(
    launcher: Launcher, tmp_path: Path
) -> None:
    a, b = await launcher.engine("a0"), await launcher.engine("b0")
    file = gateway_file(
        {"alpha": ("qwen", [a.url]), "beta": ("llama", [b.url])}, aliases={"chat": [("beta", 1)]}
    )
    content = file.model_dump(by_alias=True, mode="json", exclude_none=True)
    content["spec"]["workers"] = 2
    port = free_port()
    argv = [sys.executable, "-m", "tandem.cli", "router", "--config", str(write(tmp_path, content))]
    argv += ["--port", str(port)]
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=20
        ) as http:
            for _ in range(300):  # up to about 30 s for the workers to import and bind
                try:
                    if (await http.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            answers = [
                (await http.post("/v1/completions", json={"model": m, "prompt": "x", "max_tokens": 1})).json()
                for m in ("qwen", "llama", "chat", "qwen")
            ]
            text = (await http.get("/metrics")).text
    finally:
        process.terminate()
        await process.communicate()
    assert [(x["model"], x["choices"][0]["text"]) for x in answers] == [
        ("qwen", " a0-0"),
        ("llama", " b0-0"),
        ("chat", " b0-0"),
        ("qwen", " a0-0"),
    ]
    served = {
        s.labels["model"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "tandem_router_requests_total" and "model" in s.labels
    }
    totals: dict[str, float] = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == "tandem_router_requests_total" and "model" in s.labels:
                assert "worker" in s.labels
                totals[s.labels["model"]] = totals.get(s.labels["model"], 0) + s.value
    assert set(served) == {"qwen", "llama"}
    assert totals == {"qwen": 2, "llama": 2}
