"""`tandem.core.adaptersync`: the sidecar's passes over the adapter list, with a fake clock and a
fake download (writing a loadable adapter, or failing, per source), on tmp_path. The real command
and Hub: tests/cli/test_adapter_sync.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tandem.core.adapterfetch import FetchError, RemoteSource
from tandem.core.adapters import AdapterError
from tandem.core.adaptersync import AdapterSync, PassResult, list_document, parse_list

CONFIG = {"r": 8, "peft_type": "LORA", "base_model_name_or_path": "tiny"}


class Store:
    """Downloads by source (`failing`: those that fail), counting each."""

    def __init__(self) -> None:
        self.failing: set[str] = set()
        self.calls: list[str] = []

    def download(self, source: RemoteSource, directory: Path) -> str:
        key = repr(source)
        self.calls.append(key)
        if key in self.failing:
            raise FetchError(f"{key}: 503 Service Unavailable")
        (directory / "adapter_config.json").write_text(json.dumps(CONFIG))
        (directory / "adapter_model.safetensors").write_bytes(b"\0" * 8)
        return "rev1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, *, catalog: Path | None = None) -> tuple[AdapterSync, Store, Clock]:
    store, clock = Store(), Clock()
    sync = AdapterSync(
        cache=tmp_path / "cache",
        download=store.download,
        max_rank=16,
        clock=clock,
        catalog=catalog,
        retry_s=60,
    )
    (tmp_path / "cache").mkdir()
    return sync, store, clock


def test_a_failed_adapter_waits_for_retry_but_a_new_source_is_tried_at_once(tmp_path: Path) -> None:
    sync, store, clock = make(tmp_path)
    store.failing.add(repr(parse_list(list_document([("a", "hf://org/a")]))[0].parsed))
    first = sync.step(list_document([("a", "hf://org/a")]))
    assert first.failed == ("a",) and sync.report()["adapters"]["a"]["state"] == "Failed"
    assert "503 Service Unavailable" in sync.report()["adapters"]["a"]["reason"]
    clock.now = 59
    sync.step(list_document([("a", "hf://org/a")]))
    assert len(store.calls) == 1, "not before retry_s"
    sync.step(list_document([("a", "hf://org/a@v2")]))
    assert len(store.calls) == 2 and sync.report()["adapters"]["a"] == {
        "source": "hf://org/a@v2", "state": "Ready", "reason": "fetched", "revision": "rev1",
    }  # fmt: skip
    store.failing.clear()
    clock.now = 200
    sync.step(list_document([("a", "hf://org/a@v2")]))
    assert len(store.calls) == 2, "a ready adapter's marker is found: no download"


def test_a_catalog_is_followed_each_pass_and_a_listed_name_wins(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    for name in ("a", "c"):
        (catalog / name).mkdir(parents=True)
        (catalog / name / "adapter_config.json").write_text(json.dumps(CONFIG))
    sync, _, _ = make(tmp_path, catalog=catalog)
    result = sync.step(list_document([("a", "hf://org/a")]))
    assert result.linked == 1
    assert (sync.cache / "a").resolve().parent.name == ".fetched"  # the listed one
    assert (sync.cache / "c").resolve() == (catalog / "c").resolve()
    (catalog / "d").mkdir()
    (catalog / "d" / "adapter_config.json").write_text(json.dumps(CONFIG))
    sync.step(list_document([("a", "hf://org/a")]))
    assert (sync.cache / "d" / "adapter_config.json").is_file()
    (catalog / "c" / "adapter_config.json").unlink()
    (catalog / "c").rmdir()
    sync.step(list_document([("a", "hf://org/a")]))
    assert not (sync.cache / "c").is_symlink(), "an adapter that left the catalog is unlinked"
    assert (sync.cache / "a").is_symlink() and (sync.cache / "d").is_symlink()


def test_the_report_lists_every_catalog_name_and_keeps_them_while_the_catalog_cannot_be_read(
    tmp_path: Path,
) -> None:
    catalog = tmp_path / "catalog"
    for name in ("c", "a", "b"):
        (catalog / name).mkdir(parents=True)
        (catalog / name / "adapter_config.json").write_text(json.dumps(CONFIG))
    (catalog / "notes").mkdir()  # no adapter_config.json: not an adapter
    sync, _, _ = make(tmp_path, catalog=catalog)
    assert sync.report()["catalog"] is None, "not known before the first scan"
    sync.step(list_document([("a", "hf://org/a")]))
    report = sync.report()
    assert report["catalog"] == ["a", "b", "c"], "sorted, the one a listed name shadows too"
    assert set(report) == {"digest", "passes", "listError", "adapters", "catalog"}
    catalog.rename(tmp_path / "away")  # the claim's directory is briefly unreadable
    sync.step(list_document([("a", "hf://org/a")]))
    assert sync.report()["listError"].startswith(f"catalog {catalog}: cannot list")
    assert sync.report()["catalog"] == ["a", "b", "c"], "a failed scan keeps the last names"
    (tmp_path / "away").rename(catalog)
    (catalog / "b" / "adapter_config.json").unlink()
    sync.step(list_document([("a", "hf://org/a")]))
    assert sync.report()["catalog"] == ["a", "c"]


def test_without_a_catalog_the_report_lists_no_catalog_names(tmp_path: Path) -> None:
    sync, _, _ = make(tmp_path)
    sync.step(list_document([("a", "hf://org/a")]))
    assert sync.report()["catalog"] == []


def test_a_catalog_never_scanned_yet_is_reported_as_not_known_rather_than_empty(tmp_path: Path) -> None:
    sync, _, _ = make(tmp_path, catalog=tmp_path / "not-mounted-yet")
    sync.step(list_document([("a", "hf://org/a")]))
    assert sync.report()["listError"].startswith("catalog ")
    assert sync.report()["catalog"] is None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{oops", "adapters.json is not JSON"),
        ('{"other": []}', 'adapters.json has no "adapters" list'),
        ('{"adapters": [{"name": "a"}]}', 'adapters.json: every entry needs a string "name" and "source"'),
        ('{"adapters": [{"name": "../a", "source": "hf://o/a"}]}', "adapter name"),
        ('{"adapters": [{"name": "a", "source": "pvc://c/a"}]}', "only hf:// and s3:// sources"),
    ],
)
def test_a_list_it_cannot_read_changes_nothing_and_says_why(tmp_path: Path, text: str, error: str) -> None:
    sync, _, _ = make(tmp_path)
    sync.step(list_document([("a", "hf://org/a")]))
    with pytest.raises(AdapterError, match=None):
        parse_list(text)
    assert sync.step(text) == PassResult(), "nothing installed, removed or linked"
    assert error in sync.report()["listError"]
    assert (sync.cache / "a" / "adapter_config.json").is_file()
    assert sync.report()["adapters"]["a"]["state"] == "Ready", "the last readable list's report stays"


def test_a_pod_on_an_older_list_leaves_what_a_newer_list_installed_on_the_shared_cache(
    tmp_path: Path,
) -> None:
    pod_a, _, _ = make(tmp_path)
    pod_b = AdapterSync(cache=pod_a.cache, download=Store().download, max_rank=16, clock=Clock())
    old_list = list_document([("a", "hf://org/a")])
    new_list = list_document([("a", "hf://org/a"), ("x", "hf://org/x")])
    old_written = time.time() - 60  # the kubelet has not updated pod B's list yet
    pod_a.step(new_list, listed_at=time.time())
    assert (pod_a.cache / "x" / "adapter_config.json").is_file()
    assert pod_b.step(old_list, listed_at=old_written).removed == ()
    assert (pod_a.cache / "x" / "adapter_config.json").is_file(), "installed after pod B's list was written"
    assert pod_b.step(old_list, listed_at=time.time() + 1).removed == ("x",), (
        "a newer list without it removes it"
    )
    assert not (pod_a.cache / "x").exists()
    assert sorted(p.name.split("@")[0] for p in (pod_a.cache / ".fetched").iterdir() if p.is_dir()) == ["a"]
