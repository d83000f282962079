"""Benchmark workloads: seeded, deterministic lists of timed requests (pure: no I/O, no clock).

A `Workload` is the whole plan of a run: every request with its arrival offset (seconds after the
run starts, in the engines' time: see `tandem.bench.driver` for time scales), its tenant, its prompt
(`prompt` → `/v1/completions`, `messages` → `/v1/chat/completions`) and its exact output length.

Built-in generators (registered in `tandem.bench.catalog`; parameters are pydantic models, overridden
with `key=value`); this module has the two original ones and the shared pieces (types, arrivals):

- `shared-prefix`: SGLang's generated-shared-prefix benchmark. `groups` system prompts of
  `system_prompt_tokens` each; every group has `prompts_per_group` questions of `question_tokens`;
  a request is its group's system prompt plus one question. The requests are shuffled across groups
  (as SGLang's generator does) and arrive as a Poisson process at `rate` req/s (`inf`: all at t=0,
  so `concurrency` alone paces them).
- `two-tenant`: VTC's overload setting with unequal tenants. A heavy tenant sends long prompts at a
  high rate and a light tenant short prompts at a low rate, each a Poisson process over `duration`
  seconds; prompts share nothing (beyond the chat template's header).

The same seed gives the same workload, byte for byte, on any machine (`random.Random` seeded with a
string is hashed with SHA-512, independent of PYTHONHASHSEED). Workload files are in
`tandem.bench.workload_file`; multi-turn, tenant skew, burst, ramp and flood in
`tandem.bench.generators`; trace replay in `tandem.bench.traces`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.bench.text import words

Api = Literal["chat", "completions"]


class WorkloadError(ValueError):
    """A workload name, parameter or file is invalid; the message names it and says why."""


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload.

    `offset_s` is the arrival time in seconds after the run starts (>= 0). Exactly one of `prompt`
    and `messages` is set. `max_tokens` is the exact output length (the driver sends `ignore_eos`).
    `group` labels related requests (the shared-prefix group) and is carried into the records.
    """

    offset_s: float
    tenant: str
    max_tokens: int
    prompt: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    group: str | None = None
    #: The `model` to send (None: the run's, `DriverSettings.model`).
    model: str | None = None

    @property
    def api(self) -> Api:
        """`chat` when the request has messages, else `completions`."""
        return "chat" if self.messages is not None else "completions"


@dataclass(frozen=True)
class Workload:
    """A named, fully generated workload; `requests` are sorted by `offset_s`.

    `params` are the generator's parameters after overrides (for the report); `concurrency` is the
    in-flight bound per tenant the workload asks for (None: no preference); `tenant_concurrency`
    overrides it for the tenants it names (None there: no client bound at all). `tandem bench` uses
    both unless `--max-concurrency` is given, which then bounds every tenant alike.

    `closed_loop` maps a tenant to the offset (engine seconds) until which it runs closed loop: its
    requests (all at offset 0) go out as its slots free (`tenant_concurrency` of them open at once),
    each arriving when it is sent; none is sent at or after that offset, and those never sent are
    left out of the run's records. Example: `{"heavy": 40.0}` with `tenant_concurrency
    {"heavy": 48}` keeps 48 heavy requests open for 40 s.
    """

    name: str
    requests: tuple[BenchRequest, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    concurrency: int | None = None
    tenant_concurrency: Mapping[str, int | None] = field(default_factory=dict)
    closed_loop: Mapping[str, float] = field(default_factory=dict)

    @property
    def tenants(self) -> tuple[str, ...]:
        """Tenants in order of first appearance."""
        return tuple(dict.fromkeys(r.tenant for r in self.requests))


class Params(BaseModel):
    """Base of every generator's parameters: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SharedPrefixParams(Params):
    """SGLang's defaults are 64 groups x 16 prompts, 2048/128/256 tokens; ours are smaller so a run
    fits a laptop, with the same shape (long shared system prompts, short distinct questions)."""

    groups: int = Field(default=16, ge=1, le=10_000, description="Distinct system prompts.")
    prompts_per_group: int = Field(default=8, ge=1, le=10_000, description="Questions per group.")
    system_prompt_tokens: int = Field(
        default=2048, ge=0, le=1_000_000, description="Tokens per system prompt."
    )
    question_tokens: int = Field(default=128, ge=1, le=1_000_000, description="Tokens per question.")
    output_tokens: int = Field(default=64, ge=1, le=1_000_000, description="Generated tokens per request.")
    rate: float = Field(default=16.0, gt=0, description="Poisson arrival rate, req/s; inf: all at t=0.")
    concurrency: int | None = Field(default=64, ge=1, description="Most requests in flight.")
    api: Api = Field(default="chat", description="chat: system + user messages; completions: one prompt.")


class TwoTenantParams(Params):
    """A heavy tenant that alone would overload the pool and a light one asking for little."""

    duration: float = Field(default=30.0, gt=0, le=86_400, description="Seconds of arrivals.")
    heavy_tenant: str = Field(default="heavy", min_length=1)
    heavy_rate: float = Field(default=8.0, gt=0, le=10_000, description="Heavy tenant's req/s.")
    heavy_prompt_tokens: int = Field(default=1024, ge=1, le=1_000_000)
    heavy_output_tokens: int = Field(default=128, ge=1, le=1_000_000)
    light_tenant: str = Field(default="light", min_length=1)
    light_rate: float = Field(default=1.0, gt=0, le=10_000, description="Light tenant's req/s.")
    light_prompt_tokens: int = Field(default=256, ge=1, le=1_000_000)
    light_output_tokens: int = Field(default=128, ge=1, le=1_000_000)
    concurrency: int | None = Field(default=None, ge=1, description="Most in flight per tenant.")
    api: Api = Field(default="chat")


def shared_prefix(params: SharedPrefixParams, *, seed: int) -> Workload:
    """SGLang's generated-shared-prefix workload (see the module docstring)."""
    text_rng = random.Random(f"tandem-bench:{seed}:shared-prefix:text")
    systems = [words(text_rng, params.system_prompt_tokens) for _ in range(params.groups)]
    drafts: list[tuple[int, str]] = [
        (g, words(text_rng, params.question_tokens))
        for g in range(params.groups)
        for _ in range(params.prompts_per_group)
    ]
    random.Random(f"tandem-bench:{seed}:shared-prefix:order").shuffle(drafts)
    offsets = poisson_offsets(
        random.Random(f"tandem-bench:{seed}:shared-prefix:arrivals"), rate=params.rate, count=len(drafts)
    )
    requests = tuple(
        make_request(
            api=params.api, system=systems[g], user=question, offset_s=offset, tenant="default",
            max_tokens=params.output_tokens, group=f"g{g}",
        )
        for (g, question), offset in zip(drafts, offsets, strict=True)
    )  # fmt: skip
    return Workload("shared-prefix", requests, params.model_dump(), params.concurrency)


def two_tenant(params: TwoTenantParams, *, seed: int) -> Workload:
    """Two Poisson tenants over `duration` seconds (see the module docstring)."""
    if params.heavy_tenant == params.light_tenant:
        raise WorkloadError("heavy_tenant and light_tenant must differ")
    text_rng = random.Random(f"tandem-bench:{seed}:two-tenant:text")
    requests: list[BenchRequest] = []
    tenants = (
        (params.heavy_tenant, params.heavy_rate, params.heavy_prompt_tokens, params.heavy_output_tokens),
        (params.light_tenant, params.light_rate, params.light_prompt_tokens, params.light_output_tokens),
    )
    for tenant, rate, prompt_tokens, output_tokens in tenants:
        arrivals = random.Random(f"tandem-bench:{seed}:two-tenant:arrivals:{tenant}")
        for offset in poisson_until(arrivals, rate=rate, duration_s=params.duration):
            requests.append(
                make_request(
                    api=params.api, system=None, user=words(text_rng, prompt_tokens), offset_s=offset,
                    tenant=tenant, max_tokens=output_tokens, group=tenant,
                )
            )  # fmt: skip
    requests.sort(key=lambda r: r.offset_s)
    return Workload("two-tenant", tuple(requests), params.model_dump(), params.concurrency)


def poisson_offsets(rng: random.Random, *, rate: float, count: int) -> list[float]:
    """`count` arrival offsets (s) of a Poisson process at `rate` req/s, the first at 0.

    Gaps are exponential with mean 1/rate; `rate = inf` puts every arrival at 0. Example: rate 2 →
    offsets like [0, 0.41, 0.62, 1.37, ...], about 2 per second on average.
    """
    if math.isinf(rate):
        return [0.0] * count
    offsets: list[float] = []
    now = 0.0
    for i in range(count):
        if i:
            now += rng.expovariate(rate)
        offsets.append(now)
    return offsets


def poisson_until(rng: random.Random, *, rate: float, duration_s: float) -> list[float]:
    """Arrival offsets (s) of a Poisson process at `rate` req/s within [0, duration_s), the first at 0."""
    offsets: list[float] = []
    now = 0.0
    while now < duration_s:
        offsets.append(now)
        now += rng.expovariate(rate)
    return offsets


def make_request(
    *, api: Api, system: str | None, user: str, offset_s: float, tenant: str, max_tokens: int, group: str
) -> BenchRequest:
    """A request with an optional system prompt: chat messages, or for `completions` one prompt,
    system + `"\\n\\n"` + user (SGLang's generated-shared-prefix layout)."""
    if api == "completions":
        prompt = user if system is None else f"{system}\n\n{user}"
        return BenchRequest(offset_s, tenant, max_tokens, prompt=prompt, group=group)
    messages: list[Mapping[str, str]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": user})
    return BenchRequest(offset_s, tenant, max_tokens, messages=tuple(messages), group=group)


def bounded(workload: Workload, *, requests: int | None, duration_s: float | None) -> Workload:
    """The first `requests` requests whose arrival is before `duration_s` (None: no bound); closed
    loops stop at `duration_s` too (a 40 s loop cut by `duration_s=10` stops at 10 s)."""
    kept = tuple(r for r in workload.requests if duration_s is None or r.offset_s < duration_s)[
        : requests if requests is not None else None
    ]
    loops = {t: u if duration_s is None else min(u, duration_s) for t, u in workload.closed_loop.items()}
    return replace(workload, requests=kept, closed_loop=loops)
