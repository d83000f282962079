"""`tandem validate`: exit codes and messages, through click's in-process runner on real files."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tandem.cli.main import cli

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "local-sim.yaml"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_a_valid_file_prints_a_one_line_summary() -> None:
    code, out, _ = run("validate", "-f", str(EXAMPLE))
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("valid: default/demo: model qwen on sim, prefill 1 x decode 2")


def test_a_broken_copy_names_each_broken_field_and_exits_1(tmp_path: Path) -> None:
    broken = EXAMPLE.read_text().replace("replicas: 2", "replicas: zero").replace("kind: sim", "kind: tgi")
    path = tmp_path / "broken.yaml"
    path.write_text(broken)
    code, _, err = run("validate", "-f", str(path))
    assert code == 1
    assert f"{path}: spec.decode.replicas:" in err
    assert f"{path}: spec.engine.kind:" in err


def test_a_cross_field_error_is_reported_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "rule.yaml"
    path.write_text(EXAMPLE.read_text().replace("chunkSize: 256", "chunkSize: 250"))
    code, _, err = run("validate", "-f", str(path))
    assert code == 1
    assert "spec.kvPool.chunkSize: must be a multiple of the engine block size 16" in err


def test_errors_in_a_multi_document_file_carry_the_document_index(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    path = tmp_path / "two.yaml"
    path.write_text(text + "\n---\n" + text.replace("name: demo", "name: Bad_Name"))
    code, _, err = run("validate", "-f", str(path))
    assert code == 1
    assert "[1].metadata.name" in err


def test_invalid_yaml_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("spec: [unclosed")
    code, _, err = run("validate", "-f", str(path))
    assert code == 1
    assert "not valid YAML" in err
    assert len(err.strip().splitlines()) == 1


def test_a_missing_file_is_reported(tmp_path: Path) -> None:
    code, _, err = run("validate", "-f", str(tmp_path / "nope.yaml"))
    assert code == 1
    assert "cannot read" in err


def test_help_lists_the_subcommands() -> None:
    code, out, _ = run("--help")
    assert code == 0
    for command in ("validate", "up"):
        assert command in out
