"""The profiles and the roofline time model (`tandem.sim.engine.profiles`, `.timemodel`).

Pure: numbers in, simulated seconds out; nothing is faked because nothing does I/O or reads a clock.
The worked numbers are the ones in the module docstrings and docs/sim.md.
"""

from __future__ import annotations

import pytest

from tandem.sim.engine.profiles import PROFILES, get_profile
from tandem.sim.engine.timemodel import BatchShape, step_time

QWEN = PROFILES["qwen2.5-7b-h100"]
TINY = PROFILES["tiny-cpu"]


def prefill(tokens: int) -> BatchShape:
    return BatchShape(num_seqs=1, new_tokens=tokens, context_tokens=tokens)


def decode(seqs: int, context: int) -> BatchShape:
    return BatchShape(num_seqs=seqs, new_tokens=seqs, context_tokens=seqs * context)


@pytest.mark.parametrize(
    ("name", "kv_bytes_per_token", "num_gpu_blocks"),
    [("qwen2.5-7b-h100", 57_344, 61_907), ("tiny-cpu", 1024, 256)],
)
def test_profiles_derive_kv_bytes_per_token_and_the_number_of_blocks(
    name: str, kv_bytes_per_token: int, num_gpu_blocks: int
) -> None:
    profile = get_profile(name)
    assert profile.model.kv_bytes_per_token == kv_bytes_per_token
    assert profile.num_gpu_blocks(16) == num_gpu_blocks


def test_an_unknown_profile_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(KeyError, match="tiny-cpu"):
        get_profile("gpt-5-on-a-toaster")


def test_a_2048_token_prefill_on_the_h100_is_compute_bound_at_about_65_ms() -> None:
    t = step_time(QWEN, prefill(2048))
    assert t.bound == "compute"
    assert t.compute_s == pytest.approx(0.06295, rel=1e-3)
    assert t.memory_s == pytest.approx(0.004572, rel=1e-3)
    assert t.total_s == pytest.approx(0.06495, rel=1e-3)


def test_a_single_decode_on_the_h100_is_memory_bound_and_dominated_by_weights() -> None:
    t = step_time(QWEN, decode(1, 1000))
    assert t.bound == "memory"
    assert t.memory_s == pytest.approx(0.0045544, rel=1e-3)
    assert t.total_s == pytest.approx(0.0065544, rel=1e-3)
    weights_share = QWEN.model.weight_bytes / (QWEN.model.weight_bytes + 1000 * 57_344)
    assert weights_share > 0.99


@pytest.mark.parametrize("tokens", [512, 1024, 2048, 4096, 8192])
def test_prefill_compute_time_grows_linearly_with_tokens(tokens: int) -> None:
    assert step_time(QWEN, prefill(tokens)).compute_s == pytest.approx(
        step_time(QWEN, prefill(512)).compute_s * tokens / 512
    )


@pytest.mark.parametrize("seqs", [1, 8, 32, 64])
def test_batching_decode_is_nearly_free_while_weights_dominate(seqs: int) -> None:
    one = step_time(QWEN, decode(1, 500)).total_s
    batch = step_time(QWEN, decode(seqs, 500)).total_s
    assert one <= batch < one * 1.35


def test_the_compute_and_memory_bounds_meet_near_148_new_tokens() -> None:
    below = step_time(QWEN, BatchShape(num_seqs=1, new_tokens=140, context_tokens=0))
    above = step_time(QWEN, BatchShape(num_seqs=1, new_tokens=156, context_tokens=0))
    assert (below.bound, above.bound) == ("memory", "compute")


def test_loading_from_the_pool_adds_bytes_over_pool_bandwidth() -> None:
    plain = step_time(QWEN, prefill(88))
    loaded = step_time(QWEN, BatchShape(num_seqs=1, new_tokens=88, context_tokens=600, loaded_tokens=512))
    assert loaded.load_s == pytest.approx(512 * 57_344 / 6.25e9)  # 4.70 ms
    assert loaded.total_s > plain.total_s + loaded.load_s * 0.99


def test_an_empty_step_takes_no_time() -> None:
    assert step_time(TINY, BatchShape(num_seqs=0, new_tokens=0, context_tokens=0)).total_s == 0.0


def test_the_tiny_profile_decodes_at_about_its_step_overhead() -> None:
    t = step_time(TINY, decode(8, 1000))
    assert t.overhead_s > 10 * max(t.compute_s, t.memory_s)
    assert t.total_s == pytest.approx(0.0085, abs=0.0005)
