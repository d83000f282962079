"""`tandem operator` and `tandem crd` as a user runs them.

Real: the click commands and settings validation. Faked: nothing; no test here reaches a cluster
(the operator is started only in the failure cases, which stop before any request).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.cli.main import cli
from tandem.operator.reference import reference_markdown


def test_tandem_crd_reference_prints_the_field_table() -> None:
    result = CliRunner().invoke(cli, ["crd", "--reference"])
    assert result.exit_code == 0
    assert result.output == reference_markdown()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--namespace", "Team_A"], "namespaces"),
        (["--resync-seconds", "0"], "resync_seconds"),
    ],
)
def test_invalid_operator_flags_are_refused_with_the_setting_named(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["operator", "--tandem-image", "tandem:test", *args])
    assert result.exit_code != 0
    assert message in result.output


def test_the_operator_needs_an_image_for_routers_and_simulated_engines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TANDEM_IMAGE", raising=False)
    result = CliRunner().invoke(cli, ["operator"])
    assert result.exit_code != 0
    assert "--tandem-image" in result.output


def test_the_operator_without_credentials_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    result = CliRunner().invoke(cli, ["operator", "--tandem-image", "tandem:test", "--log-format", "text"])
    assert result.exit_code != 0
    assert "no usable Kubernetes credentials" in result.output
