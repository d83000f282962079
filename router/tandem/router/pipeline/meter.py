"""Charging a grant's tenant for the answer as it is relayed (a `relay.ResponseMeter`).

Streams: every chunk goes through an `SSETap`; the tokens it counts are charged at once
(`outputWeight` each), and at the end the final usage event corrects both charges. Buffered answers:
the JSON `usage` is charged when the answer arrives. Errors (status >= 400) charge nothing more.
Closing settles and releases the grant, which frees its decode capacity for the next request.

**Handover.** A stream whose length is known (`expected` tokens: its `max_tokens`, one choice) is
handed over when `handover_tokens` or fewer remain: `on_handover()` runs once, and the dispatcher and
the admission gate give its slot to the next waiting request, which reaches the engine while this
one finishes its last steps and starts in the step its slot frees. So the engine's batch stays full
with no request of lookahead queued in it, and the next request is chosen by the fair queue as late
as possible (a tenant arriving a moment before the handover is served first). An answer that ends
sooner (end of sequence) frees its slot at the end as usual. Where the next request takes a while to
reach its decode engine (a prefill elsewhere first), the stream hands over that much earlier
(`tandem.router.pipeline.lead`).

Two optional hooks: `on_output(tokens)` is told every output token counted (the tenant's rate-limit
token bucket), corrected upwards by the final usage; `on_text(text)` gets the answer's generated text
once, when the response is over (the request log line, only with `logPrompts`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tandem.router.admission.grant import Grant
from tandem.router.pipeline.lead import Handover, HandoverLead
from tandem.router.types import Usage
from tandem.router.upstream.usage import SSETap, output_text_from_body, usage_from_body


class GrantMeter:
    """A `ResponseMeter` for one admitted request. `strip_usage`: the router added
    `stream_options.include_usage` itself, so the usage event is not forwarded."""

    def __init__(
        self,
        grant: Grant,
        *,
        strip_usage: bool,
        on_output: Callable[[int], None] | None = None,
        on_text: Callable[[str], None] | None = None,
        expected: int | None = None,
        handover_tokens: int = 0,
        on_handover: Callable[[], None] | None = None,
        lead: HandoverLead | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._grant = grant
        self._handover = (
            Handover(expected=expected, tokens=max(0, min(handover_tokens, expected - 1)), lead=lead)
            if expected is not None and on_handover is not None
            else None
        )
        self._on_handover = on_handover
        self._clock = clock
        self._tap = SSETap(strip_usage=strip_usage, collect_text=on_text is not None)
        self._on_output = on_output
        self._on_text = on_text
        self._output_told = 0
        self._text: str | None = None
        self._closed = False

    def stream_chunk(self, chunk: bytes, /) -> bytes:
        forward, tokens = self._tap.feed(chunk)
        grant = self._grant
        grant.charge_output(tokens)
        self._tell_output(tokens)
        handover = self._handover
        if handover is not None and tokens and handover.due(grant.completion_tokens, self._clock):
            self._handover = None
            assert self._on_handover is not None
            self._on_handover()
        return forward

    def stream_end(self) -> bytes:
        return self._tap.flush()

    def buffered(self, status: int, body: bytes, /) -> None:
        if status < 400:
            usage = usage_from_body(body)
            self._grant.settle(usage)
            self._settle_output(usage)
            if self._on_text is not None:
                self._text = output_text_from_body(body)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._grant.settle(self._tap.usage)
            self._settle_output(self._tap.usage)
            if self._on_text is not None:
                self._on_text(self._text if self._text is not None else self._tap.text)
        finally:
            self._grant.release()

    def _tell_output(self, tokens: int) -> None:
        if self._on_output is not None and tokens > 0:
            self._output_told += tokens
            self._on_output(tokens)

    def _settle_output(self, usage: Usage | None) -> None:
        if usage is not None and usage.completion_tokens is not None:
            self._tell_output(usage.completion_tokens - self._output_told)
