"""The capacity profile's pure parts: rates, re-timed workloads, the capacity rule and the table."""

from __future__ import annotations

import pytest

from tandem.bench.capacity import capacity, parse_rates, profile_markdown, retimed
from tandem.bench.workloads import BenchRequest, Workload


def test_rates_are_sorted_and_unique() -> None:
    assert parse_rates("6, 2,4,2") == (2.0, 4.0, 6.0)
    with pytest.raises(ValueError, match="'-1' is not a positive finite rate"):
        parse_rates("2,-1")


def rows(*attained: tuple[float, float | None]) -> list[dict[str, object]]:
    return [
        {"label": "direct", "rate": r, "wall_rps": r / 2, "requests": 10, "ok": 10, "attainment": a,
         "ttft_p99_s": 0.5}
        for r, a in attained
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("attained", "found"),
    [
        (((4, 1.0), (6, 1.0), (8, 0.995), (10, 0.48)), 8),  # the module docstring's example
        (((4, 1.0), (6, 0.9), (8, 1.0)), 4),  # a lucky run above a failed one does not count
        (((4, 0.5), (6, 1.0)), None),  # the lowest rate already fails
        (((4, None), (6, 1.0)), None),  # no request at all
        (((8, 0.99), (4, 1.0)), 8),  # in any order; exactly the threshold counts
    ],
    ids=["docstring", "not-above-a-miss", "lowest-fails", "nothing-ran", "unordered"],
)
def test_the_capacity_is_the_highest_rate_met_at_and_below(
    attained: tuple[tuple[float, float | None], ...], found: float | None
) -> None:
    assert capacity(rows(*attained)) == found


def test_the_workloads_requests_are_cycled_at_the_new_rate() -> None:
    source = Workload(
        "w",
        tuple(BenchRequest(float(i), "t", 10 + i, prompt=f"p{i}") for i in range(3)),
        {"x": 1},
        concurrency=4,
        closed_loop={"t": 5.0},
    )
    load = retimed(source, rate=50.0, seconds=10.0, seed=1)
    offsets = [r.offset_s for r in load.requests]
    assert offsets == sorted(offsets) and offsets[0] == 0.0 and offsets[-1] < 10.0
    assert 400 < len(offsets) < 600  # Poisson at 50/s over 10 s: 500 ± 22
    assert [r.prompt for r in load.requests[:4]] == ["p0", "p1", "p2", "p0"]
    assert [r.max_tokens for r in load.requests[:4]] == [10, 11, 12, 10]
    assert load.concurrency is None and not load.closed_loop  # open loop: nothing holds arrivals back
    assert load.params["capacity_rate"] == 50.0 and load.params["x"] == 1
    assert retimed(source, rate=50.0, seconds=10.0, seed=1) == load  # the same seed, the same arrivals


def test_the_table_gives_the_oracle_flags_in_wall_rates() -> None:
    text = profile_markdown(rows((4, 1.0), (8, 0.995), (10, 0.48)), threshold=0.99, pools=("prefill",))
    assert "| direct | 8 | 4 | 10 | 10 | 99.5% | 0.500 |" in text
    assert "capacity **8 req/s** (engine time; 4 per wall second): `--oracle prefill=4`" in text
    assert "try lower rates" in profile_markdown(rows((4, 0.5)), threshold=0.99, pools=("prefill",))
    assert "try higher ones" in profile_markdown(rows((4, 1.0)), threshold=0.99, pools=("prefill",))
