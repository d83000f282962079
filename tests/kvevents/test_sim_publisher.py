"""The simulator's KV-event encoder and publisher, checked against vLLM's wire format.

Real: `tandem.sim.kvevents_wire` (pure), a `KVEventPublisher` bound on 127.0.0.1 read by plain pyzmq
SUB, DEALER and REQ sockets as vLLM's own subscribers use them, the router's decoder, pydantic and
click. The block pool's events are constructed directly; nothing is faked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgpack  # type: ignore[import-untyped]
import pytest
import zmq
import zmq.asyncio
from click.testing import CliRunner
from pydantic import ValidationError
from tests.kvevents.harness import eventually

from tandem.cli.sim import sim as sim_command
from tandem.router.discovery.kvevents.decode import BlockRemoved as RemovedOut
from tandem.router.discovery.kvevents.decode import BlockStored as StoredOut
from tandem.router.discovery.kvevents.decode import decode_batch
from tandem.sim.engine.blocks import BlockRemoved, BlockStored
from tandem.sim.kvevents_publisher import KVEventPublisher
from tandem.sim.kvevents_wire import encode_batch, external_hash
from tandem.sim.settings import SimSettings

MINUS_ONE = (-1).to_bytes(8, "big", signed=True)
STORED = BlockStored(block_hashes=(-5, 7), parent_block_hash=-1, token_ids=tuple(range(8)), block_size=4)
REMOVED = BlockRemoved(block_hashes=(-5,))


def test_array_encoding_is_vllms_positional_layout() -> None:
    payload = encode_batch([STORED, REMOVED], ts=2.5, encoding="array")
    assert msgpack.unpackb(payload) == [
        2.5,
        [
            ["BlockStored", [2**64 - 5, 7], 2**64 - 1, list(range(8)), 4, None, "GPU", None],
            ["BlockRemoved", [2**64 - 5], "GPU"],
        ],
        0,
    ]


def test_map_encoding_names_every_field_under_a_type_tag() -> None:
    events = msgpack.unpackb(encode_batch([STORED, REMOVED], ts=2.5, encoding="map"))[1]
    assert events[0] == {
        "type": "BlockStored",
        "block_hashes": [2**64 - 5, 7],
        "parent_block_hash": 2**64 - 1,
        "token_ids": list(range(8)),
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    assert events[1] == {"type": "BlockRemoved", "block_hashes": [2**64 - 5], "medium": "GPU", "group_idx": 0}


SALTED = BlockStored((-5, 7), None, tuple(range(8)), 4, extra_keys=(("tenant-a",), None))


def test_a_salted_store_carries_vllms_extra_keys_in_both_encodings() -> None:
    """msgspec writes `list[tuple | None]` as arrays: the 9th positional item, or a named field."""
    (array,) = msgpack.unpackb(encode_batch([SALTED], ts=2.5, encoding="array"))[1]
    assert array == [
        "BlockStored",
        [2**64 - 5, 7],
        None,
        list(range(8)),
        4,
        None,
        "GPU",
        None,
        [["tenant-a"], None],
    ]
    (as_map,) = msgpack.unpackb(encode_batch([SALTED], ts=2.5, encoding="map"))[1]
    assert as_map["extra_keys"] == [["tenant-a"], None]
    assert list(as_map).index("extra_keys") == list(as_map).index("lora_name") + 1


@pytest.mark.parametrize("encoding", ["array", "map"])
def test_the_router_decodes_what_the_sim_encodes(encoding: str) -> None:
    decoded = decode_batch(encode_batch([STORED, REMOVED], ts=2.5, encoding=encoding))  # type: ignore[arg-type]
    stored, removed = decoded.events
    assert isinstance(stored, StoredOut) and isinstance(removed, RemovedOut)
    assert stored.block_hashes == (external_hash(-5), 7) and stored.parent_block_hash == 2**64 - 1
    assert (stored.token_ids, stored.block_size, stored.medium) == (tuple(range(8)), 4, "GPU")
    assert removed.block_hashes == (2**64 - 5,)


@pytest.fixture
async def publisher() -> AsyncIterator[KVEventPublisher]:
    publisher = KVEventPublisher(
        endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        topic="kv@sim@tiny",
        buffer_steps=3,
        wall=lambda: 42.0,
    )
    await publisher.start()
    yield publisher
    await publisher.aclose()


async def test_batches_are_topic_seq_payload_one_per_step_with_events(publisher: KVEventPublisher) -> None:
    context = zmq.asyncio.Context()
    try:
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@sim")
        sub.connect(publisher.endpoint)
        publisher.flush()  # a step without events publishes nothing
        for _ in range(50):  # until the subscription is through (PUB drops what nobody takes)
            publisher.collect(STORED)
            publisher.flush()
            if await sub.poll(100):
                break
        topic, seq, payload = await sub.recv_multipart()
        assert topic == b"kv@sim@tiny" and len(seq) == 8
        batch = decode_batch(payload)
        assert batch.ts == 42.0 and batch.data_parallel_rank == 0 and len(batch.events) == 1
        assert int.from_bytes(seq, "big") == publisher.published_batches - 1
    finally:
        context.destroy(linger=0)


async def test_replay_answers_buffered_batches_then_the_end_marker(publisher: KVEventPublisher) -> None:
    for _ in range(5):  # seq 0..4; a buffer of 3 keeps 2..4
        publisher.collect(REMOVED)
        publisher.flush()
    context = zmq.asyncio.Context()
    try:
        await eventually(lambda: publisher.published_batches == 5)
        dealer = context.socket(zmq.DEALER)
        dealer.connect(publisher.replay_endpoint or "")
        await dealer.send_multipart([b"", (3).to_bytes(8, "big")])
        replies = [await dealer.recv_multipart() for _ in range(3)]
        assert [r[:2] for r in replies[:2]] == [[b"", (3).to_bytes(8, "big")], [b"", (4).to_bytes(8, "big")]]
        assert replies[2] == [b"", MINUS_ONE, b""]
        await dealer.send_multipart([b"", (0).to_bytes(8, "big")])  # older than the buffer
        seqs = [(await dealer.recv_multipart())[1] for _ in range(4)]
        assert seqs == [(2).to_bytes(8, "big"), (3).to_bytes(8, "big"), (4).to_bytes(8, "big"), MINUS_ONE]

        req = context.socket(zmq.REQ)  # what vLLM's example subscriber uses: it sees the first reply
        req.connect(publisher.replay_endpoint or "")
        await req.send((4).to_bytes(8, "big"))
        seq, payload = await req.recv_multipart()
        assert seq == (4).to_bytes(8, "big") and decode_batch(payload).events == (
            RemovedOut((2**64 - 5,), "GPU", 0),
        )
    finally:
        context.destroy(linger=0)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        pytest.param(
            {"kv_events_replay_endpoint": "tcp://127.0.0.1:5558"},
            "needs --kv-events-endpoint",
            id="replay-alone",
        ),
        pytest.param({"kv_events_endpoint": "http://127.0.0.1:5557"}, "should match pattern", id="not-zmq"),
        pytest.param(
            {"kv_events_endpoint": "tcp://x:1", "kv_events_encoding": "json"},
            "'array' or 'map'",
            id="encoding",
        ),
        pytest.param(
            {"kv_events_endpoint": "tcp://x:1", "kv_events_buffer_steps": 0},
            "greater than or equal to 1",
            id="buffer",
        ),
    ],
)
def test_bad_kv_events_settings_are_refused_with_a_reason(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        SimSettings.model_validate({"profile": "tiny-cpu", **fields})


def test_kv_events_flags_are_validated_by_the_command() -> None:
    result = CliRunner().invoke(
        sim_command, ["--profile", "tiny-cpu", "--kv-events-replay-endpoint", "tcp://a:1"]
    )
    assert result.exit_code == 2
    assert "--kv-events-replay-endpoint needs --kv-events-endpoint" in result.stderr
    result = CliRunner().invoke(sim_command, ["--kv-events-encoding", "json"])
    assert result.exit_code == 2 and "'json' is not one of 'array', 'map'" in result.stderr
