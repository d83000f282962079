"""Charging a grant's tenant for the answer as it is relayed (a `relay.ResponseMeter`).

Streams: every chunk goes through an `SSETap`; the tokens it counts are charged at once
(`outputWeight` each), and at the end the final usage event corrects both charges. Buffered answers:
the JSON `usage` is charged when the answer arrives. Errors (status >= 400) charge nothing more.
Closing settles and releases the grant, which frees its decode capacity for the next request.
"""

from __future__ import annotations

from tandem.router.admission.gate import Grant
from tandem.router.usage import SSETap, usage_from_body


class GrantMeter:
    """A `ResponseMeter` for one admitted request. `strip_usage`: the router added
    `stream_options.include_usage` itself, so the usage event is not forwarded."""

    def __init__(self, grant: Grant, *, strip_usage: bool) -> None:
        self._grant = grant
        self._tap = SSETap(strip_usage=strip_usage)
        self._closed = False

    def stream_chunk(self, chunk: bytes, /) -> bytes:
        forward, tokens = self._tap.feed(chunk)
        self._grant.charge_output(tokens)
        return forward

    def stream_end(self) -> bytes:
        return self._tap.flush()

    def buffered(self, status: int, body: bytes, /) -> None:
        if status < 400:
            self._grant.settle(usage_from_body(body))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._grant.settle(self._tap.usage)
        finally:
            self._grant.release()
