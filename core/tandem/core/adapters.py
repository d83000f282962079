"""LoRA adapters: where their files are (`parse_source`), their names, their `adapter_config.json`, a
catalog directory of them, and the directory the engines' filesystem resolver reads.

Sources (`spec.adapters[].source`, `spec.adapterCatalog.source`):

- `pvc://claim/path`: a directory in a PersistentVolumeClaim (mounted read-only into the engines);
- `hf://org/repo[@revision]`: a Hugging Face repository, and
- `s3://bucket/prefix`: an S3 prefix, both downloaded into the engines' adapter directory by
  `tandem adapters fetch` (`tandem.core.adapterfetch`; in a cluster, the engine pods' init container);
- anything without a scheme: a local directory, for `tandem up` and `tandem validate` (relative paths
  are relative to the YAML file's directory).

Names: an adapter is served under its name, and the engines find it as the directory `<dir>/<name>`
(vLLM's `lora_filesystem_resolver` looks up `$VLLM_LORA_RESOLVER_CACHE_DIR/<model>`), so a name is one
path component: `[A-Za-z0-9][A-Za-z0-9._-]{0,127}` (never `.`, `..`, nor anything with `/`).

The readers here touch only the local filesystem, bounded (a config of at most 1 MiB, a catalog of
at most `MAX_CATALOG_ENTRIES` subdirectories) and deterministic (sorted by name).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from tandem.core.spec import ADAPTER_NAME_PATTERN, LoraSpec

#: The file every adapter directory holds (PEFT's); its `r` is the rank.
ADAPTER_CONFIG = "adapter_config.json"
#: Most subdirectories a catalog may have (each one is looked at once per scan).
MAX_CATALOG_ENTRIES = 10_000
#: Largest `adapter_config.json` read (PEFT's are a few hundred bytes).
MAX_CONFIG_BYTES = 1 << 20
#: vLLM's environment for adapters: the runtime load/unload API, and the filesystem resolver, which
#: serves a request for an unknown `model` from `$VLLM_LORA_RESOLVER_CACHE_DIR/<model>` when its
#: adapter_config.json says `peft_type: LORA` and `base_model_name_or_path` equal to the engine's
#: model argument (`vllm/plugins/lora_resolvers/filesystem_resolver.py`).
RUNTIME_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
PLUGINS_ENV = "VLLM_PLUGINS"
RESOLVER_DIR_ENV = "VLLM_LORA_RESOLVER_CACHE_DIR"
FILESYSTEM_RESOLVER = "lora_filesystem_resolver"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HF_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_NAME = re.compile(ADAPTER_NAME_PATTERN)


class AdapterError(ValueError):
    """A source that cannot be parsed, or an adapter directory or catalog that cannot be read; the
    message says which and why."""


@dataclass(frozen=True)
class LocalSource:
    """A directory on this machine (as written: relative paths are resolved by the caller)."""

    path: str


@dataclass(frozen=True)
class PvcSource:
    """`pvc://claim/path`: `path` is relative to the claim's root ('' for the root itself)."""

    claim: str
    path: str


@dataclass(frozen=True)
class HfSource:
    """`hf://org/repo[@revision]`."""

    repo: str
    revision: str | None


@dataclass(frozen=True)
class S3Source:
    """`s3://bucket/prefix` (`prefix` may be '')."""

    bucket: str
    prefix: str


AdapterSource = LocalSource | PvcSource | HfSource | S3Source


def parse_source(text: str) -> AdapterSource:
    """The typed source of `text`; raises `AdapterError` saying what is wrong.

    >>> parse_source("pvc://adapters/sql/v2")
    PvcSource(claim='adapters', path='sql/v2')
    >>> parse_source("hf://org/repo@main")
    HfSource(repo='org/repo', revision='main')
    """
    if not text or "\x00" in text:
        raise AdapterError("must be a non-empty path or URI")
    match = _SCHEME.match(text)
    if match is None:
        return LocalSource(text)
    scheme, rest = match.group(1), text[match.end() :]
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if not _DNS_LABEL.match(claim):
            raise AdapterError(f"pvc://: {claim!r} is not a PersistentVolumeClaim name (a DNS label)")
        return PvcSource(claim, _relative(path, what="pvc://"))
    if scheme == "hf":
        repo, at, revision = rest.partition("@")
        parts = repo.split("/")
        if len(parts) != 2 or not all(_HF_PART.match(p) for p in parts):
            raise AdapterError(f"hf://: {repo!r} is not a repository id org/repo")
        if at and (not _HF_REVISION.match(revision) or ".." in revision.split("/")):
            raise AdapterError(f"hf://: {revision!r} is not a revision (branch, tag or commit)")
        return HfSource(repo, revision if at else None)
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not _S3_BUCKET.match(bucket):
            raise AdapterError(f"s3://: {bucket!r} is not a bucket name")
        return S3Source(bucket, _relative(prefix, what="s3://"))
    raise AdapterError(f"unknown scheme {scheme}://; use pvc://, hf://, s3:// or a local path")


def _relative(path: str, *, what: str) -> str:
    """`path` as a clean relative path (no empty, `.` or `..` components), '' for none."""
    parts = path.strip("/").split("/") if path.strip("/") else []
    if any(p in ("", ".", "..") for p in parts):
        raise AdapterError(f"{what}: the path {path!r} may not hold '.', '..' or '//'")
    return "/".join(parts)


def name_problem(name: str) -> str | None:
    """Why `name` cannot name an adapter (None when it can): it must be one path component."""
    if _NAME.match(name):
        return None
    return (
        f"{name!r} is not an adapter name: one path component of letters, digits, '.', '_' and '-', "
        "starting with a letter or digit, at most 128 characters"
    )


def engine_args(lora: LoraSpec) -> list[str]:
    """vLLM's LoRA flags (the simulator takes the same):
    `--enable-lora --max-loras N --max-lora-rank R [--max-cpu-loras C]`."""
    args = ["--enable-lora", "--max-loras", str(lora.max_loras), "--max-lora-rank", str(lora.max_rank)]
    if lora.max_cpu_loras is not None:
        args += ["--max-cpu-loras", str(lora.max_cpu_loras)]
    return args


def engine_env(directory: str) -> dict[str, str]:
    """vLLM's LoRA environment: the runtime API on, the filesystem resolver reading `directory`."""
    return {
        RUNTIME_UPDATING_ENV: "True",
        PLUGINS_ENV: FILESYSTEM_RESOLVER,
        RESOLVER_DIR_ENV: directory,
    }


@dataclass(frozen=True)
class AdapterConfig:
    """What Tandem reads from an `adapter_config.json` (PEFT): the rank `r`, the base model and the
    PEFT type (vLLM's resolver loads only `LORA`)."""

    rank: int | None
    base_model: str | None
    peft_type: str | None = None


def read_adapter_config(directory: Path) -> AdapterConfig:
    """The `adapter_config.json` of an adapter directory; raises `AdapterError` when it is missing,
    unreadable, larger than 1 MiB, not a JSON object, or has an `r` that is not a positive integer."""
    path = directory / ADAPTER_CONFIG
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise AdapterError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise AdapterError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AdapterError(f"{path} is not a JSON object")
    rank = data.get("r")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise AdapterError(f"{path}: r must be a positive integer, got {rank!r}")
    base, peft = data.get("base_model_name_or_path"), data.get("peft_type")
    return AdapterConfig(
        rank=rank,
        base_model=base if isinstance(base, str) else None,
        peft_type=peft if isinstance(peft, str) else None,
    )


@dataclass(frozen=True)
class Catalog:
    """A scanned catalog: its adapters by name (sorted) and the subdirectories holding an
    `adapter_config.json` whose names cannot be adapter names (`unsafe`, sorted)."""

    adapters: Mapping[str, Path]
    unsafe: tuple[str, ...] = ()


def scan_catalog(directory: Path, *, limit: int = MAX_CATALOG_ENTRIES) -> Catalog:
    """Every subdirectory of `directory` holding an `adapter_config.json`, by name, sorted. Raises
    `AdapterError` when the directory cannot be listed or has more than `limit` entries."""
    try:
        with os.scandir(directory) as listing:
            entries = []
            for entry in listing:
                entries.append(entry.name)
                if len(entries) > limit:
                    raise AdapterError(f"{directory} has more than {limit} entries")
    except OSError as exc:
        raise AdapterError(f"cannot list {directory}: {exc.strerror or exc}") from None
    adapters: dict[str, Path] = {}
    unsafe: list[str] = []
    for name in sorted(entries):
        path = directory / name
        if not (path / ADAPTER_CONFIG).is_file():
            continue
        if name_problem(name) is None:
            adapters[name] = path
        else:
            unsafe.append(name)
    return Catalog(adapters=adapters, unsafe=tuple(unsafe))


def config_problem(config: AdapterConfig, *, max_rank: int) -> str | None:
    """Why the engines cannot load an adapter of this config (None when they can): a rank above
    `max_rank` (a config without `r` is not judged), or a `peft_type` other than LORA."""
    if config.rank is not None and config.rank > max_rank:
        return f"rank {config.rank} (adapter_config.json r) is above spec.engine.lora.maxRank {max_rank}"
    if config.peft_type != "LORA":
        return f"adapter_config.json peft_type is {config.peft_type!r}; the engines load only 'LORA'"
    return None


def link_adapters(dest: Path, adapters: Mapping[str, Path]) -> list[str]:
    """Make `dest/<name>` a symbolic link to each adapter's directory, so that vLLM's filesystem
    resolver (`VLLM_LORA_RESOLVER_CACHE_DIR=dest`) finds it; returns the names linked. Idempotent:
    a link that already points there is kept, a stale link is replaced; a name that is already a real
    directory (an adapter mounted there) is left alone and not returned."""
    dest.mkdir(parents=True, exist_ok=True)
    linked = []
    for name in sorted(adapters):
        if name_problem(name) is not None:
            raise AdapterError(name_problem(name) or "")
        target, link = adapters[name].resolve(), dest / name
        if link.is_symlink():
            if Path(os.readlink(link)) == target:
                linked.append(name)
                continue
            link.unlink()
        elif link.exists():
            continue
        link.symlink_to(target, target_is_directory=True)
        linked.append(name)
    return linked


def link_catalog(
    dest: Path, catalog: Path, *, skip: Collection[str] = ()
) -> tuple[Mapping[str, Path], list[str]]:
    """Keep `dest` linked to a catalog while it changes: each of its adapters but `skip` (names that
    are not the catalog's to serve: declared ones win) linked by name (`link_adapters`), and each link
    into the catalog whose directory is gone removed. Returns every adapter the scan found (`skip`
    included) and the names linked. Raises `AdapterError` when the catalog cannot be listed (nothing
    is changed then), `OSError` when `dest` cannot be written. Used by the engine pods' sidecar
    (`tandem.core.adaptersync`) and by `tandem up` (`tandem.local.catalog`)."""
    found = scan_catalog(catalog).adapters
    linked = link_adapters(dest, {name: path for name, path in found.items() if name not in skip})
    root = catalog.resolve()
    for link in dest.iterdir():
        if link.is_symlink() and not link.exists() and Path(os.readlink(link)).is_relative_to(root):
            link.unlink(missing_ok=True)
    return found, linked
