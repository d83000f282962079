"""Round-robin scheduling as tables: pure, no servers, no clock."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tandem.router.errors import ConfigurationError
from tandem.router.scheduling import RoundRobin, Scheduler, scheduler_for
from tandem.router.types import Endpoint, EndpointSnapshot, Pool, RequestView, Route

A, B, C = (Endpoint("decode", f"http://10.0.0.{i}:8000") for i in (1, 2, 3))
REQUEST = RequestView(
    request_id="r",
    route=Route.COMPLETIONS,
    tenant="default",
)


def snaps(*endpoints: Endpoint) -> list[EndpointSnapshot]:
    return [
        EndpointSnapshot(endpoint=e, in_flight=0, consecutive_failures=0, in_rotation=True) for e in endpoints
    ]


def picks(scheduler: Scheduler, rounds: list[list[Endpoint]], pool: Pool = "decode") -> list[str]:
    """The host picked in each round, given that round's candidates."""
    return [str(urlsplit(scheduler.pick(pool, REQUEST, snaps(*c)).url).hostname) for c in rounds]


@pytest.mark.parametrize(
    ("rounds", "expected"),
    [
        pytest.param([[A, B, C]] * 6, ["10.0.0.1", "10.0.0.2", "10.0.0.3"] * 2, id="all-in-turn"),
        pytest.param([[C, A, B]] * 3, ["10.0.0.1", "10.0.0.2", "10.0.0.3"], id="order-is-by-url"),
        pytest.param([[A, C]] * 4, ["10.0.0.1", "10.0.0.3"] * 2, id="skips-one-out-of-rotation"),
        pytest.param(
            [[A, B, C], [A, C], [A, C], [A, B, C]],
            ["10.0.0.1", "10.0.0.3", "10.0.0.1", "10.0.0.2"],
            id="a-returning-endpoint-gets-its-turn",
        ),
        pytest.param(
            [[A, B, C], [B, C]], ["10.0.0.1", "10.0.0.2"], id="a-retry-without-the-failed-one-moves-on"
        ),
        pytest.param([[B]] * 3, ["10.0.0.2"] * 3, id="single-candidate"),
    ],
)
def test_round_robin_takes_endpoints_in_turn_among_the_candidates(
    rounds: list[list[Endpoint]], expected: list[str]
) -> None:
    assert picks(RoundRobin(), rounds) == expected


def test_round_robin_keeps_a_separate_turn_per_pool() -> None:
    scheduler = RoundRobin()
    p1, p2 = (Endpoint("prefill", f"http://10.0.1.{i}:8000") for i in (1, 2))
    assert scheduler.pick("decode", REQUEST, snaps(A, B)) == A
    assert scheduler.pick("prefill", REQUEST, snaps(p1, p2)) == p1
    assert scheduler.pick("decode", REQUEST, snaps(A, B)) == B
    assert scheduler.pick("prefill", REQUEST, snaps(p1, p2)) == p2


def test_round_robin_refuses_an_empty_candidate_list() -> None:
    with pytest.raises(ValueError, match="no candidates"):
        RoundRobin().pick("decode", REQUEST, [])


def test_the_spec_policy_names_the_scheduler() -> None:
    assert isinstance(scheduler_for("round-robin"), RoundRobin)
    with pytest.raises(ConfigurationError, match="known: least-load, prefix, round-robin, tandem"):
        scheduler_for("coin-toss")
