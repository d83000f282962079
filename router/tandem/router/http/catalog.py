"""`GET /v1/models`: the union of what the engines list, plus the spec's served model and its LoRA
adapters (in front of many services: every served name, adapter and alias, `list_many`).

Every endpoint (both pools, in rotation) is asked concurrently with a short timeout; entries are
merged by `id`, the first engine's entry winning (decode endpoints first). The spec's served name
is always listed, synthesised from the spec when no engine answers, because the gateway accepts
it in requests whatever the engines' state: clients that check `models.list()` before sending
must not see the model vanish while engines restart. So is each adapter the gateway accepts, as vLLM
lists one (`parent`: the model's served name), because an engine lists an adapter its resolver
finds only once a request has loaded it; the synthesised entry's `root` is the adapter's name (the
engines' path to it is theirs). Failures here never affect rotation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
    adapters: Sequence[str] = (),
) -> dict[str, Any]:
    """The OpenAI `list` object. `created` (unix seconds) stamps the synthesised entries."""
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
    for adapter in adapters:
        if adapter not in merged:
            merged[adapter] = adapter_entry(adapter, parent=model.public_name, created=created)
    return {"object": "list", "data": list(merged.values())}


def adapter_entry(name: str, *, parent: str, created: int) -> dict[str, Any]:
    """An adapter's entry when no engine lists it (module docstring)."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "tandem",
        "root": name,
        "parent": parent,
    }


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Listed:
    """One service as `/v1/models` lists it in a gateway of many: its model and its engines now."""

    model: ModelSpec
    upstream: HTTPUpstream
    endpoints: Callable[[], Sequence[Endpoint]]
    adapters: Sequence[str] = ()


async def list_many(
    *,
    services: Sequence[Listed],
    aliases: Mapping[str, Sequence[str]],
    created: int,
    timeout_s: float,
) -> dict[str, Any]:
    """The OpenAI `list` of a gateway in front of many services: every served name followed by its
    adapters, each with its engines' entry for it when one answers (else synthesised, as
    `list_models` does), then every alias (`aliases`: alias → its targets' served names), as its
    first target's entry under the alias's id, with the smallest `max_model_len` of its targets when
    they state one. Only names the gateway accepts are listed: an engine's other names (its model
    path, adapters loaded at run time) are not."""
    answers = await asyncio.gather(
        *(
            list_models(
                upstream=s.upstream,
                endpoints=s.endpoints(),
                model=s.model,
                created=created,
                timeout_s=timeout_s,
                adapters=s.adapters,
            )
            for s in services
        )
    )
    entries: dict[str, dict[str, Any]] = {}
    for service, answer in zip(services, answers, strict=True):
        listed = {e["id"]: e for e in answer["data"]}
        for name in (service.model.public_name, *service.adapters):
            entries[name] = listed[name]
    for alias, targets in aliases.items():
        entry = {**entries[targets[0]], "id": alias, "parent": None}
        lengths = [entries[t].get("max_model_len") for t in targets]
        if all(isinstance(n, int) for n in lengths):
            entry["max_model_len"] = min(n for n in lengths if isinstance(n, int))
        entries[alias] = entry
    return {"object": "list", "data": list(entries.values())}
