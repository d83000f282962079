"""`tandem up` with LoRA adapters: the engines' flags, environment and adapter folder in the local
plan, and the local adapters linked there by name.

Real: the pure plan (`build_plan`, ports a counter), `prepare_local_adapters` and
`tandem.local.catalog`'s follower on the shipped example's adapters and on folders in tmp_path, the router's
configuration resolution. Nothing is started; nothing is faked.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tandem.cli.adapters import prepare_local_adapters
from tandem.cli.documents import load_one
from tandem.cli.upadapters import follows
from tandem.core.adapternames import parse_names
from tandem.core.spec import AdapterCatalogSpec
from tandem.core.specrules import SpecInvalid
from tandem.local.catalog import CatalogFollower, catalog_follower
from tandem.local.fleet import build_fleet_plan
from tandem.local.plan import LocalCredentials, adapter_folder, adapter_names_path, build_plan
from tandem.local.vllm_engine import engine_command
from tandem.router.config import resolve
from tandem.router.settings import RouterSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "lora.yaml"
CREDENTIALS = LocalCredentials(redis_password="pw", engine_api_key="key")
LORA_FLAGS = ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "16", "--max-cpu-loras", "4"]


def test_every_engine_of_the_example_gets_the_lora_flags_env_and_folder(tmp_path: Path) -> None:
    plan = build_plan(
        load_one(EXAMPLE), ports=itertools.count(9000), router_port=8080, python="/py",
        redis_server="/usr/bin/redis-server", state_dir=tmp_path, credentials=CREDENTIALS,
    )  # fmt: skip
    engines = [p for p in plan.processes if p.role in ("prefill", "decode")]
    assert [e.name for e in engines] == ["prefill-0", "decode-0"]
    for engine in engines:
        at = engine.argv.index("--enable-lora")
        assert list(engine.argv[at : at + len(LORA_FLAGS)]) == LORA_FLAGS
        assert engine.env["VLLM_LORA_RESOLVER_CACHE_DIR"] == str(tmp_path / "adapters")
        assert engine.env["VLLM_PLUGINS"] == "lora_filesystem_resolver"
        assert engine.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
        assert tmp_path / "adapters" in engine.dirs
    [router] = [p for p in plan.processes if p.role == "router"]
    assert "VLLM_LORA_RESOLVER_CACHE_DIR" not in router.env


def test_real_vllm_locally_gets_the_same_flags() -> None:
    isvc = load_one(EXAMPLE)
    vllm = isvc.model_copy(
        update={
            "spec": isvc.spec.model_copy(
                update={"engine": isvc.spec.engine.model_copy(update={"kind": "vllm"})}
            )
        }
    )
    argv, _ = engine_command(vllm, role="decode", ordinal=0, port=9000, python="/py", pool_url="redis://x")
    at = argv.index("--enable-lora")
    assert list(argv[at : at + len(LORA_FLAGS)]) == LORA_FLAGS


def test_the_examples_catalog_is_linked_by_name_for_the_resolver(tmp_path: Path) -> None:
    dest = tmp_path / "adapters"
    assert prepare_local_adapters(load_one(EXAMPLE), base=EXAMPLE.parent, dest=dest) == []
    assert sorted(p.name for p in dest.iterdir()) == ["sql-lora", "summarize-lora"]
    config = json.loads((dest / "sql-lora" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["base_model_name_or_path"]) == ("LORA", "Qwen/Qwen2.5-7B-Instruct")


def test_declared_local_adapters_are_linked_and_others_are_skipped_with_a_line(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    text = EXAMPLE.read_text().replace(
        "  adapterCatalog:\n    source: adapters\n",
        "  adapters:\n"
        "    - {name: mine, source: mine}\n"
        "    - {name: hub, source: 'hf://org/hub'}\n"
        "    - {name: claimed, source: 'pvc://loras/claimed'}\n",
    )
    path = tmp_path / "lora.yaml"
    path.write_text(text)
    dest = tmp_path / "state" / "adapters"
    skipped = prepare_local_adapters(load_one(path), base=tmp_path, dest=dest)
    assert skipped == [
        "spec.adapters[1].source: adapter 'hub' is skipped here (the engine pods fetch it in a cluster); "
        "only local directories run locally",
        "spec.adapters[2].source: adapter 'claimed' is skipped here (for a cluster); only local "
        "directories run locally",
    ]
    assert [p.name for p in dest.iterdir()] == ["mine"]


def test_a_local_adapter_the_files_refuse_stops_before_anything_is_linked(tmp_path: Path) -> None:
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 64}))
    path = tmp_path / "lora.yaml"
    path.write_text(
        EXAMPLE.read_text().replace("source: adapters", "source: .").replace("maxRank: 16", "maxRank: 32")
    )
    with pytest.raises(SpecInvalid) as caught:
        prepare_local_adapters(load_one(path), base=tmp_path, dest=tmp_path / "dest")
    assert [str(e) for e in caught.value.errors] == [
        "spec.adapterCatalog.source: adapter 'big': rank 64 (adapter_config.json r) is above "
        "spec.engine.lora.maxRank 32"
    ]
    assert not (tmp_path / "dest").exists()


def test_the_router_config_lists_fixed_adapter_names_for_the_gateway(tmp_path: Path) -> None:
    isvc = load_one(EXAMPLE)
    names = ["sql-lora", "summarize-lora"]
    plan = build_plan(
        isvc, ports=itertools.count(9000), router_port=8080, python="/py",
        redis_server="/usr/bin/redis-server", state_dir=tmp_path, credentials=CREDENTIALS,
        catalog_adapters=names,
    )  # fmt: skip
    assert plan.router_config.adapter_names == names
    served = resolve(plan.router_config, RouterSettings(), environ={}).served_models
    assert {"sql-lora", "summarize-lora", "qwen"} <= served


def test_no_catalog_names_without_a_local_catalog_or_lora(tmp_path: Path) -> None:
    isvc = load_one(EXAMPLE)
    pvc = isvc.spec.model_copy(update={"adapter_catalog": AdapterCatalogSpec(source="pvc://loras/catalog")})
    missing = isvc.spec.model_copy(
        update={"adapter_catalog": AdapterCatalogSpec(source=str(tmp_path / "none"))}
    )
    no_lora = isvc.spec.model_copy(update={"engine": isvc.spec.engine.model_copy(update={"lora": None})})
    for spec in (pvc, no_lora):
        service = isvc.model_copy(update={"spec": spec})
        assert not follows(service, EXAMPLE.parent)
        assert (
            catalog_follower(service, base=EXAMPLE.parent, dest=tmp_path / "a", names_file=tmp_path / "n")
            is None
        )
    follower = catalog_follower(
        isvc.model_copy(update={"spec": missing}),
        base=EXAMPLE.parent,
        dest=tmp_path / "a",
        names_file=tmp_path / "n",
    )
    assert follower is not None and "cannot list" in follower.error
    assert parse_names((tmp_path / "n").read_text()) == (), "a catalog not there yet lists no names"


def write_adapter(root: Path, name: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))


def test_a_followed_catalog_reaches_the_adapter_folder_and_the_names_file_as_it_changes(
    tmp_path: Path,
) -> None:
    catalog, dest, names_file = tmp_path / "catalog", tmp_path / "state" / "adapters", tmp_path / "names.json"
    for name in ("a", "b", "sql", "qwen"):
        write_adapter(catalog, name)
    follower = CatalogFollower(
        catalog=catalog, dest=dest, names_file=names_file, keep=frozenset({"sql", "qwen"})
    )
    assert follower.step() == (("a", "b"), ())
    assert parse_names(names_file.read_text()) == ("a", "b"), "declared and model names are not the catalog's"
    assert sorted(p.name for p in dest.iterdir()) == ["a", "b"]
    assert follower.step() is None, "nothing changed"
    write_adapter(catalog, "c")
    (dest / "mine").mkdir()  # not a link into the catalog: left alone
    for path in (catalog / "a").iterdir():
        path.unlink()
    (catalog / "a").rmdir()
    assert follower.step() == (("c",), ("a",))
    assert parse_names(names_file.read_text()) == ("b", "c")
    assert sorted(p.name for p in dest.iterdir()) == ["b", "c", "mine"]
    assert (dest / "c" / "adapter_config.json").is_file(), "the engines' resolver finds it by name"
    catalog.rename(tmp_path / "gone")
    assert follower.step() is None and "cannot list" in follower.error
    assert parse_names(names_file.read_text()) == ("b", "c"), (
        "a catalog that cannot be listed changes nothing"
    )


def test_up_follows_the_examples_catalog_through_a_names_file(tmp_path: Path) -> None:
    isvc = load_one(EXAMPLE)
    plan = build_plan(
        isvc, ports=itertools.count(9000), router_port=8080, python="/py",
        redis_server="/usr/bin/redis-server", state_dir=tmp_path, credentials=CREDENTIALS,
        follow_catalog=True,
    )  # fmt: skip
    assert plan.router_config.adapter_names == []
    assert plan.router_config.adapter_names_file == str(adapter_names_path(tmp_path))
    dest = adapter_folder(isvc, tmp_path)
    assert dest is not None
    assert plan.router_config.adapter_load_dir == str(dest)  # the gateway copies hot adapters from it
    follower = catalog_follower(isvc, base=EXAMPLE.parent, dest=dest, names_file=adapter_names_path(tmp_path))
    assert follower is not None
    assert parse_names(adapter_names_path(tmp_path).read_text()) == ("sql-lora", "summarize-lora")
    config = resolve(plan.router_config, RouterSettings(), environ={})
    assert config.adapters == () and config.adapter_names_file == adapter_names_path(tmp_path)


def test_a_fleet_follows_each_services_catalog_through_its_own_names_file(tmp_path: Path) -> None:
    lora = load_one(EXAMPLE)
    other = lora.model_copy(
        update={"metadata": lora.metadata.model_copy(update={"name": "other"}),
                "spec": lora.spec.model_copy(update={"model": lora.spec.model.model_copy(
                    update={"name": "org/other", "served_name": "other"})})},
    )  # fmt: skip
    _, file = build_fleet_plan(
        [lora, other], gateway="fleet", spec=None, ports=itertools.count(9000), router_port=8080,
        python="/py", redis_server="/usr/bin/redis-server", state_dir=tmp_path, credentials=CREDENTIALS,
        follow_catalogs={"lora"},
    )  # fmt: skip
    configs = {s.name: s.config for s in file.services}
    assert configs["lora"].adapter_names_file == str(adapter_names_path(tmp_path / "lora"))
    assert configs["lora"].adapter_names == []
    assert configs["other"].adapter_names_file is None and configs["other"].adapter_names == []
