"""Pool stats (`tandem.kvpool.stats`) and their Prometheus view (`tandem.kvpool.metrics`).

Real: a redis-server on 127.0.0.1 holding real chunk pairs in LMCache's layout. Nothing is faked.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from tests.kvpool.pool import CHUNK, PAYLOAD, prompt, store_prompt
from tests.servers import RedisServer, free_port

from tandem.kvpool.client import connect_sync
from tandem.kvpool.keys import KV_BYTES_SUFFIX, METADATA_SUFFIX
from tandem.kvpool.metrics import PoolCollector
from tandem.kvpool.stats import collect_stats, count_chunks


def test_chunks_are_counted_per_model_with_their_memory(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(3 * CHUNK + 5))
        store_prompt(client, "llama", prompt(CHUNK, start=1000))
        client.set("unrelated:key", b"v")
        stats = collect_stats(client, scan_count=2)
    assert {m: c.chunks for m, c in stats.models.items()} == {"qwen": 3, "llama": 1}
    assert {m: (c.incomplete, c.orphaned) for m, c in stats.models.items()} == {
        "qwen": (0, 0),
        "llama": (0, 0),
    }
    # Each pair holds PAYLOAD + 28 bytes of values plus Redis' per-key overhead.
    assert 3 * (PAYLOAD + 28) < stats.models["qwen"].memory_bytes < 3 * (PAYLOAD + 28 + 400)
    assert stats.total_keys == 9
    assert (stats.keys_scanned, stats.truncated) == (9, False)


def test_half_written_and_half_evicted_chunks_are_told_apart(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(2 * CHUNK), metadata=False)  # writer still busy
        store_prompt(client, "qwen", prompt(CHUNK, start=500), kv_bytes=False)  # bytes evicted
        store_prompt(client, "qwen", prompt(CHUNK, start=900))
        models, _, _ = count_chunks(client)
    counts = models["qwen"]
    assert (counts.chunks, counts.incomplete, counts.orphaned) == (1, 2, 1)


def test_looking_at_the_pool_does_not_count_as_hits_or_misses(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(4 * CHUNK))
        store_prompt(client, "qwen", prompt(CHUNK, start=700), metadata=False)
        before = client.info("stats")
        collect_stats(client)
        after = client.info("stats")
    assert (after["keyspace_hits"], after["keyspace_misses"]) == (
        before["keyspace_hits"],
        before["keyspace_misses"],
    )


def test_the_scan_stops_at_max_keys_and_says_so(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(20 * CHUNK))
        models, scanned, truncated = count_chunks(client, scan_count=5, max_keys=10)
    assert truncated
    assert 10 <= scanned < 40
    assert models["qwen"].chunks < 20


def test_memory_and_keyspace_counters_come_from_info(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        client.config_set("maxmemory", str(64 * 2**20))
        client.config_set("maxmemory-policy", "allkeys-lru")
        bases = store_prompt(client, "qwen", prompt(CHUNK))
        client.get(bases[0] + METADATA_SUFFIX)  # a hit
        client.get("qwen@1@0@0@bfloat16metadata")  # a miss
        stats = collect_stats(client)
    assert stats.maxmemory_bytes == 64 * 2**20
    assert stats.maxmemory_policy == "allkeys-lru"
    assert stats.used_memory_bytes > 0
    assert stats.keyspace_hits >= 1 and stats.keyspace_misses >= 1
    assert stats.to_dict()["models"]["qwen"]["chunks"] == 1


def test_metrics_render_a_snapshot_per_scrape(redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    with redis_server.client() as client:
        registry.register(PoolCollector(lambda: collect_stats(client)))
        assert 'tandem_kvpool_chunks{model="qwen"}' not in generate_latest(registry).decode()
        store_prompt(client, "qwen", prompt(2 * CHUNK))
        client.set("qwen@1@0@7@bfloat16" + KV_BYTES_SUFFIX, b"partial")
        text = generate_latest(registry).decode()
    assert "tandem_kvpool_up 1.0" in text
    assert 'tandem_kvpool_chunks{model="qwen"} 2.0' in text
    assert 'tandem_kvpool_incomplete_chunks{model="qwen"} 1.0' in text
    assert "tandem_kvpool_keyspace_hits_total" in text
    assert "tandem_kvpool_memory_bytes" in text


def test_an_unreachable_pool_is_a_zero_up_gauge_not_a_scrape_error() -> None:
    client = connect_sync(f"redis://127.0.0.1:{free_port()}", timeout_s=0.5)
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: collect_stats(client)))
    text = generate_latest(registry).decode()
    assert "tandem_kvpool_up 0.0" in text
    assert "tandem_kvpool_memory_bytes" not in text


@pytest.mark.parametrize(("scan_count", "max_keys"), [(0, 10), (10, 0)])
def test_bounds_must_be_positive(redis_server: RedisServer, scan_count: int, max_keys: int) -> None:
    with redis_server.client() as client, pytest.raises(ValueError, match="positive"):
        count_chunks(client, scan_count=scan_count, max_keys=max_keys)
