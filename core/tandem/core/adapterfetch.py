"""Installing remote adapters (`hf://`, `s3://`) into an adapter cache, once each, safely shared.

The cache is the engines' adapter directory (`/adapters`, `VLLM_LORA_RESOLVER_CACHE_DIR`); with
`spec.adapterCache.pvc` every engine pod of the service mounts the same one. Its layout:

    <cache>/<name>                       -> .fetched/<name>@<key>   (a relative symbolic link)
    <cache>/.fetched/<name>@<key>/       the adapter's files and FETCHED_MARKER
    <cache>/.fetched/<name>.lock         held (flock) while one process installs <name>
    <cache>/.fetched/.tmp-<name>@<rand>/ a download in progress (removed by the next install of
                                         <name> when a crash left it)

`<key>` is a digest of the declared source (`source_key`), so a changed source is a new directory
and fetched again, and an unchanged one is found and not. An install downloads into a temporary
directory beside the others, checks it (`check_download`: `adapter_config.json` readable, rank at
most maxRank, PEFT type LORA, a weights file present), writes the marker, renames it into place and
then swaps the link with `os.replace`, so that the engines' resolver sees the old adapter or the new
one, never a half-written directory. Several pods running this at once on one cache are serialised
by the lock file; whoever gets it second finds the marker and does nothing.

The download itself is injected (`Download`): `tandem.cli.adapterremote` has the Hub's and S3's.
Only the local filesystem is touched here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tandem.core.adapters import (
    ADAPTER_CONFIG,
    AdapterError,
    HfSource,
    S3Source,
    config_problem,
    name_problem,
    parse_source,
    read_adapter_config,
)

#: The directory of installed versions, beside the names (a dot: vLLM never looks it up as a model).
FETCHED_DIR = ".fetched"
#: Written last into an installed version: the source as declared and the revision fetched.
FETCHED_MARKER = ".tandem-fetched.json"
#: Files that count as an adapter's weights (PEFT's two formats; vLLM loads either).
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
#: What the fetch container prints (and the operator reads back from its termination message):
#: `failed <name>: <reason>` for each adapter it could not install.
FAILED_PREFIX = "failed "

RemoteSource = HfSource | S3Source
#: Downloads a source into an empty directory; returns the revision it got (a commit, an ETag digest).
Download = Callable[[RemoteSource, Path], str]


class FetchError(AdapterError):
    """An adapter could not be fetched or is not loadable; the message says why, in one line."""


@dataclass(frozen=True)
class Wanted:
    """One adapter to install: its name, the source as declared, and that source parsed."""

    name: str
    source: str
    parsed: RemoteSource


@dataclass(frozen=True)
class Installed:
    """What `install` did: `fetched` (downloaded now) or `cached` (already there), and the revision."""

    name: str
    outcome: Literal["fetched", "cached"]
    revision: str


def parse_wanted(items: Sequence[str]) -> list[Wanted]:
    """`name=source` items (the fetch command's arguments) as `Wanted`; raises `AdapterError` for an
    item that is not `name=hf://…` or `name=s3://…`, or a name given twice.

    >>> parse_wanted(["sql=hf://org/sql-lora@v2"])[0].parsed
    HfSource(repo='org/sql-lora', revision='v2')
    """
    out: list[Wanted] = []
    for item in items:
        name, eq, source = item.partition("=")
        if not eq:
            raise AdapterError(f"{item!r}: expected NAME=SOURCE")
        problem = name_problem(name)
        if problem is not None:
            raise AdapterError(problem)
        if any(w.name == name for w in out):
            raise AdapterError(f"adapter {name!r} is given twice")
        parsed = parse_source(source)
        if not isinstance(parsed, HfSource | S3Source):
            raise AdapterError(f"adapter {name!r}: only hf:// and s3:// sources are fetched, not {source!r}")
        out.append(Wanted(name, source, parsed))
    return out


def source_key(source: str) -> str:
    """The version directory's key for a declared source: 16 hex digits of its SHA-256."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def check_download(directory: Path, *, max_rank: int) -> None:
    """Raise `FetchError` unless `directory` holds a loadable adapter: a readable
    `adapter_config.json` of rank at most `max_rank` and PEFT type LORA, and a weights file."""
    try:
        config = read_adapter_config(directory)
    except AdapterError as exc:
        raise FetchError(f"no usable {ADAPTER_CONFIG}: {exc}") from None
    problem = config_problem(config, max_rank=max_rank)
    if problem is not None:
        raise FetchError(problem)
    if not any((directory / name).is_file() for name in WEIGHT_FILES):
        raise FetchError(f"no weights file ({' or '.join(WEIGHT_FILES)})")


def read_marker(directory: Path) -> dict[str, str] | None:
    """The marker of an installed version (None when absent or unreadable: not complete)."""
    try:
        data = json.loads((directory / FETCHED_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if needed) for the block."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(cache: Path, wanted: Wanted, *, download: Download, max_rank: int) -> Installed:
    """Make `cache/<name>` the adapter of `wanted.source`, downloading it only when no complete
    version of that source is there (module docstring). Raises `FetchError` (nothing is changed in
    `cache/<name>` then) or `AdapterError` when `cache/<name>` is a directory this did not make."""
    versions = cache / FETCHED_DIR
    versions.mkdir(parents=True, exist_ok=True)
    relative = f"{FETCHED_DIR}/{wanted.name}@{source_key(wanted.source)}"
    target, link = cache / relative, cache / wanted.name
    with _locked(versions / f"{wanted.name}.lock"):
        if link.exists() and not link.is_symlink():
            raise AdapterError(
                f"{link} is a directory not fetched by tandem; remove it or rename the adapter"
            )
        marker = read_marker(target)
        if marker is not None and marker.get("source") == wanted.source:
            _point(link, relative)
            return Installed(wanted.name, "cached", marker.get("revision", ""))
        shutil.rmtree(target, ignore_errors=True)  # an incomplete version (no marker) left by a crash
        for stale in versions.glob(f".tmp-{wanted.name}@*"):  # only the lock's holder makes these
            shutil.rmtree(stale, ignore_errors=True)
        temp = Path(tempfile.mkdtemp(prefix=f".tmp-{wanted.name}@", dir=versions))
        try:
            revision = download(wanted.parsed, temp)
            check_download(temp, max_rank=max_rank)
            (temp / FETCHED_MARKER).write_text(json.dumps({"source": wanted.source, "revision": revision}))
            temp.rename(target)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
        _point(link, relative)
    return Installed(wanted.name, "fetched", revision)


def _point(link: Path, relative: str) -> None:
    """Make `link` a symbolic link to `relative`, atomically (a new link renamed over the old)."""
    if link.is_symlink() and os.readlink(link) == relative:
        return
    temp = link.with_name(f".link-{link.name}-{os.getpid()}")
    temp.unlink(missing_ok=True)
    temp.symlink_to(relative, target_is_directory=True)
    os.replace(temp, link)


def prune(cache: Path, keep: Sequence[str], *, listed_at: float | None = None) -> list[str]:
    """Remove the adapters this module installed whose names are not in `keep` (their links, then
    their versions), and every other version of a kept name; returns the names unlinked. Directories
    and links it did not make are left alone.

    `listed_at` (a timestamp, as `os.stat`'s): when `keep` was written. A version installed after it
    is left alone, link and files: on a cache that several pods share, a pod still acting on an older
    list must not remove what another pod installed from a newer one (the kubelets update the pods'
    lists at different moments). The next list that still leaves it out removes it."""
    versions = cache / FETCHED_DIR
    if not versions.is_dir():
        return []
    current = {(cache / name).resolve() for name in keep if (cache / name).is_symlink()}
    removed: list[str] = []
    for link in sorted(cache.iterdir()):
        if link.name in keep or not link.is_symlink():
            continue
        if os.readlink(link).startswith(f"{FETCHED_DIR}/") and not _newer(link.resolve(), listed_at):
            link.unlink()
            removed.append(link.name)
    for version in versions.iterdir():
        if (
            version.is_dir()
            and not version.name.startswith(".")  # a download in progress, under its own lock
            and "@" in version.name
            and version.resolve() not in current
            and not _newer(version, listed_at)
        ):
            with _locked(versions / f"{version.name.split('@')[0]}.lock"):
                shutil.rmtree(version, ignore_errors=True)
    return removed


def _newer(version: Path, listed_at: float | None) -> bool:
    """Whether `version` was installed (its marker written) after `listed_at`."""
    if listed_at is None:
        return False
    try:
        return (version / FETCHED_MARKER).stat().st_mtime > listed_at
    except OSError:
        return False  # no marker: not a complete install


def failure_reason(item: Wanted, exc: Exception) -> str:
    """Why `install` failed for `item`, in one line: a `FetchError`'s or `AdapterError`'s own words,
    else the source and the OS error."""
    reason = str(exc) if isinstance(exc, AdapterError) else f"{item.source}: {exc}"
    return " ".join(reason.split())


def failure_line(name: str, reason: str) -> str:
    """The line the fetch command prints for an adapter it could not install (one line)."""
    return f"{FAILED_PREFIX}{name}: {' '.join(reason.split())}"


def parse_failures(message: str) -> dict[str, str]:
    """The reasons by adapter name in a fetch container's output or termination message.

    >>> parse_failures("fetched a\\nfailed b: rank 64 is above 16\\n")
    {'b': 'rank 64 is above 16'}
    """
    out: dict[str, str] = {}
    for line in message.splitlines():
        if line.startswith(FAILED_PREFIX) and ": " in line:
            name, _, reason = line[len(FAILED_PREFIX) :].partition(": ")
            out[name] = reason
    return out
