"""Files other processes read while they change: written whole or not at all (`replace_text`), and
followed by what `os.stat` sees of them (`signature`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically (a temporary file in the same directory, then
    `os.replace`), creating the directory if needed: a reader sees the old text or the new one,
    never half a file, and a failed write leaves no temporary file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: What says a followed file changed: device, inode, size and modification time (ns).
Signature = tuple[int, int, int, int]


def signature(path: Path) -> Signature:
    """`path`'s `Signature`, following symbolic links (a Kubernetes Secret or ConfigMap mounted as a
    volume is updated by swapping a link's target, which changes the inode); raises `OSError`."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
