"""Every `tandem` failure reads the same: one `tandem: error: ...` line on stderr and a non-zero exit,
also when a command refuses its input file; a usage error keeps click's usage hint.

Real: the `tandem` group run through click's runner; nothing is started.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tandem.cli.main import cli


def test_a_missing_file_is_one_tandem_error_line(tmp_path: Path) -> None:
    missing = tmp_path / "nothere.yaml"
    result = CliRunner().invoke(cli, ["up", "-f", str(missing)])
    assert result.exit_code == 1
    assert result.stderr == f"tandem: error: cannot read {missing}: No such file or directory\n"


def test_a_file_that_is_not_an_inference_service_names_the_field(tmp_path: Path) -> None:
    spec = tmp_path / "isvc.yaml"
    spec.write_text("apiVersion: tandem.dev/v1alpha1\nkind: InferenceService\nmetadata: {name: x}\nspec: {}")
    result = CliRunner().invoke(cli, ["up", "-f", str(spec)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"tandem: error: {spec} is not a valid InferenceService: spec.model")


def test_a_usage_error_keeps_the_usage_hint() -> None:
    result = CliRunner().invoke(cli, ["up"], prog_name="tandem")
    assert result.exit_code == 2
    assert "Try 'tandem up --help' for help." in result.stderr
    assert "Missing option '-f'" in result.stderr
