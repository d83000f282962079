"""The vLLM connector's pure logic: settings, keys, scopes, lookups, load and save planning, failures."""

from __future__ import annotations

import pytest

from tandem.core.kvkeys import PoolScope, TandemHash, chunk_hashes
from tandem.kvpool.connector_plan import (
    COUNTER_HELP,
    ChunkNamer,
    ConnectorConfigError,
    FailureMemory,
    PoolHealth,
    PoolSettings,
    SaveTracker,
    bypasses_pool,
    chunk_presence,
    engine_kv_dtype,
    lmcache_dtype,
    lookup_window,
    matched_tokens,
    plan_loads,
    prompt_chunk_hashes,
)

C = 256  # chunk size
B = 128  # CPU block size


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ---- settings and keys


def test_settings_from_extra_config_with_defaults() -> None:
    settings = PoolSettings.from_extra_config({"url": "redis://127.0.0.1:1"}, default_model="/models/x")
    assert settings == PoolSettings(
        url="redis://127.0.0.1:1", model="/models/x", chunk_size=256, timeout_s=2.0
    )
    assert settings.pool_key_env == "TANDEM_KV_POOL_KEY"


def test_the_kv_layout_comes_from_the_extra_config_and_is_none_without() -> None:
    extra = {"url": "redis://h:1", "kv_layout": "3f1c0a9e5b7d2c41"}
    assert PoolSettings.from_extra_config(extra, default_model="m").kv_layout == "3f1c0a9e5b7d2c41"
    assert PoolSettings.from_extra_config({"url": "redis://h:1"}, default_model="m").kv_layout is None


def test_the_pool_key_variable_may_be_renamed() -> None:
    extra = {"url": "redis://h:1", "pool_key_env": "MY_POOL_KEY"}
    assert PoolSettings.from_extra_config(extra, default_model="m").pool_key_env == "MY_POOL_KEY"


@pytest.mark.parametrize(
    "extra",
    [{}, {"url": ""}, {"url": "redis://h:1", "chunk_size": 0}, {"url": "redis://h:1", "chunk_size": True},
     {"url": "redis://h:1", "timeout_s": -1}, {"url": "redis://h:1", "model": ""},
     {"url": "redis://h:1", "pool_key_env": ""}, {"url": "redis://h:1", "pool_key_env": 1},
     {"url": "redis://h:1", "kv_layout": ""}, {"url": "redis://h:1", "kv_layout": 7}],
)  # fmt: skip
def test_bad_settings_are_refused(extra: dict[str, object]) -> None:
    with pytest.raises(ConnectorConfigError):
        PoolSettings.from_extra_config(extra, default_model="m")


def test_chunks_must_be_whole_blocks() -> None:
    settings = PoolSettings(url="redis://h:1", model="m", chunk_size=192)
    with pytest.raises(ConnectorConfigError, match="multiple of the engine block size 128"):
        settings.check_block_size(128)
    PoolSettings(url="redis://h:1", model="m", chunk_size=256).check_block_size(128)


def test_keys_follow_lmcache_layout() -> None:
    namer = ChunkNamer(model="tiny", world_size=2, worker_id=1, dtype=lmcache_dtype("torch.bfloat16"))
    assert namer.base(-0x7CFE) == "tiny@2@1@-7cfe@bfloat16"
    assert namer.kv_bytes(0x56B9) == "tiny@2@1@56b9@bfloat16kv_bytes"
    assert namer.metadata(0x56B9) == "tiny@2@1@56b9@bfloat16metadata"
    assert lmcache_dtype("torch.float16") == "half"
    assert lmcache_dtype("float32") == "float"


def test_prompt_hashes_are_the_pools_chained_chunk_hashes() -> None:
    tokens = list(range(600))
    hashes = prompt_chunk_hashes(tokens, C)
    assert hashes == chunk_hashes(tokens, C)
    assert len(hashes) == 2  # the 88-token tail has no chunk
    assert prompt_chunk_hashes(tokens[:512], C) == hashes  # a prefix chain: same first chunks


def test_a_salted_prompt_is_hashed_in_its_scope_with_the_pool_key() -> None:
    tokens, keyed = list(range(600)), TandemHash(key=b"k" * 32)
    salted = prompt_chunk_hashes(tokens, C, scheme=keyed, scope="t1-a")
    assert salted == keyed.chunk_hashes(tokens, C, scope="t1-a")
    assert not set(salted) & set(prompt_chunk_hashes(tokens, C, scheme=keyed, scope="t1-b"))
    assert not set(salted) & set(prompt_chunk_hashes(tokens, C, scheme=keyed))
    assert prompt_chunk_hashes(tokens, C, scope="t1-a") == TandemHash().chunk_hashes(tokens, C, scope="t1-a")


def test_an_adapters_prompt_is_hashed_in_its_adapters_scope() -> None:
    tokens, keyed = list(range(600)), TandemHash(key=b"k" * 32)
    scopes = [PoolScope(cache_salt=s, lora_name=a) for s in (None, "t1-a") for a in (None, "sql", "chat")]
    hashes = [prompt_chunk_hashes(tokens, C, scheme=keyed, scope=scope) for scope in scopes]
    assert len({h for chain in hashes for h in chain}) == 2 * len(scopes)
    assert hashes[0] == prompt_chunk_hashes(tokens, C, scheme=keyed)  # the base model's, unsalted


@pytest.mark.parametrize(
    ("multimodal", "prompt_embeds", "bypass"),
    [(False, False, False), (True, False, True), (False, True, True)],
)
def test_only_images_and_embeddings_bypass_the_pool(
    multimodal: bool, prompt_embeds: bool, bypass: bool
) -> None:
    """An adapter no longer bypasses: its name scopes the chunk hashes, as the salt does."""
    assert bypasses_pool(multimodal=multimodal, prompt_embeds=prompt_embeds) is bypass


def test_refused_chunks_have_counters_by_reason() -> None:
    assert {"chunks_rejected_untagged", "chunks_rejected_mac"} <= set(COUNTER_HELP)


# ---- lookup arithmetic


def test_a_prompt_of_exactly_whole_chunks_leaves_its_last_chunk_to_compute() -> None:
    # 512 tokens = 2 chunks, but a sync load must leave a token: only chunk 0 may be loaded.
    assert lookup_window(num_computed_tokens=0, num_tokens=512, num_chunks=2, chunk_size=C) == range(1)
    assert lookup_window(num_computed_tokens=0, num_tokens=513, num_chunks=2, chunk_size=C) == range(2)


def test_short_prompts_and_local_hits_shrink_the_window() -> None:
    assert not lookup_window(num_computed_tokens=0, num_tokens=256, num_chunks=1, chunk_size=C)
    assert not lookup_window(num_computed_tokens=0, num_tokens=100, num_chunks=0, chunk_size=C)
    # a local hit of 384 tokens (3 blocks): chunk 0 is local, chunk 1 is half local
    assert lookup_window(num_computed_tokens=384, num_tokens=900, num_chunks=3, chunk_size=C) == range(1, 3)
    assert not lookup_window(num_computed_tokens=768, num_tokens=900, num_chunks=3, chunk_size=C)


def test_preempted_request_counts_its_outputs_but_only_prompt_chunks() -> None:
    # 600 prompt tokens + 300 generated: still only the prompt's 2 chunks
    assert lookup_window(num_computed_tokens=0, num_tokens=900, num_chunks=2, chunk_size=C) == range(2)


def test_matched_tokens_is_the_run_of_present_chunks_past_the_local_hit() -> None:
    window = range(1, 4)
    assert (
        matched_tokens(window=window, present=[True, True, False], num_computed_tokens=384, chunk_size=C)
        == 384
    )
    assert (
        matched_tokens(window=window, present=[False, True, True], num_computed_tokens=384, chunk_size=C) == 0
    )
    assert matched_tokens(window=range(2), present=[True, True], num_computed_tokens=0, chunk_size=C) == 512
    assert matched_tokens(window=range(0), present=[], num_computed_tokens=0, chunk_size=C) == 0


# ---- load planning (whole blocks)


def test_plan_loads_maps_chunks_to_their_blocks() -> None:
    loads = plan_loads(
        start_token=0,
        num_tokens=512,
        hashes=[11, 22, 33],
        block_ids=[7, 8, 9, 10, 11],
        chunk_size=C,
        block_size=B,
    )
    assert [(x.chunk_index, x.chunk_hash, x.skip_blocks, x.block_ids) for x in loads] == [
        (0, 11, 0, (7, 8)),
        (1, 22, 0, (9, 10)),
    ]


def test_plan_loads_skips_blocks_already_in_the_local_cache() -> None:
    # local hit 128 tokens (block 7): chunk 0 loads only its second block
    loads = plan_loads(
        start_token=128,
        num_tokens=384,
        hashes=[11, 22],
        block_ids=[7, 8, 9, 10, 11],
        chunk_size=C,
        block_size=B,
    )
    assert [(x.chunk_index, x.skip_blocks, x.block_ids) for x in loads] == [(0, 1, (8,)), (1, 0, (9, 10))]


@pytest.mark.parametrize(("start", "count"), [(64, 192), (0, 300), (0, 0)])
def test_plan_loads_refuses_unaligned_ranges(start: int, count: int) -> None:
    with pytest.raises(ValueError):
        plan_loads(
            start_token=start,
            num_tokens=count,
            hashes=[1, 2],
            block_ids=[1, 2, 3, 4],
            chunk_size=C,
            block_size=B,
        )


def test_plan_loads_refuses_missing_blocks() -> None:
    with pytest.raises(ValueError, match="needs blocks"):
        plan_loads(
            start_token=0, num_tokens=512, hashes=[1, 2], block_ids=[1, 2, 3], chunk_size=C, block_size=B
        )


# ---- save planning


def test_save_tracker_hands_out_each_chunk_once_across_chunked_prefill() -> None:
    tracker = SaveTracker(chunk_size=C, block_size=B)
    # 700-token prompt, prefill budget 300 tokens per step
    first = tracker.start("r", hashes=[1, 2], block_ids=[10, 11, 12], computed_tokens=300)
    assert [(s.chunk_index, s.block_ids) for s in first] == [(0, (10, 11))]
    second = tracker.advance("r", new_block_ids=[13, 14], computed_tokens=600)
    assert [(s.chunk_index, s.chunk_hash, s.block_ids) for s in second] == [(1, 2, (12, 13))]
    assert "r" not in tracker  # every chunk handed out: nothing left to track
    assert tracker.advance("r", new_block_ids=[15], computed_tokens=700) == []


def test_save_tracker_exports_a_locally_cached_prefix() -> None:
    tracker = SaveTracker(chunk_size=C, block_size=B)
    # 512 of 600 tokens came from the prefix cache; this step computes the rest
    saves = tracker.start("r", hashes=[1, 2], block_ids=[4, 5, 6, 7, 8], computed_tokens=600)
    assert [s.chunk_index for s in saves] == [0, 1]


def test_save_tracker_after_preemption_uses_the_new_blocks() -> None:
    tracker = SaveTracker(chunk_size=C, block_size=B)
    assert [
        s.chunk_index for s in tracker.start("r", hashes=[1, 2], block_ids=[1, 2], computed_tokens=256)
    ] == [0]
    # preempted, resumed from scratch with new blocks; chunk 0 is not handed out again
    resumed = tracker.advance("r", new_block_ids=[20, 21, 22, 23], computed_tokens=512, resumed=True)
    assert [(s.chunk_index, s.block_ids) for s in resumed] == [(1, (22, 23))]


def test_save_tracker_waits_for_blocks_and_ignores_short_prompts() -> None:
    tracker = SaveTracker(chunk_size=C, block_size=B)
    assert tracker.start("short", hashes=[], block_ids=[1], computed_tokens=100) == []
    assert "short" not in tracker
    assert tracker.start("r", hashes=[1], block_ids=[1], computed_tokens=256) == []  # one block of two so far
    assert [s.block_ids for s in tracker.advance("r", new_block_ids=[2], computed_tokens=256)] == [(1, 2)]
    tracker.start("gone", hashes=[1, 2], block_ids=[], computed_tokens=0)
    tracker.finish("gone")
    assert "gone" not in tracker


# ---- failure memory and pool health


def test_failure_memory_forgets_after_its_ttl_and_beyond_capacity() -> None:
    clock = FakeClock()
    memory = FailureMemory(clock=clock, ttl_s=60, capacity=2)
    memory.add(1)
    assert 1 in memory
    clock.now += 61
    assert 1 not in memory
    memory.add(2)
    memory.add(3)
    memory.add(4)
    assert 2 not in memory
    assert 3 in memory
    assert 4 in memory
    assert len(memory) == 2
    assert "3" not in memory


def test_pool_health_logs_an_outage_once_and_backs_off() -> None:
    clock = FakeClock()
    health = PoolHealth(clock=clock, retry_after_s=1.0)
    assert health.usable()
    assert health.failed() is True
    assert not health.usable()
    clock.now += 1.0
    assert health.usable()
    assert health.failed() is False  # same outage: no second log line
    assert health.succeeded() is True
    assert health.succeeded() is False
    assert health.usable()


@pytest.mark.parametrize(
    ("args", "config", "expected"),
    [
        ([], {"torch_dtype": "bfloat16"}, "bfloat16"),
        ([], {"dtype": "float16"}, "half"),
        ([], {"torch_dtype": "float32"}, "half"),  # vLLM's auto serves a float32 checkpoint in float16
        (["--dtype", "half"], {"torch_dtype": "bfloat16"}, "half"),
        (["--dtype=bfloat16"], {"torch_dtype": "float16"}, "bfloat16"),
        (["--dtype", "auto"], {"torch_dtype": "float16"}, "half"),
        (["--kv-cache-dtype", "fp8", "--dtype", "half"], None, "fp8"),
        (["--kv-cache-dtype", "auto", "--dtype", "float"], None, "float"),
        ([], None, "bfloat16"),
    ],
)
def test_the_pool_keys_dtype_is_what_the_engine_names_its_kv_cache(
    args: list[str], config: dict[str, object] | None, expected: str
) -> None:
    assert engine_kv_dtype(args, config) == expected


def test_a_chunk_is_present_only_when_every_rank_has_metadata_and_bytes() -> None:
    # chunk 0: both ranks whole; chunk 1: rank 1 lost its bytes; chunk 2: nothing; chunk 3: bytes only
    answers = [*(1, 1, 1, 1), *(1, 1, 1, 0), *(0, 0, 0, 0), *(0, 1, 0, 1)]
    found = chunk_presence(answers, num_chunks=4, world_size=2)
    assert found.present == [True, False, False, False]
    assert found.broken == [(1, 1)]  # bytes without metadata is a write in progress, not broken


def test_presence_refuses_answers_of_another_shape() -> None:
    with pytest.raises(ValueError, match="expected 4 answers, got 2"):
        chunk_presence([1, 1], num_chunks=2, world_size=1)
