"""The scorers. Each is a pure function of the cycle and the candidates, returning [0, 1] per
candidate URL, 1 best. Weights live in `spec.router.scoring` (the adapter scorer's is
`ADAPTER_WEIGHT`, on for services with LoRA adapters); the runner applies them.

| scorer | formula | default weight |
|---|---|---|
| `prefix` | `r_p + max(0, 1 − r_max/0.3)·a_p`, `r_p = matched_p / n`, `a_p`: least routed cache | 3 |
| `load` | `(L_max − L_p) / (L_max − L_min)`, 1 for all when equal (llm-d's queue-scorer) | 2 |
| `kv` | `1 − kv_usage_p`; 0.5 when unknown or stale (llm-d's kv-cache-utilization-scorer) | 2 |
| `ttft` | `1 − TTFT̂_p / SLO` clamped; when every candidate is past the SLO, `TTFT̂_min / TTFT̂_p` | 2 |
| `lora-affinity` | 1 running or held there, 0.8 a free adapter slot, 0.6 it waits there, else 0 | 4 |
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from tandem.router.scheduling.pinned import PinnedTraffic
from tandem.router.scheduling.plugins import Candidate, Cycle
from tandem.router.types import AdapterLoad

if TYPE_CHECKING:
    from tandem.router.scheduling.runner import Decision

#: KV score of an endpoint whose usage is unknown or stale: neither preferred nor avoided.
NEUTRAL = 0.5
#: SGLang's `cache_threshold`: below this share of the prompt cached anywhere, a prompt counts as new.
DEFAULT_THRESHOLD = 0.3
#: Requests above the least loaded candidate's load within which a new prompt still goes by cache fill.
LOAD_SLACK = 1.0
#: Share of the prompt's own tokens of queued prefill work above the least within which it still does.
QUEUE_SLACK = 0.25
#: Leading blocks of a prompt that name it for placement (`PrefixScorer`'s home): 128 tokens in
#: blocks of 16, past a chat template's header and into the system prompt that requests share.
ANCHOR_BLOCKS = 8
#: The block size of the anchor's keys without the router's index (vLLM's default).
ANCHOR_BLOCK_SIZE = 16
#: Cache fill above the emptiest nearby candidate's within which a new prompt still goes to its home.
#: Below one prompt's share of a small cache (tests/router/test_routing_sims.py: 0.39), so small
#: caches fill evenly; far above it in large ones, where a prompt is a sliver and the home decides.
FILL_SLACK = 0.2
#: The most a new prompt's other nearby candidates score for availability (the home scores 1).
OTHERS = 0.5
#: The adapter scorer's weight: KServe's for llm-d's lora-affinity scorer (next to its prefix
#: scorer's 3 and load's 2, as here), so an engine holding the adapter is preferred unless another
#: holds much more of the prompt or is much less loaded.
ADAPTER_WEIGHT = 4.0


def min_max_low_is_best(values: Mapping[str, float]) -> dict[str, float]:
    """`(max − v) / (max − min)` per key; every key scores 1 when all values are equal.
    Example: {a: 2, b: 5, c: 8} → {a: 1.0, b: 0.5, c: 0.0}."""
    if not values:
        return {}
    low, high = min(values.values()), max(values.values())
    if high == low:
        return dict.fromkeys(values, 1.0)
    return {key: (high - value) / (high - low) for key, value in values.items()}


class PrefixScorer:
    """Prefix-cache overlap; prompts cached nowhere (yet) are spread to the emptiest caches of the
    least loaded endpoints.

        r_p = matched_p / n                       (share of the prompt cached on p, in full blocks)
        a_p = min-max of cache_fill_p over the candidates near the least prompt work and load
              (below), the lowest fill scoring 1 (1 when all equal); 0 for the others
        s   = max(0, 1 − r_max / θ)               (θ = `threshold`, SGLang's cache_threshold 0.3)
        score_p = r_p + s · a_p                   (≤ 1)

    When some endpoint caches at least θ of the prompt, s = 0 and the score is the overlap itself
    (llm-d's `matchBlocks/totalBlocks`). When none caches anything, s = 1 and the score is cache
    availability, so new prefixes go to the endpoint holding the least routed prefix state (SGLang's
    "smallest tree" below its threshold) instead of all landing on the first endpoint; in between
    the two blend linearly.

    Which of the emptiest caches a new prompt goes to is not left to arrival order: it goes to its
    *home*, the first of them in the prompt's rendezvous order (`rendezvous_weight` of its anchor,
    the chained key of its first `ANCHOR_BLOCKS` blocks, and the endpoint's URL). Among the
    candidates near the least load and queue, those whose fill is within `FILL_SLACK` of the
    emptiest are eligible; the home scores 1, the others `OTHERS` × their availability. So caches
    still fill evenly (a prompt that fills a small cache by more than the slack sends the next new
    one elsewhere), but where they have room, every gateway replica, worker and restart sends the
    same new prompt to the same engine: a gateway that has just started finds the prefixes its
    predecessor left in warm engines instead of placing them anew. A prompt shorter than a block
    has no anchor and goes to the emptiest cache.

    Availability counts only near the least load. Min-max over every candidate gave an engine that
    had just joined (its cache empty, the others' full) 1 against 0 for every new prompt, which at
    weight 3 beat the load scorer's 2: at a scale-up the new engine took every new prompt until its
    queue was seconds long (measured in docs/autoscaler.md). Exactly the least loaded alone was too
    narrow: loads one request apart are the usual state of a busy pool, and new prefixes placed by
    load there evicted each other in small caches (tests/router/test_routing_sims.py: hit rate
    0.85 → 0.73–0.80). `L` is `Candidate.load`, as the load scorer reads it.

    Prompt work ahead comes first: near means within `QUEUE_SLACK` (a quarter of the prompt) of the
    least queued prefill work (`Candidate.queued_tokens`, the uncached tokens sent to an engine
    without a first token yet), and of those within `LOAD_SLACK` of the least load. A new prompt
    sent behind another one waits for that whole prefill, which is what makes a shared-prefix
    workload's TTFT bimodal, while requests that are decoding cost it little. Load first and work
    second left only the engine with the fewest requests whenever the others held one more, so
    three new prompts arriving within 20 ms all went to the one engine that had just taken the
    first of them (docs/routing.md).

    A long new prompt also avoids the engines whose recent traffic was pinned to their caches
    (`pinned.PinnedTraffic`, given as `pinned`): its prefill holds the engine it goes to, and the
    requests only that engine's cache serves would wait for it. Among the candidates near the least
    work and load, only those with the least pinned share (within its slack) may be its home.

    Example, n = 1000, fills A 0.5, B 0.2, C 0.2, loads equal: A holds 960 (r = 0.96 ≥ 0.3, s = 0) →
    A 0.96, B = C = 0. A new prompt (s = 1) → A 0, B = C = 1. A holds 100 (r_max = 0.1, s = 2/3) →
    A 0.1, B = C = 0.667: a match that weak is not worth filling a fuller cache further. A new
    prompt with loads A 2, B 4, C 2 → A 0, B 0, C 1; with B at 3 → A 0, B 1, C 0.667. With an
    anchor (the prompt spans a block): fills A 0.5, B 0.2, C 0.3 and the anchor's order C, B, A →
    eligible B and C (within 0.2 of B's 0.2), home C → A 0, B 0.5, C 1. A new prompt, n = 1000,
    loads A 1, B 4, C 6, A computing 3,000 uncached tokens, B and C none → A 0, B 1, C 0: B is the
    least loaded of the engines with no prompt work ahead.
    """

    name = "prefix"

    def __init__(
        self,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        block_size: Callable[[str], int] | None = None,
        pinned: PinnedTraffic | None = None,
    ) -> None:
        """`block_size`: each endpoint's block size as the router's index knows it, so the anchor
        reuses the keys the match computed (None: `ANCHOR_BLOCK_SIZE` for every endpoint);
        `pinned`: the engines' pinned traffic a long new prompt avoids (None: not considered)."""
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold
        self.block_size = block_size
        self.pinned = pinned

    def picked(self, decision: Decision, /) -> None:
        """The `PostPick` hook: the decision counts in the engines' pinned traffic."""
        if self.pinned is not None:
            self.pinned.picked(decision)

    def score(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Mapping[str, float]:
        n = cycle.prompt_tokens
        ratios = {c.url: c.matched_tokens / n if n > 0 else 0.0 for c in candidates}  # matched ≤ n
        spread = 1.0 - max(ratios.values(), default=0.0) / self.threshold
        if spread <= 0.0:  # some endpoint caches at least θ of the prompt: the overlap alone
            return ratios
        # The candidates with the least prompt work ahead: a new prompt sent behind another one
        # waits for its whole prefill (the slow mode of a shared-prefix workload's TTFT) ...
        least = min(c.queued_tokens for c in candidates)
        free = [c for c in candidates if c.queued_tokens <= least + QUEUE_SLACK * n]
        # ... and of those, the least loaded.
        lowest = min(c.load for c in free)
        near = [c for c in free if c.load <= lowest + LOAD_SLACK]
        if self.pinned is not None:  # ... and of those, a long prompt's with the least pinned traffic
            near = list(self.pinned.keep(cycle, near))
        fills = {c.url: c.cache_fill for c in near}
        availability = min_max_low_is_best(fills)
        size = ANCHOR_BLOCK_SIZE if self.block_size is None else min(map(self.block_size, fills))
        keys = cycle.request.block_keys(size) if n > 0 else ()
        if keys:
            anchor = keys[min(ANCHOR_BLOCKS, len(keys)) - 1]
            emptiest = min(fills.values())
            eligible = [url for url, fill in fills.items() if fill <= emptiest + FILL_SLACK]
            home = max(eligible, key=lambda url: rendezvous_weight(anchor, url))
            availability = {url: 1.0 if url == home else OTHERS * a for url, a in availability.items()}
        return {url: ratio + spread * availability.get(url, 0.0) for url, ratio in ratios.items()}


class LoadScorer:
    """Queue + running load, min-max normalised over the candidates (llm-d's queue-scorer):

        score_p = (L_max − L_p) / (L_max − L_min),   1 for every candidate when all L are equal

    with `L_p = Candidate.load`. Example: loads A 2, B 5, C 8 → A 1.0, B 0.5, C 0.0.
    """

    name = "load"

    def score(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Mapping[str, float]:
        return min_max_low_is_best({c.url: c.load for c in candidates})


class KVScorer:
    """Free KV cache: `score_p = 1 − kv_usage_p` (llm-d's kv-cache-utilization-scorer), `NEUTRAL`
    (0.5) when the engine's usage is unknown or stale. Example: usage 0.2 → 0.8; none → 0.5."""

    name = "kv"

    def score(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Mapping[str, float]:
        return {c.url: NEUTRAL if c.kv_usage is None else 1.0 - c.kv_usage for c in candidates}


class TTFTScorer:
    """Headroom against the request's TTFT objective, from `Candidate.predicted_ttft_s` (TTFT̂):

        score_p = clamp(1 − TTFT̂_p / SLO, 0, 1)            if some candidate has TTFT̂ < SLO
        score_p = TTFT̂_min / TTFT̂_p                        if every candidate is at or past it

    The fraction of the objective left: 1 for an instant start, 0 at or past the objective; when all
    are late the least late still scores best. Example, SLO 1 s: TTFT̂ A 0.25 s, B 1.3 s → A 0.75,
    B 0; SLO 0.1 s with the same predictions → A 1.0, B 0.25/1.3 = 0.19.
    """

    name = "ttft"

    def score(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Mapping[str, float]:
        slo = cycle.slo_ttft_s
        predictions = {c.url: p if (p := c.predicted_ttft_s) > 0.0 else 0.0 for c in candidates}
        if any(p < slo for p in predictions.values()):  # then 1 − p/slo is in (0, 1] for p < slo
            return {url: 1.0 - p / slo if p < slo else 0.0 for url, p in predictions.items()}
        fastest = min(predictions.values(), default=0.0)
        return {url: fastest / p if p > 0 else 1.0 for url, p in predictions.items()}


class Holdings(Protocol):
    """Which adapters the gateway sent to which engine lately (`adapterplace.Residency`)."""

    def holds(self, url: str, adapter: str, /) -> bool: ...


class AdapterAffinityScorer:
    """Prefers the engines already running or holding the request's LoRA adapter, then those with a
    free adapter slot (llm-d's lora-affinity scorer), from each engine's `vllm:lora_requests_info`
    (`EngineStats.adapters`) and the gateway's own record (`residency`, `Holdings`):

        1.0  the adapter has requests running there (no load: its weights are in a GPU slot), or
             the gateway sent it there lately (its CPU tier, likely a GPU slot, still holds it:
             `vllm:lora_requests_info` names only adapters with requests now)
        0.8  fewer adapters in use than `max_lora` (room to load it without waiting for a slot)
        0.6  the adapter has requests waiting there
        0    otherwise (every slot taken by other adapters: the request waits for one)
        0.5  the engine's numbers are unknown or stale (`NEUTRAL`)

    plus up to `HOME_BONUS` by the engine's place in the adapter's rendezvous order (`home_ranks`),
    capped at 1: between bursts an adapter's requests go back to the same engines, whose CPU tier
    still holds its weights, rather than wherever a slot is free (which spreads every adapter over
    every engine and loads it everywhere).

    An engine with a fresh reading but no such series has served no adapter since it started:
    every slot is free (0.8). In vLLM 0.32 both labels name every adapter with a request, so the
    adapters in use are their union (llm-d adds the two counts, which counts each twice there).
    A request for the base model scores 1 everywhere: no preference. Example, max_lora 2, request
    `sql`: A running {sql} → 1.0; B running {chat} → 0.8; C running {chat, math} → 0; D unscraped
    → 0.5."""

    name = "lora-affinity"

    def __init__(self, *, residency: Holdings | None = None) -> None:
        self.residency = residency

    def score(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Mapping[str, float]:
        adapter = cycle.request.lora_name
        if adapter is None:
            return dict.fromkeys((c.url for c in candidates), 1.0)
        home = home_ranks(adapter, [c.url for c in candidates])
        last = max(len(candidates) - 1, 1)
        held = self.residency
        return {
            c.url: 1.0
            if held is not None and held.holds(c.url, adapter)
            else min(1.0, _affinity(c, adapter) + HOME_BONUS * (1.0 - home[c.url] / last))
            for c in candidates
        }


#: What an adapter's first home engine adds to its affinity score, falling linearly to 0 for its last
#: (rendezvous order, `home_ranks`): a free slot there scores 0.95, close to an engine running the
#: adapter, so an adapter keeps going where its weights already are between bursts, while the load
#: scorer (weight 2, a range of 2) still spreads a hot adapter over more engines as their queues grow.
HOME_BONUS = 0.15


def home_ranks(adapter: str, urls: Sequence[str]) -> dict[str, int]:
    """Each engine's rank in the adapter's rendezvous order (0 first): every gateway replica and
    worker ranks the same engines alike, and an engine joining or leaving moves only the adapters it
    ranks first (highest random weight hashing).

    >>> ranks = home_ranks("sql", ["a", "b", "c"]); sorted(ranks.values())
    [0, 1, 2]"""
    weights = {url: rendezvous_weight(adapter, url) for url in urls}
    order = sorted(urls, key=lambda u: weights[u], reverse=True)
    return {url: rank for rank, url in enumerate(order)}


def rendezvous_weight(name: object, url: str) -> int:
    """Highest-random-weight hashing: `name`'s weight at `url`, the same in every process (BLAKE2b,
    not Python's salted `hash`). The URL of highest weight is `name`'s home."""
    return int.from_bytes(hashlib.blake2b(f"{name}\x1f{url}".encode(), digest_size=8).digest(), "big")


def _affinity(candidate: Candidate, adapter: str) -> float:
    engine = candidate.snapshot.engine
    if engine is None or engine.stale:
        return NEUTRAL
    load: AdapterLoad | None = engine.stats.adapters
    if load is None:
        return 0.8
    if adapter in load.running:
        return 1.0
    if load.max_loras is None or len(load.active) < load.max_loras:
        return 0.8
    return 0.6 if adapter in load.waiting else 0.0
