"""Flushing one model's chunks from the pool, leaving every other model's alone.

`SCAN MATCH <escaped model>@* COUNT batch` finds the candidates (`tandem.kvpool.keys.model_pattern`
escapes glob characters in the name), and `vllm@<escaped model>@*` those in LMCache 0.3's layout;
only keys that parse as chunk keys of exactly that model are
removed (so `qwen` never touches `qwen2@...`, nor a non-chunk key that happens to match), with
`UNLINK` (memory is reclaimed in the background) in batches of at most `batch` keys. Both halves of a
pair match the pattern, so whole pairs go; a writer racing the flush may leave a fresh pair behind.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from tandem.kvpool.keys import model_patterns, parse_key

DEFAULT_BATCH = 500


@dataclass(frozen=True)
class FlushResult:
    """`keys`: keys UNLINK removed; `chunks`: distinct chunks (pairs or lone halves) they belonged to."""

    keys: int
    chunks: int


def flush_model(client: redis.Redis, model: str, *, batch: int = DEFAULT_BATCH) -> FlushResult:
    """Delete every chunk key (`kv_bytes` and `metadata`) of `model` (module docstring)."""
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    deleted = 0
    chunks: set[str] = set()
    pending: list[bytes | str] = []
    for pattern in model_patterns(model):
        for key in client.scan_iter(match=pattern, count=batch):
            text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
            parsed = parse_key(text)
            if parsed is None or parsed.model != model:
                continue
            pending.append(key)
            chunks.add(parsed.base)
            if len(pending) >= batch:
                deleted += int(client.unlink(*pending))
                pending.clear()
    if pending:
        deleted += int(client.unlink(*pending))
    return FlushResult(keys=deleted, chunks=len(chunks))
