"""Keeping an engine pod's adapter cache equal to the declared list while the engines run.

The operator writes a service's remote adapters (`hf://`, `s3://`) into a ConfigMap,
`<service>-adapters`, key `adapters.json`:

    {"adapters": [{"name": "sql", "source": "hf://org/sql-lora@v2"}, ...]}

Every engine pod mounts it, and its `adapters-sync` sidecar (`tandem adapters sync`) calls
`AdapterSync.step` on each pass: it installs each listed adapter that is not installed from that
source yet (`adapterfetch.install`: once per source on a shared cache), removes those it installed
that are no longer listed (`adapterfetch.prune`), and links a catalog's adapters (a listed name wins;
an adapter that left the catalog is unlinked).
The kubelet updates a mounted ConfigMap in place, so adding, changing or removing an adapter reaches
running pods without a restart: the engine pod template never names an adapter.

An adapter that failed is tried again once `retry_s` has passed since (not on every pass: a source
that is gone should not be asked for every few seconds by every pod), or at once when its source
changes. What each pass found is the pod's report (`report`): per listed adapter its source, state
(`Ready`, `Failed`, `Pending` before its first try) and reason, which the sidecar serves at
`GET /adapters` and the operator reads back into `status.adapters`; and the catalog's adapter names
(`catalog`), which the operator writes into the gateway's list of names (`tandem.core.adapternames`).

The downloads are injected (`adapterfetch.Download`), as is the clock; only the cache directory is
touched here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tandem.core.adapterfetch import Download, Wanted, failure_reason, install, parse_wanted, prune
from tandem.core.adapters import AdapterError, link_catalog

#: The ConfigMap key holding the list, and the file name it has where the pods mount it.
LIST_KEY = "adapters.json"
#: The sidecar's port (`GET /ready`, `/adapters`, `/metrics`), named `adapter-sync` in the pods.
SYNC_PORT = 8095
#: How long a failed adapter waits before it is tried again (its source unchanged).
DEFAULT_RETRY_S = 300.0

State = Literal["Ready", "Failed", "Pending"]


def list_document(adapters: Sequence[tuple[str, str]]) -> str:
    """The ConfigMap's `adapters.json` for (name, source) pairs, in order (stable text: the same
    list is the same bytes, so an unchanged spec never patches the ConfigMap).

    >>> list_document([("sql", "hf://org/sql-lora@v2")])
    '{"adapters": [{"name": "sql", "source": "hf://org/sql-lora@v2"}]}'
    """
    return json.dumps({"adapters": [{"name": n, "source": s} for n, s in adapters]})


def parse_list(text: str) -> list[Wanted]:
    """The adapters of an `adapters.json`; raises `AdapterError` for a document that is not one
    (not JSON, no `adapters` list, an entry without a string name and source, or what
    `parse_wanted` refuses: an unsafe name, a name twice, a source that is not hf:// or s3://)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise AdapterError(f"{LIST_KEY} is not JSON: {exc}") from None
    entries = data.get("adapters") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise AdapterError(f'{LIST_KEY} has no "adapters" list')
    items = []
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        source = entry.get("source") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not isinstance(source, str):
            raise AdapterError(f'{LIST_KEY}: every entry needs a string "name" and "source": {entry!r}')
        items.append(f"{name}={source}")
    return parse_wanted(items)


def digest(text: str) -> str:
    """16 hex digits of the list's SHA-256: which list a report answers."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Entry:
    """One listed adapter as this pod last saw it."""

    source: str
    state: State = "Pending"
    reason: str = ""
    revision: str = ""
    tried_at: float | None = None


@dataclass(frozen=True)
class PassResult:
    """What one pass changed: adapters installed now, removed, and failed now."""

    installed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    linked: int = 0


@dataclass
class AdapterSync:
    """The sidecar's state between passes (module docstring)."""

    cache: Path
    download: Download
    max_rank: int
    clock: Callable[[], float]
    catalog: Path | None = None
    retry_s: float = DEFAULT_RETRY_S
    entries: dict[str, Entry] = field(default_factory=dict)
    list_digest: str = ""
    list_error: str = ""
    passes: int = 0
    #: The catalog's adapter names, sorted, as its last successful scan found them (those a listed
    #: name shadows included); a scan that fails keeps them, so a transient error empties nothing.
    #: None while no scan has succeeded yet.
    catalog_names: tuple[str, ...] | None = None

    def step(self, text: str, *, listed_at: float | None = None) -> PassResult:
        """One pass over the list `text` (the mounted file's content, written at `listed_at`: what
        was installed after that is not removed, `adapterfetch.prune`). A list it cannot read
        changes nothing in the cache and is reported (`list_error`) until a readable one comes."""
        try:
            wanted = parse_list(text)
        except AdapterError as exc:
            self.list_error = str(exc)
            self.passes += 1
            return PassResult()
        self.list_error, self.list_digest = "", digest(text)
        # Dropped names are forgotten; a changed source starts again as Pending.
        self.entries = {w.name: self._kept(w) for w in wanted}
        installed, failed = [], []
        for item in wanted:
            entry = self.entries[item.name]
            if not self._due(entry):
                continue
            entry.tried_at = self.clock()
            try:
                done = install(self.cache, item, download=self.download, max_rank=self.max_rank)
            except (AdapterError, OSError) as exc:
                entry.state, entry.reason = "Failed", failure_reason(item, exc)
                failed.append(item.name)
                continue
            entry.state, entry.reason, entry.revision = "Ready", done.outcome, done.revision
            if done.outcome == "fetched":
                installed.append(item.name)
        removed = prune(self.cache, [w.name for w in wanted], listed_at=listed_at)
        linked = self._link_catalog({w.name for w in wanted})
        self.passes += 1
        return PassResult(tuple(installed), tuple(removed), tuple(failed), linked)

    def report(self) -> dict[str, Any]:
        """The pod's report (`GET /adapters`): the list's digest, each listed adapter's state, and
        the catalog's adapter names (`catalog`: `catalog_names`; [] without a catalog; null while no
        scan of it has succeeded, so that a reader does not take "not known yet" for "empty")."""
        return {
            "digest": self.list_digest,
            "passes": self.passes,
            "listError": self.list_error,
            "adapters": {
                name: {"source": e.source, "state": e.state, "reason": e.reason, "revision": e.revision}
                for name, e in self.entries.items()
            },
            "catalog": self._catalog_report(),
        }

    def _catalog_report(self) -> list[str] | None:
        if self.catalog is None:
            return []
        return None if self.catalog_names is None else list(self.catalog_names)

    def counts(self) -> Mapping[State, int]:
        """Listed adapters by state (the sidecar's gauge)."""
        out: dict[State, int] = {"Ready": 0, "Failed": 0, "Pending": 0}
        for entry in self.entries.values():
            out[entry.state] += 1
        return out

    def _kept(self, wanted: Wanted) -> Entry:
        old = self.entries.get(wanted.name)
        return old if old is not None and old.source == wanted.source else Entry(wanted.source)

    def _due(self, entry: Entry) -> bool:
        """Ready adapters are checked each pass (cheap: the marker is found; a link someone removed
        is put back); failed ones only once `retry_s` has passed."""
        if entry.state != "Failed" or entry.tried_at is None:
            return True
        return self.clock() - entry.tried_at >= self.retry_s

    def _link_catalog(self, declared: set[str]) -> int:
        """Link the catalog's adapters (a listed name wins), and unlink those that left the
        catalog: links into it whose directory is gone. Returns the number linked. Every name the
        scan found becomes `catalog_names`; a scan that fails leaves them as they were (and is
        reported in `list_error`)."""
        if self.catalog is None:
            return 0
        try:
            found, linked = link_catalog(self.cache, self.catalog, skip=declared)
        except (AdapterError, OSError) as exc:
            self.list_error = f"catalog {self.catalog}: {exc}"
            return 0
        self.catalog_names = tuple(sorted(found))
        return len(linked)
