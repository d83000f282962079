"""A gateway in front of many services: the two stages that take a request from the gateway's part
of the way to its service's.

    identify → parse → route → limit → serve: [hold → admit → pick → disaggregate → dispatch → relay]

| stage | does | fails with |
|---|---|---|
| `Route` | `model` → its service (a served name, or an alias's pick); what needs the service | 404, 400-413 |
| `Serve` | the service's own stages, from `Hold` on (`ServiceRoute.stages`) | theirs |

`Route` gives the engines the target's served name, and sets the tenant's cache salt and a big
prompt's tokens in the service's tokenizer (checked against its context).

Identity, the body, the rate limits and the priority band are the gateway's (the stages before
`Serve`); the cold-start hold, the fair queue over the service's decode capacity, scheduling, P/D and
the relay are the service's. A gateway of one service has neither stage: its pipeline is the nine
stages of `tandem.router.pipeline.stages`, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from tandem.core.modeltokens import PromptEncoder
from tandem.router.errors import ModelNotFound
from tandem.router.identity.cachescope import CacheScopes
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.pd.handoff import lmcache_tagged
from tandem.router.pipeline.context import RequestContext
from tandem.router.pipeline.exchange import Exchange
from tandem.router.pipeline.stages import Pipeline
from tandem.router.pipeline.tokenize import tokenize_big
from tandem.router.request.context_limit import ContextLimit
from tandem.router.request.names import ModelNames
from tandem.router.request.parse import prompt_text
from tandem.router.upstream.rename import ModelRename


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceRoute:
    """One service as the gateway routes to it: `name` (the InferenceService), `model` (its served
    name: the `model` engines get, and the `model` label of its metrics), its prompt `encoder` and
    `context` limit, its tenants' cache `scopes` (None: isolation off), whether it logs prompts, its
    stages from `Hold` on, its metrics (the request counters of the requests it served), and whether
    its engines run LMCache."""

    name: str
    model: str
    encoder: PromptEncoder
    context: ContextLimit
    scopes: CacheScopes | None
    log_prompts: bool
    stages: Pipeline
    metrics: RouterMetrics
    #: Its engines run LMCache: an adapter's or a salted body is tagged
    #: (`tandem.router.pd.handoff.lmcache_tagged`).
    lmcache_engines: bool = False


@dataclass(frozen=True, slots=True)
class Route:
    """The service `model` names (`tandem.router.request.names`). `unknown` is told of each 404 (the
    name itself is never kept); `aliased` of each alias's pick (alias, service)."""

    names: ModelNames[ServiceRoute]
    unknown: Callable[[], None]
    aliased: Callable[[str, ServiceRoute], None]
    tokenizing: asyncio.Semaphore | None = None
    off_loop_bytes: int = 65_536
    name: str = "route"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        try:
            resolved = self.names.resolve(ctx.model)
        except ModelNotFound:
            self.unknown()
            raise
        service = resolved.service
        ctx.service, ctx.encoder = service, service.encoder
        if resolved.alias is not None:
            self.aliased(resolved.alias, service)
            ctx.body["model"] = service.model
            ctx.rename = ModelRename(target=service.model, alias=resolved.alias)
        salt = service.scopes.salt(ctx.tenant) if service.scopes is not None else None
        if salt is not None:
            ctx.body["cache_salt"] = salt
        if salt is not None or resolved.adapter is not None:
            ctx.scope(salt, adapter=resolved.adapter)
        if service.lmcache_engines:
            lmcache_tagged(ctx.body, adapter=resolved.adapter, salt=salt)
        if service.log_prompts:
            ctx.prompt_text = prompt_text(ctx.body)
        if ctx.body_bytes >= self.off_loop_bytes:
            await tokenize_big(ctx, context=service.context, tokenizing=self.tokenizing)


@dataclass(frozen=True, slots=True)
class Serve:
    """The routed service's own stages."""

    name: str = "serve"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        service = ctx.service
        if service is None:
            raise RuntimeError("serve before route")
        await service.stages.run(ctx, exchange)
