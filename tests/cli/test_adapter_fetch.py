"""`tandem adapters fetch`: hf:// and s3:// adapters installed into an adapter cache once each.

Real: the command (click's runner), `tandem.core.adapterfetch` on tmp_path, httpx against a fake
Hub (a `http.server` on 127.0.0.1 serving the two API paths the client uses, counting requests),
boto3 against moto's S3 server on 127.0.0.1. Nothing reaches the internet.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tandem.cli.adapters import adapters
from tandem.core.adapterfetch import (
    FETCHED_MARKER,
    Wanted,
    install,
    parse_failures,
    parse_wanted,
    prune,
    source_key,
)
from tandem.core.adapters import AdapterError, HfSource

CONFIG = {"r": 8, "peft_type": "LORA", "base_model_name_or_path": "tiny"}


def adapter_files(rank: int = 8, *, weights: bool = True) -> dict[str, bytes]:
    files = {"adapter_config.json": json.dumps(CONFIG | {"r": rank}).encode(), "README.md": b"# lora\n"}
    if weights:
        files["adapter_model.safetensors"] = b"\x00" * 64
    return files


@dataclass
class Hub:
    """A fake Hub: repos by id, each with revisions (name -> (sha, files)); private repos need the
    token; every request path is recorded."""

    repos: dict[str, dict[str, tuple[str, dict[str, bytes]]]] = field(default_factory=dict)
    private: set[str] = field(default_factory=set)
    token: str = "hf_secret"
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def downloads(self) -> list[str]:
        return [p for p in self.requests if "/resolve/" in p]


class HubHandler(BaseHTTPRequestHandler):
    """Serves `hub` (set on a subclass per test)."""

    hub: Hub

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.hub.requests.append(self.path)
        parts = self.path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "revision":
            found = self._revision(f"{parts[2]}/{parts[3]}", parts[5])
            if found is not None:
                sha, files = found
                body = {"sha": sha, "siblings": [{"rfilename": n} for n in sorted(files)]}
                self._send(200, json.dumps(body).encode())
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        else:
            self._send(404, b'{"error": "not found"}')

    def _file(self, repo: str, sha: str, name: str) -> None:
        for rev_sha, files in self.hub.repos.get(repo, {}).values():
            if rev_sha == sha and name in files and self._allowed(repo):
                self._send(200, files[name])
                return
        self._send(404, b'{"error": "not found"}')

    def _allowed(self, repo: str) -> bool:
        return repo not in self.hub.private or self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def _revision(self, repo: str, revision: str) -> tuple[str, dict[str, bytes]] | None:
        if repo in self.hub.repos and not self._allowed(repo):
            self._send(401, b'{"error": "unauthorized"}')
            return None
        found = self.hub.repos.get(repo, {}).get(revision)
        if found is None:
            self._send(404, b'{"error": "revision not found"}')
        return found

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def hub() -> Iterator[Hub]:
    state = Hub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (HubHandler,), {"hub": state}))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's S3 on 127.0.0.1, as `AWS_ENDPOINT_URL`; yields a boto3 client of it."""
    import boto3  # type: ignore[import-untyped]
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=endpoint)
    yield client
    server.stop()


def run(args: list[str], *, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(adapters, ["fetch", *args], env=env)


def fetch(cache: Path, hub: Hub, *wanted: str, token: str | None = None, max_rank: int = 16) -> Result:
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": token or ""}
    return run(["--dest", str(cache), "--max-rank", str(max_rank), *wanted], env=env)


def test_an_hf_adapter_is_downloaded_once_and_linked_by_name(tmp_path: Path, hub: Hub) -> None:
    hub.repos["org/sql"] = {"main": ("a" * 40, adapter_files() | {"checkpoint-5/adapter_model.bin": b"x"})}
    first = fetch(tmp_path, hub, "sql=hf://org/sql")
    assert first.exit_code == 0, first.output
    assert first.output == f"fetched sql {'a' * 40}\n"
    assert json.loads((tmp_path / "sql" / "adapter_config.json").read_text())["r"] == 8
    assert os.readlink(tmp_path / "sql").startswith(".fetched/sql@")
    marker = json.loads((tmp_path / "sql" / FETCHED_MARKER).read_text())
    assert marker == {"source": "hf://org/sql", "revision": "a" * 40}
    assert len(hub.downloads()) == 3, "the top-level files only"
    assert not (tmp_path / "sql" / "checkpoint-5").exists()

    again = fetch(tmp_path, hub, "sql=hf://org/sql")
    assert again.exit_code == 0, again.output
    assert again.output == f"cached sql {'a' * 40}\n"
    assert len(hub.downloads()) == 3, "an unchanged source is not downloaded again"


def test_a_changed_source_is_fetched_again_and_the_link_moves(tmp_path: Path, hub: Hub) -> None:
    hub.repos["org/sql"] = {"v1": ("1" * 40, adapter_files(8)), "v2": ("2" * 40, adapter_files(16))}
    assert fetch(tmp_path, hub, "sql=hf://org/sql@v1").exit_code == 0
    old = os.readlink(tmp_path / "sql")
    result = fetch(tmp_path, hub, "sql=hf://org/sql@v2", "--prune")
    assert result.output.splitlines()[0] == f"fetched sql {'2' * 40}"
    assert os.readlink(tmp_path / "sql") != old
    assert json.loads((tmp_path / "sql" / "adapter_config.json").read_text())["r"] == 16
    assert not (tmp_path / old).exists(), "--prune removes the version no longer linked"


@pytest.mark.parametrize(
    ("files", "why"),
    [
        (adapter_files(64), "rank 64 (adapter_config.json r) is above spec.engine.lora.maxRank 16"),
        (adapter_files(weights=False), "no weights file (adapter_model.safetensors or adapter_model.bin)"),
        ({"README.md": b"x"}, "no usable adapter_config.json"),
    ],
)
def test_a_download_that_is_not_a_loadable_adapter_is_refused_and_not_installed(
    tmp_path: Path, hub: Hub, files: dict[str, bytes], why: str
) -> None:
    hub.repos["org/bad"] = {"main": ("b" * 40, files)}
    result = fetch(tmp_path, hub, "bad=hf://org/bad")
    assert result.exit_code == 1
    assert why in parse_failures(result.output)["bad"]
    assert not (tmp_path / "bad").exists()
    assert [p.name for p in (tmp_path / ".fetched").iterdir()] == ["bad.lock"], "no temporary left"


def test_one_failing_adapter_does_not_stop_the_others(tmp_path: Path, hub: Hub) -> None:
    hub.repos["org/good"] = {"main": ("c" * 40, adapter_files())}
    result = fetch(tmp_path, hub, "gone=hf://org/missing", "good=hf://org/good")
    assert result.exit_code == 1
    assert parse_failures(result.output) == {
        "gone": "hf://org/missing: not found (HTTP 404): no such repository, revision or file"
    }
    assert (tmp_path / "good" / "adapter_model.safetensors").is_file()


def test_a_private_repository_needs_hf_token(tmp_path: Path, hub: Hub) -> None:
    hub.repos["org/private"] = {"main": ("d" * 40, adapter_files())}
    hub.private.add("org/private")
    denied = fetch(tmp_path, hub, "p=hf://org/private")
    assert parse_failures(denied.output) == {"p": "hf://org/private: access denied (HTTP 401); set HF_TOKEN"}
    allowed = fetch(tmp_path, hub, "p=hf://org/private", token=hub.token)
    assert allowed.exit_code == 0, allowed.output


def test_an_s3_prefix_is_downloaded_once(tmp_path: Path, s3: Any) -> None:
    s3.create_bucket(Bucket="loras")
    for name, body in adapter_files().items():
        s3.put_object(Bucket="loras", Key=f"team/chat/{name}", Body=body)
    s3.put_object(Bucket="loras", Key="team/chat-other/adapter_config.json", Body=b"{}")
    s3.put_object(Bucket="loras", Key="team/chat/checkpoint-5/adapter_model.bin", Body=b"x")
    first = run(["--dest", str(tmp_path), "--max-rank", "8", "chat=s3://loras/team/chat"])
    assert first.exit_code == 0, first.output
    assert first.output.startswith("fetched chat etags-")
    assert sorted(p.name for p in (tmp_path / "chat").iterdir()) == [
        FETCHED_MARKER, "README.md", "adapter_config.json", "adapter_model.safetensors"
    ]  # fmt: skip
    s3.delete_object(Bucket="loras", Key="team/chat/adapter_model.safetensors")
    again = run(["--dest", str(tmp_path), "--max-rank", "8", "chat=s3://loras/team/chat"])
    assert again.output.startswith("cached chat etags-"), "an unchanged source is not listed again"


def test_an_empty_or_missing_s3_location_fails_with_its_reason(tmp_path: Path, s3: Any) -> None:
    s3.create_bucket(Bucket="loras")
    result = run(["--dest", str(tmp_path), "--max-rank", "8", "a=s3://loras/none", "b=s3://nobucket/x"])
    assert result.exit_code == 1
    failures = parse_failures(result.output)
    assert failures["a"] == "s3://loras/none: no objects under this prefix"
    assert failures["b"].startswith("s3://nobucket/x: NoSuchBucket")


def test_pods_fetching_at_once_download_once(tmp_path: Path) -> None:
    calls: list[int] = []
    inside = threading.Event()
    release = threading.Event()

    def slow(source: Any, directory: Path) -> str:
        calls.append(1)
        inside.set()
        release.wait(30)
        for name, body in adapter_files().items():
            (directory / name).write_bytes(body)
        return "rev"

    wanted = parse_wanted(["x=hf://org/x"])[0]
    results: list[str] = []

    def worker() -> None:
        results.append(install(tmp_path, wanted, download=slow, max_rank=16).outcome)

    first = threading.Thread(target=worker)
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=worker)
    second.start()
    release.set()
    first.join(30)
    second.join(30)
    assert sorted(results) == ["cached", "fetched"]
    assert len(calls) == 1


def test_a_real_directory_under_the_name_is_not_replaced(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    wanted = Wanted("x", "hf://org/x", HfSource("org/x", None))
    with pytest.raises(AdapterError, match="not fetched by tandem"):
        install(tmp_path, wanted, download=lambda s, d: "never", max_rank=16)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sql"], "'sql': expected NAME=SOURCE"),
        (["../x=hf://o/r"], "is not an adapter name"),
        (["x=pvc://claim/p"], "only hf:// and s3:// sources are fetched"),
        (["x=hf://o/r", "x=s3://bucket/p"], "adapter 'x' is given twice"),
    ],
)
def test_arguments_it_cannot_read_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = run(["--dest", str(tmp_path), "--max-rank", "16", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_prune_leaves_what_it_did_not_fetch(tmp_path: Path, hub: Hub) -> None:
    hub.repos["org/a"] = {"main": ("e" * 40, adapter_files())}
    assert fetch(tmp_path, hub, "a=hf://org/a").exit_code == 0
    (tmp_path / "mounted").mkdir()
    result = fetch(tmp_path, hub, "--prune")
    assert result.exit_code == 0
    assert "removed 1 adapters no longer declared: a" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fetched", "mounted"]


def test_keep_going_exits_0_and_the_report_puts_failures_first(tmp_path: Path, hub: Hub) -> None:
    hub.repos["org/good"] = {"main": ("f" * 40, adapter_files())}
    report = tmp_path / "termination-log"
    cache = tmp_path / "cache"
    env = {"HF_ENDPOINT": hub.url}
    args = ["--dest", str(cache), "--max-rank", "16", "--keep-going", "--report", str(report)]
    result = run([*args, "good=hf://org/good", "gone=hf://org/gone"], env=env)
    assert result.exit_code == 0, result.output
    assert report.read_text().splitlines() == [
        "failed gone: hf://org/gone: not found (HTTP 404): no such repository, revision or file",
        f"fetched good {'f' * 40}",
    ]


def test_declared_adapters_win_over_the_catalogs_of_the_same_name(tmp_path: Path, hub: Hub) -> None:
    hub.repos["org/sql"] = {"main": ("9" * 40, adapter_files())}
    catalog = tmp_path / "catalog"
    for name in ("sql", "extra"):
        (catalog / name).mkdir(parents=True)
        (catalog / name / "adapter_config.json").write_text(json.dumps(CONFIG))
    cache = tmp_path / "cache"
    result = fetch(cache, hub, "--catalog", str(catalog), "sql=hf://org/sql")
    assert result.exit_code == 0, result.output
    assert os.readlink(cache / "sql").startswith(".fetched/sql@")
    assert Path(os.readlink(cache / "extra")) == (catalog / "extra").resolve()
    again = fetch(cache, hub, "--catalog", str(catalog), "--prune", "sql=hf://org/sql")
    assert again.exit_code == 0
    assert (cache / "extra").is_symlink(), "--prune leaves the catalog's links alone"


def test_a_download_left_by_a_crash_is_cleared_and_another_adapters_is_not(tmp_path: Path) -> None:
    versions = tmp_path / ".fetched"
    (versions / ".tmp-a@crashed").mkdir(parents=True)
    (versions / ".tmp-a-b@running").mkdir()

    def files(source: Any, directory: Path) -> str:
        for name, body in adapter_files().items():
            (directory / name).write_bytes(body)
        return "rev"

    install(tmp_path, parse_wanted(["a=hf://org/a"])[0], download=files, max_rank=16)
    prune(tmp_path, ["a"])
    assert sorted(p.name for p in versions.iterdir() if p.is_dir()) == [
        ".tmp-a-b@running", f"a@{source_key('hf://org/a')}"
    ]  # fmt: skip
