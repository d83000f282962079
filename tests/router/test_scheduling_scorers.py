"""The four scorers, the imbalance guard and the picker as tables: pure functions of plain data.

Nothing is faked: candidates are built directly (`tests.router.scheduling_builders`); expected values
are the worked examples of the scorers' docstrings and docs/routing.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from tests.router.scheduling_builders import A, B, C, candidate, cycle, host, request

from tandem.router.scheduling.filters import ImbalanceGuard
from tandem.router.scheduling.picker import MaxScorePicker
from tandem.router.scheduling.plugins import Candidate, Cycle, Scored
from tandem.router.scheduling.scorers import (
    ANCHOR_BLOCK_SIZE,
    ANCHOR_BLOCKS,
    FILL_SLACK,
    KVScorer,
    LoadScorer,
    PrefixScorer,
    TTFTScorer,
    min_max_low_is_best,
    rendezvous_weight,
)
from tandem.router.scheduling.tandem import CacheHitScorer
from tandem.router.types import RequestView, Route

A_URL, B_URL, C_URL = A.url, B.url, C.url


def rounded(scores: dict[str, float] | object) -> dict[str, float]:
    assert isinstance(scores, dict)
    return {host_of(url): round(value, 4) for url, value in scores.items()}


def host_of(url: str) -> str:
    return url.split("//")[1].split(":")[0]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"a": 2, "b": 5, "c": 8}, {"a": 1.0, "b": 0.5, "c": 0.0}, id="spread"),
        pytest.param({"a": 3, "b": 3}, {"a": 1.0, "b": 1.0}, id="all-equal-all-best"),
        pytest.param({"a": 7}, {"a": 1.0}, id="one"),
        pytest.param({}, {}, id="none"),
    ],
)
def test_min_max_gives_the_lowest_value_1_and_the_highest_0(
    values: dict[str, float], expected: dict[str, float]
) -> None:
    assert min_max_low_is_best(values) == expected


@pytest.mark.parametrize(
    ("candidates", "prompt_tokens", "expected"),
    [
        pytest.param(
            [candidate(A, matched=960, fill=0.5), candidate(B, fill=0.2), candidate(C, fill=0.2)],
            1000,
            {"10.0.0.1": 0.96, "10.0.0.2": 0.0, "10.0.0.3": 0.0},
            id="cached-prompt-follows-its-cache",
        ),
        pytest.param(
            [candidate(A, fill=0.5), candidate(B, fill=0.2), candidate(C, fill=0.3)],
            1000,
            {"10.0.0.1": 0.0, "10.0.0.2": 1.0, "10.0.0.3": 0.6667},
            id="new-prompt-goes-to-the-emptiest-cache",
        ),
        pytest.param(
            [candidate(A, matched=100, fill=0.5), candidate(B, fill=0.2), candidate(C, fill=0.2)],
            1000,
            {"10.0.0.1": 0.1, "10.0.0.2": 0.6667, "10.0.0.3": 0.6667},
            id="a-match-below-the-threshold-blends-with-availability",
        ),
        pytest.param(
            [candidate(A, matched=400, fill=0.9), candidate(B, fill=0.1)],
            1000,
            {"10.0.0.1": 0.4, "10.0.0.2": 0.0},
            id="a-match-above-the-threshold-is-kept",
        ),
        pytest.param(
            [candidate(A, matched=1000), candidate(B, matched=1000)],
            1000,
            {"10.0.0.1": 1.0, "10.0.0.2": 1.0},
            id="cached-everywhere",
        ),
        pytest.param(
            [candidate(A), candidate(B)], 0, {"10.0.0.1": 1.0, "10.0.0.2": 1.0}, id="empty-prompt-equal-fills"
        ),
        pytest.param(
            [candidate(A, fill=0.5, load=2), candidate(B, fill=0.2, load=4), candidate(C, fill=0.3, load=2)],
            1000,
            {"10.0.0.1": 0.0, "10.0.0.2": 0.0, "10.0.0.3": 1.0},
            id="availability-among-the-least-loaded",
        ),
        pytest.param(
            [candidate(A, fill=0.5, load=2), candidate(B, fill=0.2, load=3), candidate(C, fill=0.3, load=2)],
            1000,
            {"10.0.0.1": 0.0, "10.0.0.2": 1.0, "10.0.0.3": 0.6667},
            id="one-request-more-is-within-the-slack",
        ),
        pytest.param(
            [candidate(A, fill=0.9, load=1), candidate(B, fill=0.9, load=1), candidate(C, fill=0.0, load=3)],
            1000,
            {"10.0.0.1": 1.0, "10.0.0.2": 1.0, "10.0.0.3": 0.0},
            id="a-new-engines-empty-cache-does-not-outweigh-its-queue",
        ),
        pytest.param(
            [
                candidate(A, fill=0.2, load=1, queued=3000),
                candidate(B, fill=0.3, load=4),
                candidate(C, fill=0.2, load=6),
            ],
            1000,
            {"10.0.0.1": 0.0, "10.0.0.2": 1.0, "10.0.0.3": 0.0},
            id="a-new-prompt-does-not-queue-behind-another-prefill-for-fewer-decoding-requests",
        ),
        pytest.param(
            [
                candidate(A, fill=0.2, load=1, queued=200),
                candidate(B, fill=0.3, load=4),
                candidate(C, fill=0.2, load=2),
            ],
            1000,
            {"10.0.0.1": 1.0, "10.0.0.2": 0.0, "10.0.0.3": 1.0},
            id="prompt-work-within-a-quarter-of-the-prompt-counts-as-none",
        ),
    ],
)
def test_prefix_scorer_is_the_cached_share_and_spreads_prompts_cached_nowhere(
    candidates: list[Candidate], prompt_tokens: int, expected: dict[str, float]
) -> None:
    assert rounded(PrefixScorer().score(cycle(prompt_tokens=prompt_tokens), candidates)) == expected


def anchored(tokens: list[int]) -> Cycle:
    """A cycle whose request has real prompt tokens, so its block keys anchor a home."""
    return Cycle(
        pool="decode", profile="prompt", request=request(tokens), prompt_tokens=len(tokens), slo_ttft_s=1.0
    )


def home_of(tokens: list[int], urls: list[str]) -> str:
    anchor = request(tokens).block_keys(ANCHOR_BLOCK_SIZE)[ANCHOR_BLOCKS - 1]
    return max(urls, key=lambda url: rendezvous_weight(anchor, url))


def test_a_new_prompt_goes_to_its_rendezvous_home_among_the_emptiest_caches() -> None:
    """Every gateway (a restarted one, a replica) sends a new prompt to the same engine where caches
    have room; each prompt has its own home, so prompts spread; a fuller cache is not eligible."""
    prompts = [[group] * 8 + list(range(1000)) for group in range(40)]
    urls = [A_URL, B_URL, C_URL]
    homes = [home_of(p, urls) for p in prompts]
    assert set(homes) == set(urls)  # the homes spread over the engines
    for tokens, home in zip(prompts, homes, strict=True):
        equal = [candidate(A, fill=0.3), candidate(B, fill=0.3), candidate(C, fill=0.3)]
        scores = PrefixScorer().score(anchored(tokens), equal)
        assert max(scores, key=scores.__getitem__) == home and scores[home] == 1.0
        assert sorted(scores.values()) == [0.5, 0.5, 1.0]  # the others: OTHERS × availability (all 1)
        again = PrefixScorer().score(anchored(tokens), list(reversed(equal)))  # another gateway's order
        assert again == scores
    # Fills within FILL_SLACK of the emptiest are eligible, fuller ones are not.
    tokens = next(p for p, home in zip(prompts, homes, strict=True) if home == A_URL)
    near = [candidate(A, fill=0.1 + FILL_SLACK - 0.01), candidate(B, fill=0.1), candidate(C, fill=0.3)]
    assert rounded(PrefixScorer().score(anchored(tokens), near))["10.0.0.1"] == 1.0
    far = [candidate(A, fill=0.1 + FILL_SLACK + 0.01), candidate(B, fill=0.1), candidate(C, fill=0.3)]
    scores = rounded(PrefixScorer().score(anchored(tokens), far))
    assert scores["10.0.0.1"] < 1.0 and max(scores.values()) == 1.0


def test_the_anchor_reuses_the_keys_of_the_indexs_block_size() -> None:
    """With the router index's block sizes (32 here), the anchor is a key of that size, the one the
    prefix match already computed: no second hashing of the prompt at another size."""
    tokens = list(range(1000))
    asked: list[int] = []

    class Counting(RequestView):
        def block_keys(self, block_size: int) -> Sequence[int]:
            asked.append(block_size)
            return super().block_keys(block_size)

    view = Counting(request_id="r", route=Route.COMPLETIONS, prompt_token_ids=tuple(tokens))
    equal = [candidate(A, fill=0.3), candidate(B, fill=0.3), candidate(C, fill=0.3)]
    cycle_32 = Cycle(pool="decode", profile="prompt", request=view, prompt_tokens=1000, slo_ttft_s=1.0)
    scores = PrefixScorer(block_size=lambda url: 32).score(cycle_32, equal)
    anchor = request(tokens).block_keys(32)[ANCHOR_BLOCKS - 1]
    assert max(scores, key=scores.__getitem__) == max(
        (A_URL, B_URL, C_URL), key=lambda url: rendezvous_weight(anchor, url)
    )
    assert asked == [32]


def test_a_prompt_shorter_than_a_block_goes_to_the_emptiest_cache() -> None:
    candidates = [candidate(A, fill=0.5), candidate(B, fill=0.2), candidate(C, fill=0.3)]
    scores = rounded(PrefixScorer().score(anchored(list(range(10))), candidates))
    assert scores == {"10.0.0.1": 0.0, "10.0.0.2": 1.0, "10.0.0.3": 0.6667}


def test_a_cached_prompt_ignores_its_home() -> None:
    tokens = list(range(1000))
    urls = [A_URL, B_URL]
    other = next(e for e in (A, B) if e.url != home_of(tokens, urls))
    candidates = [
        candidate(A, matched=960 if other is A else 0),
        candidate(B, matched=960 if other is B else 0),
    ]
    scores = PrefixScorer().score(anchored(tokens), candidates)
    assert scores[other.url] == 0.96 and min(scores.values()) == 0.0


def test_load_scorer_is_min_max_over_the_candidates_load() -> None:
    scores = LoadScorer().score(cycle(), [candidate(A, load=2), candidate(B, load=5), candidate(C, load=8)])
    assert rounded(scores) == {"10.0.0.1": 1.0, "10.0.0.2": 0.5, "10.0.0.3": 0.0}


@pytest.mark.parametrize(
    ("usage", "expected"),
    [(0.2, 0.8), (0.0, 1.0), (1.0, 0.0), (None, 0.5)],
    ids=["used-0.2", "empty", "full", "unknown-is-neutral"],
)
def test_kv_scorer_is_free_cache(usage: float | None, expected: float) -> None:
    assert rounded(KVScorer().score(cycle(), [candidate(A, kv_usage=usage)])) == {"10.0.0.1": expected}


@pytest.mark.parametrize(
    ("slo", "predictions", "expected"),
    [
        pytest.param(1.0, (0.25, 1.3), (0.75, 0.0), id="headroom-and-late"),
        pytest.param(1.0, (0.0, 0.5), (1.0, 0.5), id="instant-start"),
        pytest.param(0.1, (0.25, 1.3), (1.0, 0.1923), id="all-late-least-late-best"),
        pytest.param(2.0, (1.0, 1.0), (0.5, 0.5), id="equal"),
    ],
)
def test_ttft_scorer_is_the_share_of_the_slo_left(
    slo: float, predictions: tuple[float, float], expected: tuple[float, float]
) -> None:
    candidates = [
        candidate(A, predicted_ttft_s=predictions[0]),
        candidate(B, predicted_ttft_s=predictions[1]),
    ]
    scores = TTFTScorer().score(cycle(slo_ttft_s=slo), candidates)
    assert rounded(scores) == {"10.0.0.1": expected[0], "10.0.0.2": expected[1]}


@pytest.mark.parametrize(
    ("matches", "expected"),
    [
        pytest.param((960, 960, 0), (1.0, 1.0, 0.0), id="best-matches-above-threshold"),
        pytest.param((200, 0, 0), (0.0, 0.0, 0.0), id="below-threshold-no-hit"),
    ],
)
def test_the_prefix_baseline_hit_scorer_marks_the_best_match_above_the_threshold(
    matches: tuple[int, int, int], expected: tuple[float, float, float]
) -> None:
    candidates = [candidate(e, matched=m) for e, m in zip((A, B, C), matches, strict=True)]
    scores = CacheHitScorer(threshold=0.3).score(cycle(prompt_tokens=1000), candidates)
    assert [scores[e.url] for e in (A, B, C)] == list(expected)


@pytest.mark.parametrize(
    ("loads", "kept"),
    [
        pytest.param((9, 3, 5), ["10.0.0.2", "10.0.0.3"], id="drops-the-overloaded"),
        pytest.param((9, 0, 5), ["10.0.0.2"], id="against-an-idle-one-both-go"),
        pytest.param((7, 3, 5), ["10.0.0.1", "10.0.0.2", "10.0.0.3"], id="within-abs-threshold"),
        pytest.param((40, 30, 30), ["10.0.0.1", "10.0.0.2", "10.0.0.3"], id="within-rel-threshold"),
        pytest.param((5, 5, 5), ["10.0.0.1", "10.0.0.2", "10.0.0.3"], id="balanced"),
    ],
)
def test_imbalance_guard_drops_endpoints_overloaded_against_the_least_loaded(
    loads: tuple[int, int, int], kept: list[str]
) -> None:
    guard = ImbalanceGuard(abs_threshold=4, rel_threshold=1.5)
    candidates = [candidate(e, load=load) for e, load in zip((A, B, C), loads, strict=True)]
    assert [host(c.endpoint) for c in guard.filter(cycle(), candidates)] == kept


def test_imbalance_guard_defaults_are_sglangs() -> None:
    guard = ImbalanceGuard()
    assert (guard.abs_threshold, guard.rel_threshold) == (64.0, 1.5)


def scored(c: Candidate, total: float) -> Scored:
    return Scored(candidate=c, total=total, scores={})


def test_picker_takes_the_highest_total() -> None:
    chosen = MaxScorePicker().pick([scored(candidate(A), 4.2), scored(candidate(B), 5.0)])
    assert chosen.candidate.endpoint == B


def test_picker_breaks_ties_by_in_flight_then_by_turns_then_by_url() -> None:
    picker = MaxScorePicker()
    busy_a, idle_b, idle_c = candidate(A, in_flight=2), candidate(B), candidate(C)
    assert picker.pick([scored(busy_a, 5), scored(idle_c, 5), scored(idle_b, 5)]).candidate.endpoint == B
    assert picker.pick([scored(busy_a, 5), scored(idle_c, 5), scored(idle_b, 5)]).candidate.endpoint == C
    assert picker.pick([scored(busy_a, 5), scored(idle_c, 5), scored(idle_b, 5)]).candidate.endpoint == B


def test_picker_refuses_nothing() -> None:
    with pytest.raises(ValueError, match="nothing to pick"):
        MaxScorePicker().pick([])


def test_prefix_scorer_refuses_a_threshold_outside_0_1() -> None:
    with pytest.raises(ValueError, match="threshold"):
        PrefixScorer(threshold=0)
