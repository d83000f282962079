"""How long the next request takes to reach its decode engine and start: how early a slot is handed over.

The handover (`tandem.router.pipeline.meter`) gives a stream's slot to the next waiting request a few
tokens before the stream ends, so the next one reaches the engine while this one finishes. With the
prompt prefilled on the decode engine itself that is all it takes: the new request is in the engine's
batch from its first step. Disaggregated, the next request first passes the prefill pool and the KV
handoff, and only then does the decode engine take it in: its slot stands empty for that long at
every turnover. On KV-cache-bound decode engines under a flood (docs/benchmarks.md §0, "With
prefill/decode disaggregation") a heavy tenant gets 0.87× the requests per second vllm-router's
round robin gets from the same engines.

With `--handover-lead on` (off by default: below) a stream hands over when what is left of it takes
no longer than that *lead*: left tokens × its own time per token ≤ lead + `handover_tokens` tokens.
The lead is learned from the requests themselves, per gateway process, over the last `WINDOW`:

    lead  = median over the window of (phase + start if disaggregated else phase)
    phase = the request's decode dispatch − its grant (scheduling, the prefill, the KV barrier)
    start = the least of the window's disaggregated (first byte − decode dispatch): the decode
            engine's KV load and first step, when nothing made it wait

`start` is the least, not a mean: a request handed a slot early reaches the engine while the stream
before it still runs and waits there for it, and a mean would count that wait into the next lead, which
would hand over earlier still. The least is a request that found its slot free. A request prefilled
on its decode engine (decode-only) adds only its phase, a few ms. Example: phases of 20 ms, starts of
45 to 90 ms → lead 65 ms; at 7 ms a token a stream of 80 tokens hands over at token 69 instead of 78.

The extra tokens are at most half the stream, so a wrong lead cannot free a slot at a stream's
start. Nothing is learned until `MIN_SAMPLES` requests, and the lead is 0 then.

Off by default: the next request reaches the decode engine before the stream it replaces has freed
its blocks and waits there, in the engine's first-come-first-served queue, and so does a light
tenant's request that arrives then. On that flood the heavy tenant gets 0.96× round robin's
requests per second with it, and the light tenant's TTFT p90 goes from 1.34× its solo value to 2.98×.

Pure: the times come in (clock seconds); no clock of its own.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

#: Requests the lead is taken over, and how many before it is used.
WINDOW = 64
MIN_SAMPLES = 8


@dataclass(slots=True)
class HandoverLead:
    """The lead of the module docstring, updated per request (`record`), read per stream chunk
    (`seconds`, a stored number)."""

    window: int = WINDOW
    seconds: float = 0.0
    _phases: deque[tuple[float, bool]] = field(init=False)
    _starts: deque[float] = field(init=False)

    def __post_init__(self) -> None:
        self._phases, self._starts = deque(maxlen=self.window), deque(maxlen=self.window)

    def record(self, *, phase_s: float, start_s: float | None) -> None:
        """One request's phase (grant → decode dispatch) and, disaggregated, its start (decode
        dispatch → first byte; None for a request prefilled on its decode engine)."""
        self._phases.append((max(0.0, phase_s), start_s is not None))
        if start_s is not None:
            self._starts.append(max(0.0, start_s))
        if len(self._phases) < MIN_SAMPLES:
            return
        start = min(self._starts, default=0.0)
        self.seconds = statistics.median(p + start if kv else p for p, kv in self._phases)


@dataclass(slots=True)
class Handover:
    """When one stream hands its slot over (module docstring): `tokens` before its end, or earlier
    by the lead at the stream's own time per token."""

    expected: int
    tokens: int
    lead: HandoverLead | None = None
    _first: tuple[float, int] | None = None  # (clock time, tokens) when tokens first came

    def due(self, completion_tokens: int, clock: Callable[[], float]) -> bool:
        """Whether the stream, `completion_tokens` into its `expected`, hands over now (`clock`, read
        only while a lead is known).

        >>> lead, times = HandoverLead(seconds=0.07), iter([0.0, 0.59, 0.70])
        >>> h = Handover(expected=80, tokens=2, lead=lead)
        >>> [h.due(n, lambda: next(times)) for n in (1, 60, 71)]
        [False, False, True]
        >>> Handover(expected=80, tokens=2).due(78, lambda: 0.0)
        True"""
        left = self.expected - completion_tokens
        if left <= self.tokens:
            return True
        lead = self.lead.seconds if self.lead is not None else 0.0
        if lead <= 0.0 or completion_tokens <= 0:
            return False
        now = clock()
        if self._first is None:
            self._first = (now, completion_tokens)
            return False
        at, count = self._first
        if completion_tokens <= count or now <= at:
            return False
        per_token = (now - at) / (completion_tokens - count)
        extra = min(lead / per_token, self.expected / 2)
        return left <= self.tokens + extra
