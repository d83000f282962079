"""Whether the engines write the KV-pool chunk keys the gateway computes: a self-check, pure.

The gateway computes the prefill engines' chunk keys (`tandem.kvpool.keys.PoolKeys`) from how they
were started; nothing tells it whether the engines agree (another LMCache version, another
PYTHONHASHSEED, another image). With keys that do not match, no look-up ever finds a chunk and every
KV barrier waits its whole timeout before the request goes decode-only. So the keys start
**unverified** and what the pool answers decides:

    evidence (`barrier_evidence`, `lookup_evidence`)            unverified   verified   mismatch
    hit:  a barrier found the prompt's chunks (all, or some     → verified   —          → verified
          by its timeout), or a look-up found a leading chunk
    miss: a barrier after a good prefill timed out and found    misses + 1;  —          —
          none of the prompt's chunks                           the Nth →
                                                                mismatch
    none: Redis did not answer (`pool_unavailable`), or the     —            —          —
          prompt is shorter than one chunk

Before a miss counts, the P/D step asks the pool whether it holds that prompt under another layout
the same engines may write (`KVPoolIndex.adopt_alternative`; for LMCache's keys, LMCache 0.3's, the
default engine image's): if it does, the gateway computes those keys from then on and the miss is a
hit. A hit is proof that the engines write these keys, so **verified** is for good. `misses_to_mismatch`
(`MISSES_TO_MISMATCH`, 4) misses before any hit mean the engines write other keys (or none): in
**mismatch** the gateway stops the barrier and the pool look-ups of the P/D decision (`lookups_on`,
`barrier_due`), as if it could not compute the keys, except that one request per `recheck_after_s`
(`RECHECK_AFTER_S`, 5 minutes) still waits at the barrier (a probe, `barrier_due`), so keys that
start to appear (an engine redeployed, a pool that was empty for another reason) turn the look-ups
back on. A dead Redis never counts: its answers are `none`.

Worked example (N = 4, recheck 300 s): prefills at t = 0, 1, 2, 3 s each time out with none of their
chunks in the pool → misses 1, 2, 3, 4 → mismatch at t = 3; requests until t = 303 skip the barrier;
the one after a prefill at t = 310 waits (the probe; the next may at 610): a hit → verified.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tandem.kvpool.keys import LMCache03Hash, LMCacheHash, PoolKeys

KeysState = Literal["unverified", "verified", "mismatch"]
Evidence = Literal["hit", "miss", "none"]

#: Every state, in the order the metric lists them.
STATES: tuple[KeysState, ...] = ("unverified", "verified", "mismatch")
#: Barrier misses before any hit after which the gateway concludes the engines write other keys.
MISSES_TO_MISMATCH = 4
#: Seconds between probes in mismatch: one request waits at the barrier again.
RECHECK_AFTER_S = 300.0


def barrier_evidence(outcome: str, *, chunks: int, found: int) -> Evidence:
    """What one barrier says about the keys. `outcome`: `ok`, `timeout` or `pool_unavailable`;
    `chunks`: the prompt's full chunks it waited for; `found`: how many were there at its last check.
    Example: timeout with 3 chunks and 1 found → hit (the engines write these keys, one was slow)."""
    if outcome == "pool_unavailable" or chunks == 0:
        return "none"
    if outcome == "ok" or found > 0:
        return "hit"
    return "miss"


def lookup_evidence(pooled_tokens: int | None) -> Evidence:
    """What one look-up says: a leading chunk found (tokens > 0) is a hit; nothing found is no
    evidence (the prompt may be new), and neither is an unavailable pool (None)."""
    return "hit" if pooled_tokens else "none"


@dataclass(slots=True, kw_only=True)
class PoolKeysCheck:
    """The self-check's state (module docstring); one per gateway process, held by the P/D step.
    Times are the caller's monotonic clock seconds."""

    misses_to_mismatch: int = MISSES_TO_MISMATCH
    recheck_after_s: float = RECHECK_AFTER_S
    state: KeysState = "unverified"
    misses: int = 0
    next_probe_at: float = 0.0

    def __post_init__(self) -> None:
        if self.misses_to_mismatch < 1:
            raise ValueError(f"misses_to_mismatch must be at least 1, got {self.misses_to_mismatch}")

    @property
    def lookups_on(self) -> bool:
        """Whether the P/D decision asks the pool for a prompt's cached prefix."""
        return self.state != "mismatch"

    def barrier_due(self, now: float) -> bool:
        """Whether a request that just prefilled waits at the barrier: yes unless in mismatch; in
        mismatch, one request per `recheck_after_s` (asking takes that turn)."""
        if self.state != "mismatch":
            return True
        if now < self.next_probe_at:
            return False
        self.next_probe_at = now + self.recheck_after_s
        return True

    def observe(self, evidence: Evidence, *, now: float) -> KeysState | None:
        """Record one barrier's or look-up's evidence; the new state when it changed, else None."""
        if evidence == "hit" and self.state != "verified":
            self.state = "verified"
            return self.state
        if evidence == "miss" and self.state == "unverified":
            self.misses += 1
            if self.misses >= self.misses_to_mismatch:
                self.state = "mismatch"
                self.next_probe_at = now + self.recheck_after_s
                return self.state
        return None


def mismatch_message(keys: PoolKeys, *, misses: int, recheck_after_s: float) -> str:
    """The error line logged once when the check concludes mismatch: the keys looked for and what
    to check. The key's fields go with it as structured fields (`keys_fields`)."""
    scheme = keys.scheme.name
    check = (
        "the engines' PYTHONHASHSEED (engineKvKeys.pythonHashSeed in the router config), their LMCache "
        "version (the gateway computes LMCache 0.5.6's keys, and 0.3's when it finds those) and the "
        "engine image (spec.engine.image)"
        if scheme.startswith("lmcache")
        else "that the engines run Tandem's connector or the simulator with the same Tandem version"
    )
    # Tandem's keys count pipeline stages (one entry per KV head) where LMCache's count ranks.
    grid = "pipeline stages" if scheme.startswith("tandem") else "world size"
    return (
        f"kv pool keys mismatch: after {misses} prefills none of the prompts' chunks appeared in the "
        f"KV pool under the keys the gateway computes ({scheme} hash, model {keys.model!r}, "
        f"dtype {keys.dtype}, {grid} {keys.world_size}, worker {keys.worker_id}): the engines "
        "write other keys, or none. The gateway stops the KV barrier and the pool look-ups of the P/D "
        "decision (decisions use the decode engine's local prefix; the engines' connector still "
        f"loads what the pool holds) and checks again every {recheck_after_s:g} s. Check {check}, "
        "and compare with the keys in the pool (`tandem kvpool stats`)"
    )


def keys_fields(keys: PoolKeys) -> dict[str, object]:
    """The keys' fields for a structured log line (LMCache's: with the NONE_HASH they start from)."""
    fields: dict[str, object] = {
        "key_hash": keys.scheme.name,
        "key_model": keys.model,
        "key_dtype": keys.dtype,
        "key_world_size": keys.world_size,
        "key_worker_id": keys.worker_id,
    }
    if isinstance(keys.scheme, LMCacheHash | LMCache03Hash):
        fields["key_none_hash"] = keys.scheme.none_hash
    return fields
