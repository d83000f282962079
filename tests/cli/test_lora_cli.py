"""LoRA adapters through the CLI: `tandem validate` reads local adapters and catalogs, `tandem render`
shows what the operator renders for claims and refuses local paths, `tandem adapters link` links a
catalog into the engines' adapter directory.

Real: the commands (click's in-process runner), adapter directories in tmp_path, the shipped
example and its adapters, kubernetes-validate's strict schemas. Nothing is faked; no cluster.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import yaml
from click.testing import CliRunner

from tandem.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "lora.yaml"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def service(tmp_path: Path, **spec: Any) -> Path:
    document = yaml.safe_load(EXAMPLE.read_text())
    del document["spec"]["adapterCatalog"]
    document["spec"] |= spec
    path = tmp_path / "lora.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def adapter(root: Path, name: str, rank: int) -> None:
    (root / name).mkdir(parents=True)
    config = {"peft_type": "LORA", "r": rank, "base_model_name_or_path": "Qwen/Qwen2.5-7B-Instruct"}
    (root / name / "adapter_config.json").write_text(json.dumps(config))


def test_the_example_is_valid_from_any_folder_and_names_its_catalog() -> None:
    code, out, err = run("validate", "-f", str(EXAMPLE))
    assert (code, err) == (0, "")
    assert out.strip().endswith("lora max 2 x rank 16, catalog adapters")


def test_a_local_adapter_of_too_high_a_rank_fails_validation_with_its_field(tmp_path: Path) -> None:
    adapter(tmp_path / "loras", "big", 32)
    path = service(tmp_path, adapters=[{"name": "big", "source": "loras/big"}])
    code, _, err = run("validate", "-f", str(path))
    assert code == 1
    assert err.strip() == (
        f"{path}: InferenceService lora: spec.adapters[0].source: adapter 'big': rank 32 "
        "(adapter_config.json r) is above spec.engine.lora.maxRank 16"
    )


def test_hf_adapters_without_a_shared_cache_are_valid_with_a_warning(tmp_path: Path) -> None:
    path = service(tmp_path, adapters=[{"name": "hub", "source": "hf://org/hub-lora@main"}])
    code, out, err = run("validate", "-f", str(path))
    assert code == 0
    assert out.startswith("valid: default/lora")
    assert err.strip() == (
        f"warning: {path}: InferenceService lora: spec.adapters[0].source: hf:// adapter 'hub' is "
        "fetched by every engine pod on its own: set spec.adapterCache.pvc (a ReadWriteMany claim) to "
        "download it once"
    )


def test_render_refuses_the_local_example_and_renders_claims(tmp_path: Path) -> None:
    code, _, err = run("render", "-f", str(EXAMPLE))
    assert code == 1
    assert "spec.adapterCatalog.source: a local directory works with tandem up only" in err
    path = service(
        tmp_path,
        adapters=[{"name": "sql", "source": "pvc://loras/sql"}],
        adapterCatalog={"source": "pvc://loras/catalog"},
    )
    code, out, err = run("render", "-f", str(path))
    assert (code, err) == (0, "")
    manifests = [d for d in yaml.safe_load_all(out) if d]
    for manifest in manifests:
        kubernetes_validate.validate(manifest, "1.30", strict=True)
    decode = next(m for m in manifests if (m["kind"], m["metadata"]["name"]) == ("Deployment", "lora-decode"))
    pod = decode["spec"]["template"]["spec"]
    assert "--enable-lora" in pod["containers"][0]["args"]
    assert [c["name"] for c in pod["initContainers"]] == ["adapters-sync"]
    assert {"name": "adapters", "emptyDir": {}} in pod["volumes"]


def test_adapters_link_links_a_catalog_and_skips_unsafe_names(tmp_path: Path) -> None:
    adapter(tmp_path / "catalog", "sql", 8)
    adapter(tmp_path / "catalog", ".odd", 8)
    dest = tmp_path / "adapters"
    code, out, err = run("adapters", "link", "--catalog", str(tmp_path / "catalog"), "--dest", str(dest))
    assert code == 0
    assert out.strip() == f"linked 1 adapters into {dest}: sql"
    assert err.strip() == f"skipped {tmp_path / 'catalog' / '.odd'}: not an adapter name"
    assert json.loads((dest / "sql" / "adapter_config.json").read_text())["r"] == 8


def test_adapters_link_fails_on_a_catalog_it_cannot_list(tmp_path: Path) -> None:
    code, _, err = run("adapters", "link", "--catalog", str(tmp_path / "none"), "--dest", str(tmp_path / "d"))
    assert code == 1
    assert err.startswith(f"tandem: error: cannot list {tmp_path / 'none'}")
