"""Request ids: the client's `x-request-id`, validated and bounded, and a unique id for the engines.

| header value | response `x-request-id`, logs | sent to engines |
|---|---|---|
| absent | a new id (32 hex digits) | the same new id |
| 1 to `MAX_LENGTH` characters of `ALLOWED` | the client's value | the value, a dot, 12 hex digits |
| anything else (too long, a space, a quote, a control character) | 400 naming the header | — |

The client's value is only ever a label: it is echoed and logged, never a key of routing state, and
engines never see it alone, so two requests reusing one id (by accident or on purpose) stay two
requests everywhere (vLLM keys its own request state, and KV transfers, by the id it receives).
Example: a client sending `x-request-id: job-7` gets `job-7` back; the engines see
`job-7.3fa9c2d41b07`.
"""

from __future__ import annotations

import re
import uuid

from tandem.router.errors import InvalidRequest

HEADER = "x-request-id"
MAX_LENGTH = 128
#: Letters, digits and `._:/+=@~-`: enough for UUIDs, ULIDs, trace ids and paths; nothing that can
#: break a log line or a header.
ALLOWED = re.compile(r"[A-Za-z0-9._:/+=@~-]+")


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_ids(value: str | None) -> tuple[str, str]:
    """(the id for the response and logs, the id for engines) from the header's value (or None);
    raises `InvalidRequest` (400) for a value outside the table above."""
    if value is None:
        generated = new_request_id()
        return generated, generated
    if not value or len(value) > MAX_LENGTH or not ALLOWED.fullmatch(value):
        shown = value[:40] + ("..." if len(value) > 40 else "")
        raise InvalidRequest(
            f"{HEADER} must be 1 to {MAX_LENGTH} characters of letters, digits and ._:/+=@~- "
            f"(got {shown!r}, {len(value)} characters)",
            param=HEADER,
        )
    return value, f"{value}.{uuid.uuid4().hex[:12]}"
