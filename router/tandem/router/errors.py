"""The router's errors, one hierarchy; the app maps every `RouterError` to OpenAI's JSON error shape
in a single exception handler (`status` is the HTTP status, `param` the offending request field).

    RouterError
    ├── InvalidRequest            400  body is not JSON, or fails validation
    │   ├── ModelNotFound         404  `model` is not a name this gateway serves
    │   └── RequestTooLarge       413  the body is larger than the router accepts
    ├── Unauthenticated           401  auth is on and the API key is missing or unknown
    ├── Forbidden                 403  a priority above the tenant's band
    ├── Overloaded                429  not admitted: queue full or pushed out, own deadline out of reach
    │   ├── RateLimited           429  the tenant's requests- or tokens-per-minute limit
    │   └── ColdStart             429  the decode pool has no engine yet: the hold is full, or held too long
    ├── NoEndpointAvailable       503  no endpoint in rotation, or every attempt failed
    ├── ClientDisconnected        499  the client left before the response started (never sent)
    ├── UpstreamError             502  an engine failed (translated from aiohttp in `upstream.client`)
    │   ├── UpstreamConnectError       could not connect
    │   ├── UpstreamTimeout            connect/read/pool timeout
    │   ├── UpstreamBroken             connection broke while reading (engine died mid-response)
    │   └── UpstreamStatusError        the engine answered 5xx
    └── ConfigurationError        (start-up) the config asks for something this build cannot do
"""

from __future__ import annotations

from typing import ClassVar


class RouterError(Exception):
    """Base of every error the router raises on purpose.

    `openai_type` / `openai_code` replace the error object's default `type` (from the status) and
    `code` (the status) where OpenAI uses well-known strings (`invalid_api_key`, `rate_limit_exceeded`).
    """

    status: ClassVar[int] = 500
    openai_type: ClassVar[str | None] = None
    openai_code: ClassVar[str | None] = None

    #: What a client is told instead of `message` when the message names engines (pod addresses):
    #: the full message goes to the gateway's log line, under the request id. An instance may say
    #: it itself (`public=`).
    public: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, public: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self._public = public

    @property
    def public_message(self) -> str:
        """The error's text as a client sees it: never an engine's address."""
        return self._public or self.public or self.message

    def response_headers(self) -> dict[str, str]:
        """Extra headers for the error response (none by default)."""
        return {}


class InvalidRequest(RouterError):
    status = 400


class ModelNotFound(InvalidRequest):
    status = 404

    def __init__(self, model: str) -> None:
        # vLLM's wording, so clients that match on it keep working behind the gateway.
        super().__init__(f"The model `{model}` does not exist.", param="model")


class RequestTooLarge(InvalidRequest):
    status = 413


class RequestTimeout(InvalidRequest):
    """The client did not send its whole body in time (a slow or stalled sender)."""

    status = 408


class Unauthenticated(RouterError):
    """No API key, or one that is not in the key table; OpenAI's `invalid_api_key`. The message never
    quotes the key."""

    status = 401
    openai_type = "invalid_request_error"
    openai_code = "invalid_api_key"

    def response_headers(self) -> dict[str, str]:
        return {"www-authenticate": 'Bearer realm="tandem"'}


class Forbidden(RouterError):
    """The caller is known but asks for something its tenant is not allowed (OpenAI's
    `PermissionDeniedError`)."""

    status = 403


class Overloaded(RouterError):
    """The admission layer turned the request away. `reason` is why: for the gate's own refusals the
    label of `tandem_router_admission_rejections_total` (`queue_full`, `pushed_out`, `deadline`,
    `slo`); `retry_after_s` (whole seconds, >= 1) becomes the `Retry-After` header."""

    status = 429

    def __init__(self, message: str, *, reason: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = max(1, retry_after_s)

    def response_headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)}


class RateLimited(Overloaded):
    """The tenant is over a rate limit (`spec.router.rateLimits`); `kind` is `requests` or `tokens`."""

    openai_type = "rate_limit_exceeded"
    openai_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, kind: str, retry_after_s: int) -> None:
        super().__init__(message, reason=f"rate_limit_{kind}", retry_after_s=retry_after_s)
        self.kind = kind


class ColdStart(Overloaded):
    """The decode pool has no engine at all (scaled to zero, its first engine starting) and the request
    could not be held (`outcome` `rejected`: `maxHeldRequests` already held) or was held for
    `holdSeconds` without one appearing (`expired`); `tandem_router_held_total{outcome}` counts both."""

    openai_code = "model_cold_start"

    def __init__(self, message: str, *, outcome: str, retry_after_s: int) -> None:
        super().__init__(message, reason="cold_start", retry_after_s=retry_after_s)
        self.outcome = outcome


class NoEndpointAvailable(RouterError):
    status = 503


class AdapterNotReady(NoEndpointAvailable):
    """A declared LoRA adapter that no engine could load within the gateway's hold
    (`Dispatcher.adapter_hold_s`): each engine tried answered 404 for it (its files not in the
    adapters' cache yet, a fetch still running or failed). 503 with `Retry-After`."""

    openai_code = "adapter_not_ready"

    def __init__(self, message: str, *, adapter: str, retry_after_s: int) -> None:
        super().__init__(message, public=f"adapter `{adapter}` is not loaded on any engine yet; retry later")
        self.retry_after_s = max(1, retry_after_s)

    def response_headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)}


class ClientDisconnected(RouterError):
    """nginx's 499: recorded in metrics and logs; the client is gone so nothing is delivered."""

    status = 499


class ClientStalled(ClientDisconnected):
    """The client stopped reading its stream for longer than the gateway waits (499 too): the stream
    ends, the upstream request is closed and the capacity it held goes to the next request."""


class UpstreamError(RouterError):
    """An engine failed. `kind` is the `kind` label of `tandem_router_upstream_errors_total`."""

    status = 502
    kind: ClassVar[str] = "other"
    public = "an engine failed to answer the request"  # retried elsewhere first; the log names it


class UpstreamConnectError(UpstreamError):
    kind = "connect"


class UpstreamTimeout(UpstreamError):
    kind = "timeout"


class UpstreamConnectTimeout(UpstreamTimeout):
    """No connection to the engine within the connect timeout (connecting, or waiting for a pooled
    connection): timed by the router's event loop, so a stalled loop can cause it (see
    `tandem.router.observe.looplag`)."""


class UpstreamBroken(UpstreamError):
    kind = "read"


class UpstreamAdapterMissing(UpstreamError):
    """The engine answered 404 to a request under a LoRA adapter the service declares: it cannot load
    the adapter now. Not held against the engine's rotation (the engine is well; the adapter's files
    are not there yet), and the request is held and tried again (`tandem.router.upstream.dispatch`)."""

    kind = "adapter_missing"


class UpstreamStatusError(UpstreamError):
    """The engine answered with an error status (a 5xx on the request path); `upstream_status`
    is that status."""

    kind = "status"

    def __init__(self, message: str, *, upstream_status: int) -> None:
        super().__init__(message)
        self.upstream_status = upstream_status


class ConfigurationError(RouterError):
    """Raised by `create_app` for a configuration this build cannot serve (e.g. discovery kind)."""
