"""`RequestContext`: everything one generation request learns on its way through the gateway.

One object per HTTP request, created by the HTTP shell and filled in by the stages of
`tandem.router.pipeline.stages` in order; it dies with the request. It replaces process-wide memos
keyed by request id: the prompt's tokens and block keys, whether its prefill succeeded, and the
tickets of its attempts live here, so a client that reuses an `x-request-id` can never make one
request look like another.

The prompt's tokens are computed on first use (`prompt_tokens()`), by the model's tokenizer through
the process's `PromptEncoder`; block keys per block size likewise (`block_keys(size)`), only when a
policy, the P/D decision or KV events ask. (Every dispatched request is counted: the fair queue
charges its prompt and the TTFT model learns from it; shared prefixes make that a memo hit.)

Scheduling, admission and P/D read the context through small Protocols of their own (`Routable`,
`Admittable`, `PDRequest`), so none of them imports this module; it holds their handles (the
`Grant`, the decode `Attempt`) for the stages after them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tandem.core.blockhash import ROOT_KEY, scope_key
from tandem.core.modeltokens import Encoded, PromptEncoder
from tandem.router.admission.grant import Grant
from tandem.router.types import SLO, Endpoint, Route
from tandem.router.upstream.dispatch import Attempt
from tandem.router.upstream.rename import ModelRename

if TYPE_CHECKING:
    from tandem.router.observe.tracing import RequestTrace
    from tandem.router.pd.disagg import PDOutcome
    from tandem.router.pipeline.route import ServiceRoute

#: The tenant of requests that name none.
DEFAULT_TENANT = "default"


@dataclass(slots=True, eq=False, kw_only=True)
class RequestContext:
    """Per-request facts; times are clock seconds (`started`: when the request arrived).

    Set by the HTTP shell: `request_id` (the client's validated `x-request-id`, else a new one, for
    logs and the response), `upstream_id` (unique per request, sent to engines), `path` (the label
    of the route), `started`. By the stages: see `tandem.router.pipeline.stages`.
    """

    request_id: str
    upstream_id: str
    path: str
    started: float
    clock: Callable[[], float] = time.monotonic
    encoder: PromptEncoder | None = None
    # identify
    tenant: str = DEFAULT_TENANT
    slo: SLO = field(default_factory=lambda: SLO(ttft_s=1.0, tpot_s=0.05))
    priority: int = 0
    deadline_s: float | None = None  # the client's own x-slo-ttft-ms, else None
    # parse
    route: Route = Route.COMPLETIONS
    body: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    #: The LoRA adapter `model` names (None: the base model); its prompts' keys are its own.
    adapter: str | None = None
    stream: bool = False
    body_bytes: int = 0  # the body's size as it came
    # route (a gateway of many services only)
    service: ServiceRoute | None = None  # the service `model` named
    rename: ModelRename | None = None  # the answer's `model` back to the alias the client sent
    # hold (cold start), admission, scheduling, P/D
    held_s: float | None = None  # held while the decode pool had no engine, else None
    grant: Grant | None = None
    queue_s: float | None = None
    decode: Endpoint | None = None
    decode_members: tuple[Endpoint, ...] = ()  # the decode pool when `decode` was chosen
    #: `decode` is the engine of the stream this request pre-empted (the swap, `stages.Pick`).
    swapped_in: bool = False
    kv_loaded: bool = False  # a prefill succeeded: the decode engine loads the prompt's KV
    decode_rechosen: bool = False  # chosen again after the prefill: the decode pool had changed
    prefill_endpoint: str | None = None
    kv_layout: str | None = None  # the prefill endpoint's KV layout: a decode placed again keeps to it
    pd_fallback: str | None = None
    prefill_s: float | None = None
    decode_body: dict[str, Any] | None = None  # the body for decode, when P/D changed it
    dispatched_at: float | None = None  # when the decode request was first sent
    #: Its P/D step, started while it waited for its slot (`tandem.router.pd.ahead`), else None.
    ahead: asyncio.Task[PDOutcome] | None = None
    ahead_used: bool = False  # its outcome went to decode (not a swap's, `stages.Disaggregate`)
    # the answer
    attempt: Attempt | None = None
    strip_usage: bool = False  # the gateway asked for usage itself: not forwarded to the client
    decode_endpoint: str | None = None
    retries: int = 0  # decode attempts that failed elsewhere before this one answered
    status: int | None = None
    response_started: bool = False
    response_complete: bool = False
    first_byte_at: float | None = None
    client_disconnected: bool = False
    continued: bool = False  # pre-empted, then continued on an engine (`pipeline.resume`)
    error: str | None = None
    #: The request's trace (`tandem.router.observe.tracing`); None when tracing is off.
    trace: RequestTrace | None = None
    #: Prompt and output text: set only when prompts may be logged (`logPrompts`), else never kept.
    prompt_text: str | None = None
    output_text: str | None = None
    #: Run when the request is over, whatever happened, last added first (grants, attempts).
    cleanups: list[Callable[[], object]] = field(default_factory=list)
    _encoded: Encoded | None = None
    _estimate: int | None = None
    _keys: dict[int, Sequence[int]] = field(default_factory=dict)
    #: The tenant's `cache_salt` (None: isolation off) and the root of its prefix keys.
    cache_salt: str | None = None
    _root: int = ROOT_KEY

    def scope(self, cache_salt: str | None, *, adapter: str | None = None) -> None:
        """The request's prompts are cached under `cache_salt` and the LoRA `adapter` (set before any
        key is computed): its keys are rooted at `scope_key(lora_name=adapter, cache_salt=...)`, as
        the engines root their blocks, so neither tenants nor adapters share a key."""
        self.cache_salt, self.adapter = cache_salt, adapter
        self._root = scope_key(lora_name=adapter, cache_salt=cache_salt)
        self._keys.clear()

    @property
    def lora_name(self) -> str | None:
        """The adapter the request runs under (scheduling's `Routable`)."""
        return self.adapter

    # -- the prompt ---------------------------------------------------------------------------

    def encoded(self) -> Encoded:
        """The prompt's tokens in the model's tokenizer, computed once (module docstring)."""
        if self._encoded is None:
            self._encoded = self._encode()
        return self._encoded

    def prompt_tokens(self) -> Sequence[int]:
        return self.encoded().ids

    def prompt_length(self) -> int:
        return len(self.encoded().ids)

    def has_prompt_tokens(self) -> bool:
        """Whether the prompt has been tokenized (its length is then known without work)."""
        return self._encoded is not None

    def trace_headers(self, call: str) -> dict[str, str]:
        """The W3C trace headers of an engine call (`call`: "prefill" or "decode"); none untraced."""
        return {} if self.trace is None else self.trace.headers(call)

    def prompt_size(self) -> int:
        """The prompt's tokens when they were counted, else an estimate from its characters
        (`estimate_tokens`): the fair queue's charge at dispatch and the TTFT model of a policy that
        never reads the prompt take it, and the engine's usage corrects the charge at the end, so a
        round-robin gateway never tokenizes."""
        if self._encoded is not None:
            return len(self._encoded.ids)
        if self._estimate is None:
            self._estimate = estimate_tokens(self.body)
        return self._estimate

    def block_keys(self, block_size: int) -> Sequence[int]:
        """`tandem.core.blockhash.block_keys` of the prompt in blocks of `block_size`, once, rooted in
        the tenant's cache scope (`scope`)."""
        keys = self._keys.get(block_size)
        if keys is None:
            if self.encoder is None:
                raise RuntimeError("the request has no prompt encoder")
            keys = self.encoder.block_keys(self.encoded(), block_size, root=self._root)
            self._keys[block_size] = keys
        return keys

    def _encode(self) -> Encoded:
        encoder = self.encoder
        if encoder is None:
            return Encoded((), ())
        if self.route is Route.CHAT:
            messages = self.body.get("messages")
            return encoder.chat(messages) if isinstance(messages, list) else Encoded((), ())
        prompt = self.body.get("prompt")
        if isinstance(prompt, str | list):
            return encoder.completion(prompt)
        return Encoded((), ())

    # -- what was sent (the relay's `Progress`) ---------------------------------------------

    def response_failed(self, message: str, /) -> None:
        self.error = message

    def response_start(self, status: int, /) -> None:
        self.status, self.response_started = status, True

    def response_first_byte(self) -> None:
        if self.first_byte_at is None:
            self.first_byte_at = self.clock()

    def response_end(self) -> None:
        self.response_complete = True

    def expected_output(self) -> int | None:
        """Output tokens the answer will have at most, when a stream of one choice names them; None
        otherwise (the handover needs it). The limit is the one the engine applies
        (`output_limit`): a smaller `max_tokens` beside a larger `max_completion_tokens` must not
        free the slot after a token while the engine generates thousands."""
        body = self.body
        if not self.stream or body.get("n", 1) != 1 or body.get("best_of", 1) != 1:
            return None
        return output_limit(self.route, body)

    def keep_output(self, text: str) -> None:
        """The generated text, for the log line (only with `logPrompts`)."""
        self.output_text = text

    # -- the log line -------------------------------------------------------------------------

    def log_fields(self, *, now: float) -> dict[str, object]:
        """The request log line's structured fields (durations in seconds, rounded to 0.1 ms)."""
        out: dict[str, object] = {"route": self.path, "status": self.status}
        optional = {
            "tenant": self.tenant if self.body else None,
            "model": self.model or None,
            "adapter": self.adapter,
            "stream": self.stream if self.body else None,
            "prompt_tokens": len(self._encoded.ids) if self._encoded is not None else None,
            "decode_endpoint": self.decode_endpoint,
            "prefill_endpoint": self.prefill_endpoint,
            "decode_rechosen": True if self.decode_rechosen else None,
            "pd_fallback": self.pd_fallback,
            "prefill_s": _round(self.prefill_s),
            "held_s": _round(self.held_s),
            "queue_s": _round(self.queue_s),
            "ttfb_s": _round(None if self.first_byte_at is None else self.first_byte_at - self.started),
            "error": self.error,
            "prompt": self.prompt_text,
            "output": self.output_text,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        out["duration_s"] = _round(now - self.started)
        if self.upstream_id != self.request_id:
            out["upstream_id"] = self.upstream_id
        if self.client_disconnected:
            out["client_disconnected"] = True
        if self.continued:
            out["continued"] = True
        return out


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)


#: Characters per token of the estimate: Tandem's tokenizer reads about 2.5-3 per token of English,
#: byte-level BPE vocabularies about 4; erring low keeps a charge from being too small.
CHARS_PER_TOKEN = 3


def estimate_tokens(body: Mapping[str, Any]) -> int:
    """Tokens of a request's prompt estimated from its characters: `prompt` (a string, or a list of
    strings or of token ids) or the text of every chat message, ÷ `CHARS_PER_TOKEN`, at least 1.
    Example: a 3,000-character chat → 1,000."""
    prompt = body.get("prompt")
    chars = 0
    if isinstance(prompt, str):
        chars = len(prompt)
    elif isinstance(prompt, list):
        for item in prompt:
            if isinstance(item, str):
                chars += len(item)
            elif isinstance(item, int):
                chars += CHARS_PER_TOKEN  # a token id
            elif isinstance(item, list):
                chars += CHARS_PER_TOKEN * len(item)
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                chars += sum(len(p.get("text") or "") for p in content if isinstance(p, Mapping))
    return max(1, chars // CHARS_PER_TOKEN)


def output_limit(route: Route, body: Mapping[str, Any]) -> int | None:
    """The output limit vLLM applies to `body`: on chat, `max_completion_tokens` when set, else
    `max_tokens` (vLLM's `max_completion_tokens or max_tokens`); on completions only `max_tokens`
    (vLLM ignores any other). None when it names none (the engine's context length bounds it).

    >>> output_limit(Route.CHAT, {"max_tokens": 1, "max_completion_tokens": 8000})
    8000
    >>> output_limit(Route.COMPLETIONS, {"max_tokens": 16, "max_completion_tokens": 8000})
    16
    """
    names = ("max_completion_tokens", "max_tokens") if route is Route.CHAT else ("max_tokens",)
    for name in names:
        limit = body.get(name)
        if limit is not None:
            return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
    return None
