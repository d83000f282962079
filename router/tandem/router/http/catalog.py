"""`GET /v1/models`: the union of what the engines list, plus the spec's served model.

Every endpoint (both pools, in rotation) is asked concurrently with a short timeout; entries are
merged by `id`, the first engine's entry winning (decode endpoints first). The spec's served name
is always listed, synthesised from the spec when no engine answers, because the gateway accepts
it in requests whatever the engines' state: clients that check `models.list()` before sending
must not see the model vanish while engines restart. Failures here never affect rotation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tandem.core.spec import ModelSpec
from tandem.router.errors import UpstreamError
from tandem.router.types import Endpoint
from tandem.router.upstream.client import HTTPUpstream

log = logging.getLogger(__name__)


async def list_models(
    *,
    upstream: HTTPUpstream,
    endpoints: Sequence[Endpoint],
    model: ModelSpec,
    created: int,
    timeout_s: float,
) -> dict[str, Any]:
    """The OpenAI `list` object. `created` (unix seconds) stamps the synthesised entry."""
    answers = await asyncio.gather(
        *(engine_models(upstream, endpoint, timeout_s=timeout_s) for endpoint in endpoints)
    )
    merged: dict[str, dict[str, Any]] = {}
    for entries in answers:
        for entry in entries:
            merged.setdefault(str(entry["id"]), entry)
    if model.public_name not in merged:
        merged[model.public_name] = {
            "id": model.public_name,
            "object": "model",
            "created": created,
            "owned_by": "tandem",
            "root": model.name,
            "parent": None,
        }
    return {"object": "list", "data": list(merged.values())}


async def engine_models(
    upstream: HTTPUpstream, endpoint: Endpoint, *, timeout_s: float
) -> list[dict[str, Any]]:
    """An engine's `/v1/models` entries; [] when it does not answer with a list."""
    try:
        answer = await upstream.get_json(endpoint, "/v1/models", timeout_s=timeout_s)
    except (UpstreamError, ValueError) as exc:
        log.debug("engine did not list its models", extra={"endpoint": endpoint.name, "why": str(exc)})
        return []
    data = answer.get("data") if isinstance(answer, Mapping) else None
    if not isinstance(data, list):
        return []
    return [dict(e) for e in data if isinstance(e, Mapping) and isinstance(e.get("id"), str)]
