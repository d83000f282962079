"""What the router learns about one request while serving it, reported once at the end as one log
line and the request metrics (see `middleware.RequestContextMiddleware`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, kw_only=True)
class RequestReport:
    """Mutable per-request facts; times are clock seconds (`started` is when the request arrived).

    Filled in by the middleware (status, first byte, end) and by the gateway (everything else).
    """

    request_id: str
    route: str
    started: float
    status: int | None = None
    first_byte: float | None = None
    tenant: str | None = None
    model: str | None = None
    stream: bool | None = None
    decode_endpoint: str | None = None
    prefill_endpoint: str | None = None
    pd_fallback: str | None = None
    prefill_s: float | None = None
    queue_s: float | None = None
    client_disconnected: bool = False
    error: str | None = None
    #: Prompt and output text: set only when prompts may be logged (`logPrompts`), else never kept.
    prompt: str | None = None
    output: str | None = None

    def record_output(self, text: str) -> None:
        self.output = text

    def fields(self, *, now: float) -> dict[str, object]:
        """The log line's structured fields (durations in seconds, rounded to 0.1 ms)."""
        out: dict[str, object] = {"route": self.route, "status": self.status}
        optional = {
            "tenant": self.tenant,
            "model": self.model,
            "stream": self.stream,
            "decode_endpoint": self.decode_endpoint,
            "prefill_endpoint": self.prefill_endpoint,
            "pd_fallback": self.pd_fallback,
            "prefill_s": _round(self.prefill_s),
            "queue_s": _round(self.queue_s),
            "ttfb_s": _round(None if self.first_byte is None else self.first_byte - self.started),
            "error": self.error,
            "prompt": self.prompt,
            "output": self.output,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        out["duration_s"] = _round(now - self.started)
        if self.client_disconnected:
            out["client_disconnected"] = True
        return out


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)
