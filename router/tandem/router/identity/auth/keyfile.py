"""The key table loaded from a file, and reloaded when the file changes.

A Kubernetes Secret mounted as a volume is updated in place (the kubelet swaps a symlink), so the
router re-reads the file whenever what `os.stat` sees (following links) changes: inode, size or
modification time, checked every `interval_s` by a background task, or on demand with `check()`.
A file that cannot be read or parsed at start-up stops the router (`KeyTableError`); a bad file
later keeps the last good table (logged, and counted as a failed reload) until a good one appears.
Keys are never logged; the log names the file and the number of entries.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tandem.core.files import Signature, signature
from tandem.core.tasks import Every
from tandem.router.identity.auth.keys import KeyTable, KeyTableError, parse_key_table

log = logging.getLogger(__name__)


def _load(path: Path) -> tuple[Signature, KeyTable]:
    try:
        seen = signature(path)
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyTableError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return seen, parse_key_table(text)
    except KeyTableError as exc:
        raise KeyTableError(f"{path}: {exc}") from None


class KeyFile:
    """The current `KeyTable` of one file; `reloads` counts reload attempts by outcome (`ok`,
    `error`) for the metrics. Construction loads the file and raises `KeyTableError` if it is bad."""

    def __init__(self, path: Path, *, interval_s: float = 2.0) -> None:
        self.path = path
        self.interval_s = interval_s
        self.reloads = {"ok": 0, "error": 0}
        self._signature, self.table = _load(path)
        self._every = Every(self.check, interval_s=interval_s, name="api-key-file")
        log.info("api keys loaded", extra={"file": str(path), "keys": len(self.table)})

    def check(self) -> bool:
        """Reload if the file changed; True when a new table is in place."""
        try:
            if signature(self.path) == self._signature:
                return False
            seen, table = _load(self.path)
        except (OSError, KeyTableError) as exc:
            # Mid-update (the link briefly points nowhere) or a bad edit: keep serving the last table.
            log.warning("api keys not reloaded; keeping the previous ones", extra={"error": str(exc)})
            self.reloads["error"] += 1
            return False
        self._signature, self.table = seen, table
        log.info("api keys reloaded", extra={"file": str(self.path), "keys": len(table)})
        self.reloads["ok"] += 1
        return True

    async def start(self) -> None:
        await self._every.start()

    async def stop(self) -> None:
        await self._every.stop()
