"""The self-check of the KV pool's keys (`tandem.router.pd.keycheck`): pure, nothing faked.

Evidence tables for what a barrier or a look-up says, stories on a hand-moved clock (plain floats)
for the states, and the error line's content.
"""

from __future__ import annotations

import pytest

from tandem.kvpool.keys import LMCacheHash, PoolKeys
from tandem.router.pd.keycheck import (
    PoolKeysCheck,
    barrier_evidence,
    keys_fields,
    lookup_evidence,
    mismatch_message,
)


@pytest.mark.parametrize(
    ("outcome", "chunks", "found", "evidence"),
    [
        ("ok", 3, 3, "hit"),  # every chunk there
        ("timeout", 3, 1, "hit"),  # one there: the engines write these keys, the rest was slow
        ("timeout", 3, 0, "miss"),  # none there after a good prefill
        ("pool_unavailable", 3, 0, "none"),  # Redis down says nothing about the keys
        ("pool_unavailable", 3, 2, "none"),
        ("ok", 0, 0, "none"),  # a prompt shorter than a chunk had nothing to look for
    ],
)
def test_a_barrier_is_a_hit_a_miss_or_no_evidence(
    outcome: str, chunks: int, found: int, evidence: str
) -> None:
    assert barrier_evidence(outcome, chunks=chunks, found=found) == evidence


@pytest.mark.parametrize(("pooled", "evidence"), [(512, "hit"), (0, "none"), (None, "none")])
def test_a_look_up_is_a_hit_only_when_it_finds_a_chunk(pooled: int | None, evidence: str) -> None:
    assert lookup_evidence(pooled) == evidence


def test_keys_start_unverified_with_the_look_ups_and_the_barrier_on() -> None:
    check = PoolKeysCheck()
    assert (check.state, check.lookups_on, check.barrier_due(0.0)) == ("unverified", True, True)


def test_the_fourth_miss_before_any_hit_concludes_a_mismatch_once() -> None:
    check = PoolKeysCheck()
    assert [check.observe("miss", now=float(t)) for t in range(4)] == [None, None, None, "mismatch"]
    assert (check.state, check.misses, check.lookups_on) == ("mismatch", 4, False)
    assert check.observe("miss", now=5.0) is None  # said once


def test_a_dead_pool_between_misses_neither_counts_nor_resets_them() -> None:
    check = PoolKeysCheck(misses_to_mismatch=2)
    check.observe("miss", now=0.0)
    for t in range(1, 50):
        assert check.observe("none", now=float(t)) is None
    assert check.state == "unverified"
    assert check.observe("miss", now=50.0) == "mismatch"


def test_one_hit_verifies_the_keys_for_good() -> None:
    check = PoolKeysCheck()
    check.observe("miss", now=0.0)
    assert check.observe("hit", now=1.0) == "verified"
    for t in range(2, 20):
        assert check.observe("miss", now=float(t)) is None
    assert (check.state, check.lookups_on, check.barrier_due(20.0)) == ("verified", True, True)


def test_in_mismatch_one_request_per_recheck_interval_probes_the_barrier() -> None:
    """The module's worked example: mismatch at t = 3, probes at 303 or later, 300 s apart."""
    check = PoolKeysCheck(recheck_after_s=300.0)
    for t in range(4):
        check.observe("miss", now=float(t))
    due = [t for t in (4.0, 100.0, 302.9, 310.0, 311.0, 600.0, 610.0) if check.barrier_due(t)]
    assert due == [310.0, 610.0]


def test_a_probe_that_misses_keeps_the_mismatch_and_one_that_hits_verifies() -> None:
    check = PoolKeysCheck(misses_to_mismatch=1, recheck_after_s=10.0)
    assert check.observe("miss", now=0.0) == "mismatch"
    assert check.barrier_due(10.0)
    assert check.observe("miss", now=12.0) is None
    assert check.state == "mismatch"
    assert check.barrier_due(20.0)
    assert check.observe("hit", now=21.0) == "verified"
    assert check.lookups_on


def test_a_late_hit_after_the_conclusion_still_verifies() -> None:
    """Barriers in flight when the mismatch was concluded report later; a hit among them wins."""
    check = PoolKeysCheck(misses_to_mismatch=2)
    check.observe("miss", now=0.0)
    check.observe("miss", now=0.1)
    assert check.observe("hit", now=0.2) == "verified"


def test_a_check_needs_at_least_one_miss() -> None:
    with pytest.raises(ValueError, match="misses_to_mismatch"):
        PoolKeysCheck(misses_to_mismatch=0)


def test_the_mismatch_line_names_the_keys_looked_for_and_what_to_check() -> None:
    keys = PoolKeys(
        model="/models/qwen",
        chunk_size=256,
        dtype="bfloat16",
        world_size=2,
        scheme=LMCacheHash(5313149338359954478),
    )
    line = mismatch_message(keys, misses=4, recheck_after_s=300.0)
    for part in (
        "after 4 prefills",
        "lmcache hash",
        "model '/models/qwen'",
        "dtype bfloat16",
        "world size 2",
        "stops the KV barrier and the pool look-ups",
        "every 300 s",
        "PYTHONHASHSEED",
        "LMCache 0.5.6",
        "spec.engine.image",
    ):
        assert part in line, part
    assert keys_fields(keys) == {
        "key_hash": "lmcache",
        "key_model": "/models/qwen",
        "key_dtype": "bfloat16",
        "key_world_size": 2,
        "key_worker_id": 0,
        "key_none_hash": 5313149338359954478,
    }


def test_the_mismatch_line_for_tandem_keys_does_not_blame_python_hashes() -> None:
    line = mismatch_message(PoolKeys(model="m", chunk_size=256), misses=4, recheck_after_s=300.0)
    assert "tandem hash" in line and "Tandem's connector" in line
    assert "PYTHONHASHSEED" not in line
