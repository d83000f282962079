"""The commands the operator writes into pod templates are ones the Tandem CLI accepts.

Real: the `tandem` click group, parsing the exact argument lists the builders produce (`tandem sim`
for simulated engines, `tandem router` for the gateway, `tandem operator` from the chart). Faked:
nothing runs: click only parses and validates the arguments (the commands' bodies are not invoked).
"""

from __future__ import annotations

from typing import Any

import click
import helm_python as helm
import pytest
import yaml
from tests.operator.specs import IMAGES, OWNER, ROOT, sim

from tandem.cli.main import cli
from tandem.operator.resources import Role, desired_children


def parse(args: list[str]) -> dict[str, Any]:
    """Parse `tandem ARGS` down to the subcommand; its parameters as click resolved them."""
    name, *rest = args
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, f"tandem has no command {name!r}"
    with command.make_context(name, rest) as context:
        return dict(context.params)


def containers(role: Role) -> list[dict[str, Any]]:
    spec = sim(engine={"kind": "sim", "args": ["--max-num-seqs", "64"]})
    for child in desired_children(spec, owner=OWNER, images=IMAGES):
        labels = child.manifest["metadata"]["labels"]
        if child.ref.kind == "Deployment" and labels["tandem.dev/role"] == role.value:
            result: list[dict[str, Any]] = child.manifest["spec"]["template"]["spec"]["containers"]
            return result
    raise AssertionError(f"no Deployment for {role}")


@pytest.mark.parametrize(("role", "kv_role"), [(Role.PREFILL, "producer"), (Role.DECODE, "consumer")])
def test_simulated_engines_run_a_tandem_sim_command_line_that_parses(role: Role, kv_role: str) -> None:
    (container,) = containers(role)
    assert container["command"] == ["tandem"]
    params = parse(container["args"])
    assert params["kv_role"] == kv_role
    assert params["kv_pool"] == "redis://demo-kv:6379"
    assert (params["host"], params["port"]) == ("0.0.0.0", 8000)
    assert params["max_num_seqs"] == 64  # engine.args reach the engine


def test_the_router_runs_a_tandem_router_command_line_that_parses() -> None:
    (container,) = containers(Role.ROUTER)
    params = parse(container["args"])
    assert str(params["config_path"]) == "/etc/tandem/router.yaml"
    assert (params["host"], params["port"]) == ("0.0.0.0", 8080)


def test_the_charts_operator_command_line_parses() -> None:
    rendered = helm.Chart.load(ROOT / "charts" / "tandem").render(
        {"operator": {"watchNamespaces": ["a", "b"]}}, name="tandem", namespace="tandem-system"
    )
    deployment = yaml.safe_load(rendered["tandem/templates/operator-deployment.yaml"])
    params = parse(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    assert params["namespaces"] == ("a", "b")
    assert params["tandem_image"] == "ghcr.io/tandem-dev/tandem:0.1.0"
    assert params["liveness_endpoint"] == "http://0.0.0.0:8081/healthz"
