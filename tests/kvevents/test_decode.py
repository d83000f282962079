"""Decoding KV-event payloads (`tandem.router.discovery.kvevents.decode`).

Pure: payloads are built by hand with msgpack in the layouts vLLM's msgspec encoder produces (array
and map encodings, int and bytes hashes, older and newer field sets), including one captured from a
real vLLM 0.26 publisher (volcano-sh/kthena#1535). Nothing is faked and no socket is involved.
"""

from __future__ import annotations

import hashlib

import pytest
from tests.kvevents.payloads import (
    batch,
    pack,
    removed_array,
    removed_map,
    stored_array,
    stored_map,
)

from tandem.router.discovery.kvevents.decode import (
    MASK64,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    decode_batch,
    first_block_salt,
    normalize_block_hash,
)

TOKENS = [1, 2, 3, 4, 5, 6, 7, 8]
STORED = BlockStored((11, 12), None, tuple(TOKENS), 4, medium="GPU")


@pytest.mark.parametrize(
    ("payload", "events"),
    [
        pytest.param(batch(stored_array([11, 12], TOKENS)), (STORED,), id="array-stored"),
        pytest.param(
            batch(stored_map([11, 12], TOKENS)),
            (BlockStored((11, 12), None, tuple(TOKENS), 4, "GPU", None, None, 0, "full_attention"),),
            id="map-stored",
        ),
        pytest.param(batch(removed_array([11])), (BlockRemoved((11,), "GPU"),), id="array-removed"),
        pytest.param(batch(removed_map([11])), (BlockRemoved((11,), "GPU", 0),), id="map-removed"),
        pytest.param(batch(["AllBlocksCleared"]), (AllBlocksCleared(),), id="array-cleared"),
        pytest.param(batch({"type": "AllBlocksCleared"}), (AllBlocksCleared(),), id="map-cleared"),
        pytest.param(
            batch(stored_array([11, 12], TOKENS), removed_map([11]), ["AllBlocksCleared"]),
            (STORED, BlockRemoved((11,), "GPU", 0), AllBlocksCleared()),
            id="mixed-encodings-in-order",
        ),
    ],
)
def test_both_encodings_decode_to_the_same_typed_events(payload: bytes, events: tuple[object, ...]) -> None:
    decoded = decode_batch(payload)
    assert decoded.events == events
    assert (decoded.ts, decoded.data_parallel_rank, decoded.unknown_tags) == (1.5, 0, ())


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        pytest.param(
            ["BlockStored", [11], None, [1, 2, 3, 4], 4],
            BlockStored((11,), None, (1, 2, 3, 4), 4),
            id="vllm-0.8-no-lora-id",
        ),
        pytest.param(
            ["BlockStored", [11], 10, [1, 2, 3, 4], 4, None],
            BlockStored((11,), 10, (1, 2, 3, 4), 4),
            id="vllm-0.9-lora-id-only",
        ),
        pytest.param(
            [
                "BlockStored",
                [11],
                None,
                [1, 2, 3, 4],
                4,
                3,
                "CPU",
                "adapter",
                [None],
                1,
                "full_attention",
                7,
                "x",
            ],
            BlockStored((11,), None, (1, 2, 3, 4), 4, "CPU", "adapter", 3, 1, "full_attention"),
            id="every-field-and-an-unknown-trailing-one",
        ),
        pytest.param(["BlockRemoved", [11]], BlockRemoved((11,)), id="removed-without-medium"),
        pytest.param(
            {"type": "BlockStored", "block_hashes": [11], "token_ids": [1, 2, 3, 4], "block_size": 4},
            BlockStored((11,), None, (1, 2, 3, 4), 4),
            id="map-with-only-the-required-fields",
        ),
        pytest.param(
            {"type": "BlockRemoved", "block_hashes": [11], "locality": "x", "ownership": None},
            BlockRemoved((11,)),
            id="map-with-unknown-fields",
        ),
    ],
)
def test_missing_trailing_and_unknown_extra_fields_are_tolerated(event: object, expected: object) -> None:
    assert decode_batch(batch(event)).events == (expected,)


EMBEDS = hashlib.sha256(b"prompt-embeds").digest()


@pytest.mark.parametrize(
    ("first_keys", "lora_name", "salt"),
    [
        pytest.param(None, None, None, id="no-extra-keys"),
        pytest.param([], None, None, id="empty"),
        pytest.param(["tenant-a"], None, "tenant-a", id="salt-alone"),
        pytest.param(["sql"], "sql", None, id="lora-alone"),
        pytest.param(["sql", "tenant-a"], "sql", "tenant-a", id="lora-then-salt"),
        pytest.param(["sql", "sql"], "sql", "sql", id="salt-named-like-the-adapter"),
        pytest.param([["img-1", 8], ["img-2", 0], "tenant-a"], None, "tenant-a", id="multimodal-first"),
        pytest.param(["sql", ["sql-img-1", 8], "tenant-a", EMBEDS], "sql", "tenant-a", id="every-kind"),
        pytest.param([["img-1", 8], EMBEDS], None, None, id="multimodal-and-embeds-no-salt"),
        pytest.param([3, "tenant-a"], None, "tenant-a", id="old-int-lora-id"),
        pytest.param(
            [{"type": "lora", "name": "sql"}, {"type": "cache_salt", "salt": "tenant-a"}],
            "sql",
            "tenant-a",
            id="typed-keys",
        ),
        pytest.param([{"type": "prompt_embeds", "hash": EMBEDS}], None, None, id="typed-without-salt"),
    ],
)
def test_the_salt_is_the_first_string_after_the_adapter_in_the_first_blocks_extra_keys(
    first_keys: list[object] | None, lora_name: str | None, salt: str | None
) -> None:
    """vLLM's order: LoRA name, (mm_identifier, offset) pairs, cache_salt, prompt-embeds hashes."""
    assert first_block_salt(first_keys, lora_name=lora_name) == salt


@pytest.mark.parametrize("encoding", ["array", "map"])
def test_a_stored_event_reports_the_salt_of_its_first_block(encoding: str) -> None:
    extra_keys = [["sql", "tenant-a"], ["sql"]]
    if encoding == "array":
        event: object = ["BlockStored", [11, 12], None, TOKENS, 4, None, "GPU", "sql", extra_keys, 0]
    else:
        event = {**stored_map([11, 12], TOKENS), "lora_name": "sql", "extra_keys": extra_keys}
    (stored,) = decode_batch(batch(event)).events
    assert isinstance(stored, BlockStored)
    assert (stored.lora_name, stored.cache_salt) == ("sql", "tenant-a")
    (unsalted,) = decode_batch(batch(stored_map([11, 12], TOKENS))).events  # extra_keys [None, None]
    assert isinstance(unsalted, BlockStored) and unsalted.cache_salt is None


def test_unknown_event_tags_are_skipped_and_counted() -> None:
    decoded = decode_batch(batch(["Future", 1], {"type": "Other"}, removed_array([11])))
    assert decoded.events == (BlockRemoved((11,), "GPU"),)
    assert decoded.unknown_tags == ("Future", "Other")


def test_bytes_hashes_become_their_low_64_bits_as_vllm_converts_them() -> None:
    digest = hashlib.sha256(b"block").digest()  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 sends these
    as_int = int.from_bytes(digest, "big") & MASK64  # what vLLM sends with the flag on (its default)
    decoded = decode_batch(batch(stored_array([digest], [1, 2, 3, 4], parent=digest)))
    event = decoded.events[0]
    assert isinstance(event, BlockStored)
    assert event.block_hashes == (as_int,) and event.parent_block_hash == as_int
    assert as_int == int.from_bytes(digest[-8:], "big")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (0, 0),
        (2**64 - 1, 2**64 - 1),
        (-1, 2**64 - 1),  # a signed int64 producer keeps its bit pattern
        (b"\x01\x02", 0x0102),
        (b"\xff" * 24 + (5).to_bytes(8, "big"), 5),
    ],
)
def test_block_hash_normalisation(raw: int | bytes, expected: int) -> None:
    assert normalize_block_hash(raw) == expected


def test_a_payload_captured_from_vllm_0_26_decodes() -> None:
    """Outer batch an array, events maps with the hybrid-cache fields (volcano-sh/kthena#1535)."""
    tokens = [151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198, 151667]
    event = {
        "type": "BlockStored",
        "block_hashes": [15760518052499183552],
        "parent_block_hash": None,
        "token_ids": tokens,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    decoded = decode_batch(pack([1789095808.8378847, [event], 0]))
    assert decoded.events == (
        BlockStored((15760518052499183552,), None, tuple(tokens), 16, "GPU", None, None, 0, "full_attention"),
    )


def test_older_batches_without_a_rank_and_map_shaped_batches_decode() -> None:
    """msgspec omits a None `data_parallel_rank` (old vLLM had no such field); a batch struct without
    `array_like` would be a map."""
    assert decode_batch(pack([2.0, [removed_array([1])]])).data_parallel_rank is None
    as_map = decode_batch(pack({"ts": 2.0, "events": [removed_map([1])], "data_parallel_rank": 1}))
    assert (as_map.ts, as_map.data_parallel_rank, len(as_map.events)) == (2.0, 1, 1)


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        pytest.param(b"\xc1", "not msgpack", id="reserved-byte"),
        pytest.param(pack("text"), "array or a map", id="batch-not-a-container"),
        pytest.param(pack([1.0]), "[ts, events", id="batch-too-short"),
        pytest.param(pack(["now", []]), "ts must be a number", id="ts-not-a-number"),
        pytest.param(pack([1.0, {}]), "events must be an array", id="events-not-an-array"),
        pytest.param(batch([]), "must start with its tag", id="empty-event"),
        pytest.param(batch({"block_hashes": []}), "string 'type'", id="map-without-type"),
        pytest.param(batch(["BlockStored", [1], None]), "missing block_size", id="stored-too-short"),
        pytest.param(batch(["BlockStored", 5, None, [], 4]), "block_hashes must be an array", id="hashes"),
        pytest.param(batch(["BlockStored", [1], None, [1, -2], 4]), "non-negative", id="negative-token"),
        pytest.param(batch(["BlockStored", [1], None, [], 0]), "positive int", id="zero-block-size"),
        pytest.param(batch(["BlockRemoved", [1.5]]), "bytes or int", id="float-hash"),
        pytest.param(batch(["BlockRemoved", [b""]]), "empty bytes", id="empty-bytes-hash"),
        pytest.param(batch(["BlockRemoved", [True]]), "bool", id="bool-hash"),
        pytest.param(batch(["BlockRemoved", [1], 7]), "medium must be a string", id="medium"),
        pytest.param(batch([*stored_array([1], [1, 2, 3, 4]), "salt"]), "extra_keys", id="extra-keys"),
        pytest.param(batch([*stored_array([1], [1, 2, 3, 4]), ["salt"]]), "extra_keys", id="extra-key-entry"),
    ],
)
def test_malformed_payloads_are_rejected_with_the_reason(payload: bytes, words: str) -> None:
    with pytest.raises(DecodeError, match=words.replace("[", r"\[")):
        decode_batch(payload)
