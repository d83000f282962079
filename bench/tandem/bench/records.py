"""What the driver records per request, and how a streamed event updates a record (pure).

Times are wall seconds since the run started; `tandem.bench.stats` turns them into engine seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """What one request did; times are wall seconds since the run start (None: did not happen).

    `ok` means HTTP 200, no error event, and at least one content chunk or a usage chunk.
    """

    index: int
    tenant: str
    group: str | None
    max_tokens: int
    arrival_s: float
    start_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    end_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    status: int | None = None
    error: str | None = None

    @property
    def first_token_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def ok(self) -> bool:
        produced = bool(self.token_times_s) or self.completion_tokens is not None
        return self.error is None and self.status == 200 and self.end_s is not None and produced

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index, "tenant": self.tenant, "group": self.group, "max_tokens": self.max_tokens,
            "arrival_s": self.arrival_s, "start_s": self.start_s, "first_token_s": self.first_token_s,
            "end_s": self.end_s, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "status": self.status, "ok": self.ok,
            "error": self.error, "token_times_s": self.token_times_s,
        }  # fmt: skip


@dataclass(frozen=True)
class DriveResult:
    """All records in workload order, the wall seconds from the run start to the last end, and how many
    closed-loop requests were never sent (the loop ended first; they have no record)."""

    records: tuple[RequestRecord, ...]
    wall_s: float
    unissued: int = 0


def apply_event(record: RequestRecord, event: Any, *, now: float) -> None:
    """Fold one SSE `data:` JSON event into the record (pure but for `record`).

    A chunk with non-empty `choices[0].delta.content` (chat) or `choices[0].text` (completions) is a
    token arrival; `usage` sets the token counts; an `error` object sets the error.
    """
    if not isinstance(event, dict):
        record.error = f"unexpected event: {str(event)[:100]}"
        return
    if "error" in event:
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else error
        record.error = f"error event: {message}"
        return
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        text = delta.get("content") if "delta" in choice else choice.get("text")
        if text:
            record.token_times_s.append(now)
            break
    usage = event.get("usage")
    if isinstance(usage, dict):
        record.prompt_tokens = usage.get("prompt_tokens")
        record.completion_tokens = usage.get("completion_tokens")
