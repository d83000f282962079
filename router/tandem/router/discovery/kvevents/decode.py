"""Decode one vLLM KV-event payload (the third ZMQ frame) into typed events. Pure: no sockets.

A payload is a msgpack `EventBatch`. vLLM has shipped two encodings and both are accepted, even mixed
in one batch:

- array (msgspec `array_like=True`, vLLM before PR #42892): the batch is `[ts, events, dp_rank]` and
  each event is a positional array with its tag first, trailing default fields omitted:
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
  extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]`,
  `["BlockRemoved", block_hashes, medium, group_idx]`, `["AllBlocksCleared"]`;
- map (vLLM PR #42892 and later): each event is a map of named fields with the tag under `"type"`,
  e.g. `{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": None, ...}`. The batch
  stays `[ts, events, dp_rank]` as captured from vLLM 0.26; a batch that is itself a map
  (`{"ts", "events", "data_parallel_rank"}`) is accepted too.

Tolerance: optional fields may be missing (older vLLM) and unknown fields or extra trailing array
items are ignored (newer vLLM). An event with an unknown tag is skipped and reported in
`DecodedBatch.unknown_tags`. A known event whose required fields are missing or mistyped makes the
whole payload invalid (`DecodeError`): it is corrupt, and applying half of it would be worse.

`extra_keys` (vLLM's `list[tuple | None] | None`, one entry per block; a tuple arrives as an array)
is read for one thing, the `cache_salt` of a sequence's first block (`first_block_salt`); a field
that is not nil or an array of nil-or-array entries is a mistyped field as above.

Block hashes (`ExternalBlockHash = bytes | int`) are normalised to unsigned 64-bit ints the way vLLM's
`maybe_convert_block_hash` turns its 32-byte hashes into ints when `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`
is on (its default): `int.from_bytes(h, "big") & (2**64 - 1)`, i.e. the last 8 bytes, big-endian. So
the same block has the same id whichever form the engine sent. Ints are taken modulo 2**64 (a signed
int64 from another producer keeps its bit pattern).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgpack  # type: ignore[import-untyped]

from tandem.router.errors import RouterError

MASK64 = (1 << 64) - 1
BLOCK_STORED = "BlockStored"
BLOCK_REMOVED = "BlockRemoved"
ALL_BLOCKS_CLEARED = "AllBlocksCleared"
#: Positional layout of array-encoded events after the tag (vLLM's field order).
STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class DecodeError(RouterError):
    """The payload is not a valid KV-event batch (never reaches a client: the subscriber counts it)."""


@dataclass(frozen=True)
class BlockStored:
    """Consecutive full blocks of one sequence became cached; `token_ids` holds their tokens in order
    (len(block_hashes) * block_size of them, or none for a tier copy of blocks already announced).
    `cache_salt` is the salt the first block's `extra_keys` carry (`first_block_salt`), None if none:
    vLLM sets it only on a sequence's first block, so only a run with no parent can have one."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    lora_id: int | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    cache_salt: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    """Cached blocks were evicted from `medium` (None: the GPU)."""

    block_hashes: tuple[int, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class DecodedBatch:
    """One `EventBatch`: wall time `ts` (seconds since the epoch), known events in order, the data
    parallel rank, and the tags of the events that were skipped as unknown."""

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None
    unknown_tags: tuple[str, ...] = ()


def decode_batch(payload: bytes) -> DecodedBatch:
    """Decode a msgpack `EventBatch` in either encoding (module docstring); raises `DecodeError`."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise DecodeError(f"not msgpack: {exc}") from None
    ts, events, rank = _batch_fields(raw)
    decoded: list[KVEvent] = []
    unknown: list[str] = []
    for index, item in enumerate(events):
        tag, fields = _event_fields(item, index)
        event = _build(tag, fields, index)
        if event is None:
            unknown.append(tag)
        else:
            decoded.append(event)
    return DecodedBatch(ts, tuple(decoded), rank, tuple(unknown))


def normalize_block_hash(value: object) -> int:
    """An `ExternalBlockHash` (bytes or int) as an unsigned 64-bit int (module docstring)."""
    if isinstance(value, bool):
        raise DecodeError(f"a block hash cannot be a bool: {value!r}")
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, bytes):
        if not value:
            raise DecodeError("a block hash cannot be empty bytes")
        return int.from_bytes(value, "big") & MASK64
    raise DecodeError(f"a block hash must be bytes or int, got {type(value).__name__}")


def first_block_salt(first_keys: Sequence[object] | None, *, lora_name: str | None) -> str | None:
    """The `cache_salt` in the extra keys of a sequence's first block, or None.

    vLLM builds a block's extra keys as `lora_extra_keys + mm_extra_keys + cache_salt_keys +
    prompt_embeds_keys` (`generate_block_hash_extra_keys`), the salt on the first block only: the LoRA
    name (a string, the event's `lora_name`; an int id in vLLM before lora names), then one
    `(mm_identifier, offset)` pair per multimodal input, then the salt (a string), then prompt-embeds
    hashes (bytes). So the rule: drop a leading element equal to `lora_name`, skip pairs, bytes and
    ints; the first string left is the salt. A typed key (`{"type": "cache_salt", "salt": ...}`, a
    `CacheSaltKey` from publishers that type their extra keys) names it directly; other maps are
    skipped. Examples: `["t"]` → "t"; with `lora_name="sql"`, `["sql", ["img-1", 8], "t", b"..."]` →
    "t" and `["sql"]` → None; `["sql", "sql"]` → "sql" (an adapter and a salt of the same name).
    """
    if not first_keys:
        return None
    keys = list(first_keys)
    if lora_name is not None and keys[0] == lora_name:
        keys = keys[1:]
    for key in keys:
        if isinstance(key, str):
            return key
        if isinstance(key, dict) and key.get("type") == "cache_salt" and isinstance(key.get("salt"), str):
            salt: str = key["salt"]
            return salt
    return None


def _batch_fields(raw: object) -> tuple[float, Sequence[object], int | None]:
    if isinstance(raw, list):
        if len(raw) < 2:
            raise DecodeError(f"an event batch needs [ts, events, ...], got {len(raw)} items")
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    elif isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    else:
        raise DecodeError(f"an event batch must be an array or a map, got {type(raw).__name__}")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise DecodeError(f"batch ts must be a number, got {ts!r}")
    if not isinstance(events, list):
        raise DecodeError(f"batch events must be an array, got {type(events).__name__}")
    return float(ts), events, _opt_int(rank, "data_parallel_rank")


def _event_fields(item: object, index: int) -> tuple[str, Mapping[str, object]]:
    """The tag and the named fields of one event, from either encoding."""
    if isinstance(item, list):
        if not item or not isinstance(item[0], str):
            raise DecodeError(f"event {index}: an array event must start with its tag")
        tag = item[0]
        names = STORED_FIELDS if tag == BLOCK_STORED else REMOVED_FIELDS if tag == BLOCK_REMOVED else ()
        return tag, dict(zip(names, item[1:], strict=False))
    if isinstance(item, dict):
        map_tag = item.get("type")
        if not isinstance(map_tag, str):
            raise DecodeError(f"event {index}: a map event needs a string 'type'")
        return map_tag, item
    raise DecodeError(f"event {index}: must be an array or a map, got {type(item).__name__}")


def _build(tag: str, fields: Mapping[str, object], index: int) -> KVEvent | None:
    try:
        if tag == BLOCK_STORED:
            return _stored(fields)
        if tag == BLOCK_REMOVED:
            return BlockRemoved(
                block_hashes=_hashes(_required(fields, "block_hashes")),
                medium=_opt_str(fields.get("medium"), "medium"),
                group_idx=_opt_int(fields.get("group_idx"), "group_idx"),
            )
        if tag == ALL_BLOCKS_CLEARED:
            return AllBlocksCleared()
    except DecodeError as exc:
        raise DecodeError(f"event {index} ({tag}): {exc}") from None
    return None


def _stored(fields: Mapping[str, object]) -> BlockStored:
    parent = fields.get("parent_block_hash")
    block_size = _required(fields, "block_size")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise DecodeError(f"block_size must be a positive int, got {block_size!r}")
    lora_name = _opt_str(fields.get("lora_name"), "lora_name")
    extra_keys = _extra_keys(fields.get("extra_keys"))
    return BlockStored(
        block_hashes=_hashes(_required(fields, "block_hashes")),
        parent_block_hash=None if parent is None else normalize_block_hash(parent),
        token_ids=_token_ids(_required(fields, "token_ids")),
        block_size=block_size,
        medium=_opt_str(fields.get("medium"), "medium"),
        lora_name=lora_name,
        lora_id=_opt_int(fields.get("lora_id"), "lora_id"),
        group_idx=_opt_int(fields.get("group_idx"), "group_idx"),
        kv_cache_spec_kind=_opt_str(fields.get("kv_cache_spec_kind"), "kv_cache_spec_kind"),
        cache_salt=first_block_salt(extra_keys[0] if extra_keys else None, lora_name=lora_name),
    )


def _required(fields: Mapping[str, object], name: str) -> object:
    if name not in fields:
        raise DecodeError(f"missing {name}")
    return fields[name]


def _hashes(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise DecodeError(f"block_hashes must be an array, got {type(value).__name__}")
    return tuple(normalize_block_hash(h) for h in value)


def _extra_keys(value: object) -> list[list[object] | None] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(keys is None or isinstance(keys, list) for keys in value):
        raise DecodeError("extra_keys must be nil or an array of arrays and nils")
    return value


def _token_ids(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise DecodeError(f"token_ids must be an array, got {type(value).__name__}")
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise DecodeError(f"token ids must be non-negative ints, got {token!r}")
    return tuple(value)


def _opt_str(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise DecodeError(f"{name} must be a string or nil, got {value!r}")


def _opt_int(value: object, name: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise DecodeError(f"{name} must be an int or nil, got {value!r}")
