"""LoRA adapters in the spec: sources, names, adapter_config.json, catalogs, and the rules with their
field paths (`check_rules`, `local_adapter_rules`, `cluster_adapter_rules`, `adapter_warnings`).

Real: the parsers, the rules, and adapter directories written to pytest's tmp_path (the local
filesystem is what these read). Nothing is faked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tandem.core.adapters import (
    AdapterError,
    HfSource,
    LocalSource,
    PvcSource,
    S3Source,
    engine_args,
    engine_env,
    link_adapters,
    name_problem,
    parse_source,
    read_adapter_config,
    scan_catalog,
)
from tandem.core.gateway import name_conflicts, service_names
from tandem.core.spec import LoraSpec
from tandem.core.specrules import (
    SpecError,
    SpecInvalid,
    adapter_warnings,
    cluster_adapter_rules,
    local_adapter_rules,
    parse_inference_service,
)


def document(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "demo"},
        "spec": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "qwen"}, **spec},
    }


def lora_doc(adapters: list[dict[str, str]] | None = None, **spec: Any) -> dict[str, Any]:
    spec.setdefault("engine", {"kind": "sim", "lora": {"maxLoras": 2, "maxRank": 16}})
    return document(adapters=adapters or [], **spec)


def errors_of(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecInvalid) as caught:
        parse_inference_service(doc)
    return [str(e) for e in caught.value.errors]


def adapter_dir(root: Path, name: str, **config: Any) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    body = {"peft_type": "LORA", "r": 8, "base_model_name_or_path": "Qwen/Qwen2.5-7B-Instruct"} | config
    (directory / "adapter_config.json").write_text(json.dumps(body))
    return directory


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("pvc://adapters/sql/v2", PvcSource("adapters", "sql/v2")),
        ("pvc://adapters", PvcSource("adapters", "")),
        ("pvc://adapters/", PvcSource("adapters", "")),
        ("hf://org/sql-lora", HfSource("org/sql-lora", None)),
        ("hf://org/sql-lora@v1.2", HfSource("org/sql-lora", "v1.2")),
        ("s3://my-bucket/loras/sql", S3Source("my-bucket", "loras/sql")),
        ("./adapters/sql", LocalSource("./adapters/sql")),
        ("/srv/adapters/sql", LocalSource("/srv/adapters/sql")),
    ],
)
def test_a_source_parses_into_its_typed_value(text: str, parsed: object) -> None:
    assert parse_source(text) == parsed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gs://bucket/x", "unknown scheme gs://"),
        ("pvc://Adapters/x", "not a PersistentVolumeClaim name"),
        ("pvc://adapters/../etc", "may not hold '.', '..' or '//'"),
        ("pvc://adapters/a//b", "may not hold"),
        ("hf://just-a-repo", "not a repository id org/repo"),
        ("hf://org/repo/extra", "not a repository id org/repo"),
        ("hf://org/repo@", "not a revision"),
        ("s3://UPPER/x", "not a bucket name"),
        ("", "non-empty"),
    ],
)
def test_a_bad_source_is_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(AdapterError, match=message.replace(".", r"\.").replace("/", "/")):
        parse_source(text)


@pytest.mark.parametrize("name", ["sql", "sql-v2", "Chat_FR.1", "a" * 128])
def test_a_single_path_component_names_an_adapter(name: str) -> None:
    assert name_problem(name) is None


@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b", "-x", "a b", "a" * 129, ""])
def test_anything_else_does_not(name: str) -> None:
    assert name_problem(name) is not None


def test_the_engines_get_vllms_flags_and_environment() -> None:
    assert engine_args(LoraSpec(max_loras=4, max_rank=64, max_cpu_loras=8)) == [
        "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--max-cpu-loras", "8",
    ]  # fmt: skip
    assert engine_args(LoraSpec()) == ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "16"]
    assert engine_env("/adapters") == {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_PLUGINS": "lora_filesystem_resolver",
        "VLLM_LORA_RESOLVER_CACHE_DIR": "/adapters",
    }


# ------------------------------------------------------------------------------- rules of the spec


def test_adapters_without_engine_lora_are_refused_at_engine_lora() -> None:
    doc = document(adapters=[{"name": "sql", "source": "pvc://loras/sql"}])
    assert errors_of(doc) == [
        "spec.engine.lora: is required when spec.adapters or spec.adapterCatalog is set (it sizes the "
        "engines' LoRA memory: maxLoras, maxRank)"
    ]
    assert errors_of(document(adapterCatalog={"source": "pvc://loras"}))[0].startswith("spec.engine.lora:")


def test_lora_alone_is_valid_and_absent_lora_is_off() -> None:
    spec = parse_inference_service(document(engine={"lora": {}})).spec
    assert spec.engine.lora == LoraSpec(max_loras=1, max_rank=16, max_cpu_loras=None)
    assert parse_inference_service(document()).spec.engine.lora is None


@pytest.mark.parametrize(
    ("lora", "error"),
    [
        ({"maxRank": 12}, "spec.engine.lora.maxRank: Input should be 1, 8, 16, 32, 64, 128, 256, 320 or 512"),
        ({"maxLoras": 0}, "spec.engine.lora.maxLoras: Input should be greater than or equal to 1"),
        (
            {"maxLoras": 4, "maxCpuLoras": 2},
            "spec.engine.lora.maxCpuLoras: must be >= spec.engine.lora.maxLoras (2 < 4)",
        ),
    ],
)
def test_lora_sizes_out_of_range_are_refused_with_their_field(lora: dict[str, int], error: str) -> None:
    assert errors_of(document(engine={"lora": lora})) == [error]


def test_adapter_names_must_be_unique_safe_and_not_the_models() -> None:
    doc = lora_doc(
        [
            {"name": "sql", "source": "pvc://loras/sql"},
            {"name": "sql", "source": "pvc://loras/sql2"},
            {"name": "qwen", "source": "pvc://loras/q"},
            {"name": "Qwen/Qwen2.5-7B-Instruct", "source": "pvc://loras/q"},
            {"name": "..", "source": "pvc://loras/dots"},
            {"name": "chat", "source": "gs://b/chat"},
        ]
    )
    errors = errors_of(doc)
    assert errors[:2] == [
        "spec.adapters[3].name: String should match pattern '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'",
        "spec.adapters[4].name: String should match pattern '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'",
    ]
    doc["spec"]["adapters"] = doc["spec"]["adapters"][:3] + doc["spec"]["adapters"][5:]
    doc["spec"]["model"]["servedName"] = "qwen"
    assert errors_of(doc) == [
        "spec.adapters[1].name: duplicate adapter 'sql'",
        "spec.adapters[2].name: 'qwen' is the model's name (spec.model.servedName)",
        "spec.adapters[3].source: unknown scheme gs://; use pvc://, hf://, s3:// or a local path",
    ]


def test_the_model_name_is_taken_too_when_a_served_name_is_set() -> None:
    doc = lora_doc([{"name": "plain", "source": "pvc://loras/p"}])
    doc["spec"]["model"] = {"name": "plain", "servedName": "qwen"}
    assert errors_of(doc) == ["spec.adapters[0].name: 'plain' is the model's name (spec.model.name)"]


def test_a_catalog_is_a_directory_not_a_repository() -> None:
    doc = lora_doc(adapterCatalog={"source": "hf://org/repo"})
    assert errors_of(doc) == ["spec.adapterCatalog.source: must be pvc://claim/path or a local directory"]


# ----------------------------------------------------------------------------- what local files say


def test_a_local_adapter_within_max_rank_is_valid_relative_to_the_files_folder(tmp_path: Path) -> None:
    adapter_dir(tmp_path / "adapters", "sql", r=16)
    spec = parse_inference_service(lora_doc([{"name": "sql", "source": "adapters/sql"}])).spec
    assert local_adapter_rules(spec, base=tmp_path) == []


def test_a_rank_above_max_rank_is_refused_naming_the_adapter_and_the_field(tmp_path: Path) -> None:
    adapter_dir(tmp_path, "sql", r=32)
    spec = parse_inference_service(lora_doc([{"name": "sql", "source": str(tmp_path / "sql")}])).spec
    assert local_adapter_rules(spec, base=Path("/elsewhere")) == [
        SpecError(
            "spec.adapters[0].source",
            "adapter 'sql': rank 32 (adapter_config.json r) is above spec.engine.lora.maxRank 16",
        )
    ]


def test_missing_and_unreadable_configs_are_refused_with_the_path(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "adapter_config.json").write_text("{not json")
    adapter_dir(tmp_path, "ia3", peft_type="IA3")
    doc = lora_doc(
        [
            {"name": "gone", "source": "gone"},
            {"name": "broken", "source": "broken"},
            {"name": "ia3", "source": "ia3"},
        ]
    )
    errors = local_adapter_rules(parse_inference_service(doc).spec, base=tmp_path)
    assert [e.path for e in errors] == [
        "spec.adapters[0].source",
        "spec.adapters[1].source",
        "spec.adapters[2].source",
    ]
    assert errors[0].message.startswith(f"adapter 'gone': cannot read {tmp_path}/gone/adapter_config.json")
    assert errors[1].message.startswith(
        f"adapter 'broken': {tmp_path}/broken/adapter_config.json is not JSON"
    )
    assert (
        errors[2].message
        == "adapter 'ia3': adapter_config.json peft_type is 'IA3'; the engines load only 'LORA'"
    )


def test_a_catalog_is_every_subdirectory_with_a_config_sorted(tmp_path: Path) -> None:
    for name in ("zeta", "alpha", "mid"):
        adapter_dir(tmp_path, name)
    (tmp_path / "no-config").mkdir()
    (tmp_path / "file.txt").write_text("x")
    adapter_dir(tmp_path, ".hidden")
    catalog = scan_catalog(tmp_path)
    assert list(catalog.adapters) == ["alpha", "mid", "zeta"]
    assert catalog.unsafe == (".hidden",)


def test_a_catalog_beyond_its_bound_is_refused(tmp_path: Path) -> None:
    for i in range(4):
        adapter_dir(tmp_path, f"a{i}")
    with pytest.raises(AdapterError, match="more than 3 entries"):
        scan_catalog(tmp_path, limit=3)


def test_a_local_catalogs_adapters_are_checked_like_declared_ones(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    adapter_dir(catalog, "good")
    adapter_dir(catalog, "big", r=64)
    adapter_dir(catalog, "sql")
    adapter_dir(catalog, "qwen")
    adapter_dir(catalog, ".odd")
    adapter_dir(tmp_path, "sql")
    doc = lora_doc([{"name": "sql", "source": "sql"}], adapterCatalog={"source": "catalog"})
    assert local_adapter_rules(parse_inference_service(doc).spec, base=tmp_path) == [
        SpecError("spec.adapterCatalog.source", "subdirectory '.odd' cannot name an adapter"),
        SpecError(
            "spec.adapterCatalog.source",
            "adapter 'big': rank 64 (adapter_config.json r) is above spec.engine.lora.maxRank 16",
        ),
        SpecError(
            "spec.adapterCatalog.source",
            "adapter 'qwen' of the catalog is already the model's or a declared adapter's name",
        ),
        SpecError(
            "spec.adapterCatalog.source",
            "adapter 'sql' of the catalog is already the model's or a declared adapter's name",
        ),
    ]


def test_an_unlistable_catalog_is_refused(tmp_path: Path) -> None:
    doc = lora_doc(adapterCatalog={"source": "nowhere"})
    [error] = local_adapter_rules(parse_inference_service(doc).spec, base=tmp_path)
    assert error.path == "spec.adapterCatalog.source"
    assert error.message.startswith(f"cannot list {tmp_path}/nowhere")


def test_a_config_reads_rank_base_and_type(tmp_path: Path) -> None:
    config = read_adapter_config(adapter_dir(tmp_path, "sql", r=32))
    assert (config.rank, config.base_model, config.peft_type) == (32, "Qwen/Qwen2.5-7B-Instruct", "LORA")
    with pytest.raises(AdapterError, match="r must be a positive integer"):
        read_adapter_config(adapter_dir(tmp_path, "neg", r=-1))


# ---------------------------------------------------------------------- cluster, warnings, gateway


def test_local_paths_are_refused_in_a_cluster_and_hf_s3_without_a_shared_cache_are_warned_about() -> None:
    doc = lora_doc(
        [
            {"name": "a", "source": "./a"},
            {"name": "b", "source": "pvc://loras/b"},
            {"name": "c", "source": "hf://org/c"},
            {"name": "d", "source": "s3://bucket/d"},
        ],
        adapterCatalog={"source": "/srv/catalog"},
    )
    spec = parse_inference_service(doc).spec
    assert [str(e) for e in cluster_adapter_rules(spec)] == [
        "spec.adapters[0].source: a local path works with tandem up only; in a cluster use pvc://, "
        "hf:// or s3://",
        "spec.adapterCatalog.source: a local directory works with tandem up only; in a cluster use "
        "pvc://claim/path",
    ]
    assert [e.path for e in adapter_warnings(spec)] == ["spec.adapters[2].source", "spec.adapters[3].source"]
    assert adapter_warnings(spec)[0].message == (
        "hf:// adapter 'c' is fetched by every engine pod on its own: set spec.adapterCache.pvc (a "
        "ReadWriteMany claim) to download it once"
    )
    shared = parse_inference_service(doc | {"spec": doc["spec"] | {"adapterCache": {"pvc": "loras"}}}).spec
    assert adapter_warnings(shared) == []


def test_adapter_names_are_names_a_service_serves_in_a_gateway() -> None:
    spec = parse_inference_service(lora_doc([{"name": "sql", "source": "pvc://loras/sql"}])).spec
    assert service_names(spec) == ("qwen", "sql")
    assert name_conflicts({"a": service_names(spec), "b": ("llama", "sql")}, []) == [
        "model name 'sql' is claimed by services a and b"
    ]
    assert name_conflicts({"a": service_names(spec), "b": "sql"}, []) == [
        "model name 'sql' is claimed by services a and b"
    ]
    assert name_conflicts({"a": "qwen", "b": "llama"}, []) == []  # the plain form, unchanged


def test_links_point_the_resolver_at_each_adapter_and_leave_mounted_ones(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    adapter_dir(catalog, "sql")
    adapter_dir(catalog, "chat")
    dest = tmp_path / "adapters"
    (dest / "chat").mkdir(parents=True)  # a declared adapter mounted here: it wins
    assert link_adapters(dest, scan_catalog(catalog).adapters) == ["sql"]
    assert (dest / "sql").resolve() == (catalog / "sql").resolve()
    assert (dest / "sql" / "adapter_config.json").is_file()
    assert link_adapters(dest, scan_catalog(catalog).adapters) == ["sql"]  # idempotent
