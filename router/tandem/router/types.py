"""The router's shared vocabulary: pools, endpoints, routes and the read-only request view.

Pure data; imports nothing from the web or I/O stack so scheduling policies can depend on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal
from urllib.parse import urlsplit

Pool = Literal["prefill", "decode"]
POOLS: tuple[Pool, ...] = ("prefill", "decode")


class Route(StrEnum):
    """The generation routes the gateway serves; the value is the HTTP path (also sent upstream)."""

    COMPLETIONS = "/v1/completions"
    CHAT = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One engine in one pool, identified by its base URL (`http://10.0.0.7:8000`, no trailing slash).

    The same engine listed in both pools is two endpoints: rotation and in-flight counts are per pool.
    """

    pool: Pool
    url: str

    @property
    def name(self) -> str:
        """`host:port`, used in metric labels, logs and the `x-tandem-*-endpoint` headers."""
        return urlsplit(self.url).netloc


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointSnapshot:
    """What the router knows about an endpoint at one instant; the input of scheduling policies.

    `in_flight`: upstream requests the router has open to it now (>= 0).
    `consecutive_failures`: failures since its last success.
    `in_rotation`: False while it cools down after `failure_threshold` consecutive failures.
    """

    endpoint: Endpoint
    in_flight: int
    consecutive_failures: int
    in_rotation: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestView:
    """A validated generation request as policies see it. `body` is the client's JSON, read-only
    by contract (policies must not mutate it); `tenant` is the fairness header's value or "default"."""

    request_id: str
    route: Route
    model: str
    tenant: str
    stream: bool
    body: Mapping[str, Any]
