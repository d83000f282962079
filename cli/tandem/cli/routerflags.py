"""The `tandem router` tuning flags: one table, mapped onto `RouterSettings` sections.

Each `Flag` names its settings section and field, so the command validates all of them in one
`RouterSettings` and an invalid value is reported with the flag's name
(`tandem: error: --max-kv-usage: Input should be less than or equal to 1`). Flags whose check can be
switched off take `off` (`--max-kv-usage off`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from tandem.router.settings import RouterSettings

F = TypeVar("F", bound=Callable[..., Any])


class _OffOr(click.ParamType[Any]):
    """A number, or `off` (None: the check is disabled)."""

    def __init__(self, kind: type[int] | type[float]) -> None:
        self.kind = kind
        self.name = f"{kind.__name__}|off"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or (isinstance(value, str) and value.lower() == "off"):
            return None
        try:
            return self.kind(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number or 'off'", param, ctx)


def _weights(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        tenant, sep, weight = item.rpartition("=")
        if not sep or not tenant:
            raise click.BadParameter(f"{item!r} is not TENANT=WEIGHT", param_hint="--tenant-weight")
        out[tenant] = weight
    return out


@dataclass(frozen=True)
class Flag:
    name: str  # --kebab-case
    section: str  # RouterSettings field
    field: str  # the section's field
    type: Any
    default: Any
    help: str
    multiple: bool = False
    is_flag: bool = False

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


FLAGS: tuple[Flag, ...] = (
    Flag("--prefill-timeout", "disaggregation", "prefill_timeout_seconds", float, 30.0,
         "Seconds a P/D prefill may take before the request goes decode-only."),
    Flag("--kv-barrier-timeout", "disaggregation", "kv_barrier_timeout_seconds", float, 2.0,
         "Seconds to wait after a prefill for the prompt's chunks in the KV pool; then decode-only."),
    Flag("--kv-pool-timeout", "disaggregation", "kv_pool_timeout_seconds", float, 0.5,
         "Connect and per-command timeout of the router's KV pool (Redis) client, seconds."),
    Flag("--failure-threshold", "rotation", "failure_threshold", int, 3,
         "Consecutive failures that take an engine out of rotation."),
    Flag("--cooldown", "rotation", "cooldown_seconds", float, 10.0,
         "Seconds an engine stays out of rotation before it is tried again."),
    Flag("--fairness", "admission", "fairness", click.Choice(["vtc", "fcfs"]), "vtc",
         "Order of requests waiting in the router's queue: VTC between tenants, or arrival order."),
    Flag("--engine-capacity", "admission", "engine_capacity", int, None,
         "Requests one engine runs at once, declared: where its learned capacity starts and the most it "
         "can be [default: --max-num-seqs in the spec's engine args, else learned from 256]."),
    Flag("--lookahead", "admission", "lookahead", float, 0.0,
         "Share of an engine's capacity sent beyond it (rounded), queued in the engine to keep its "
         "batches full; a tenant who arrives later waits behind it [default: none]."),
    Flag("--handover-tokens", "admission", "handover_tokens", int, 2,
         "A stream this many tokens from its max_tokens gives its engine slot to the next waiting "
         "request, which starts as it ends (0: off)."),
    Flag("--handover-lead", "admission", "handover_lead", click.Choice(["on", "off"]), "off",
         "Hand a slot over earlier by the time the next request takes to reach its decode engine (a "
         "prefill elsewhere first), learned from the requests: more throughput from disaggregated "
         "decode engines, at the cost of requests queued in them for a moment."),
    Flag("--preemption", "admission", "preemption", click.Choice(["on", "off"]), "on",
         "With --fairness vtc: a request of a tenant with nothing running may stop a stream of a "
         "tenant over its share of the engines and take its slot; the stream is continued later."),
    Flag("--preemption-swap", "admission", "preemption_swap", click.Choice(["on", "off"]), "off",
         "With a prefill pool: a request that pre-empted a stream goes to that stream's decode engine; "
         "with fewer than minUncachedTokens uncached it is computed there, not prefilled elsewhere."),
    Flag("--prefill-ahead", "admission", "prefill_ahead", float, 1.0,
         "With a prefill pool: while no decode slot is free, the next requests in fair order, at most "
         "this share of the decode capacity, are prefilled as they wait, so a slot that frees starts "
         "one at once (0: off)."),
    Flag("--recall", "admission", "recall", click.Choice(["on", "off"]), "on",
         "Take back requests an engine queues beyond its learned capacity (none started) to wait "
         "in the fair queue again."),
    Flag("--max-in-flight-per-endpoint", "admission", "max_in_flight_per_endpoint", int, 65536,
         "Most requests the router keeps open to one engine, whatever its capacity."),
    Flag("--max-waiting-per-endpoint", "admission", "max_waiting_per_endpoint", _OffOr(int), None,
         "Hold new requests while an engine reports this many waiting [default: off]."),
    Flag("--max-kv-usage", "admission", "max_kv_usage", _OffOr(float), None,
         "Hold new requests while an engine reports this KV-cache usage, 0-1 [default: off]."),
    Flag("--max-queue-wait", "admission", "max_queue_wait_seconds", float, 60.0,
         "Longest wait in the router's queue before a 429, seconds (the TTFT objective may be sooner)."),
    Flag("--tenant-weight", "admission", "tenant_weights", str, (),
         "TENANT=WEIGHT: a tenant's share of service relative to others (default 1); repeatable.",
         multiple=True),
    Flag("--replicas", "admission", "replicas", int, None,
         "Gateway replicas sending to the same engines: each takes its share of their capacity "
         "[default: spec.router.replicas in a cluster, else 1]."),
    Flag("--shared-counters", "admission", "shared_counters", click.Choice(["auto", "redis", "off"]), "auto",
         "Share fair-queue counters between replicas through the KV pool's Redis (auto: with more than "
         "one replica and a pool)."),
    Flag("--counter-sync-interval", "admission", "counter_sync_seconds", float, 0.1,
         "Seconds between syncs of the shared fair-queue counters."),
    Flag("--max-tenant-labels", "admission", "max_tenant_labels", int, 50,
         "Tenants named in metric labels; later ones are counted as 'other'."),
    Flag("--kube-api-server", "discovery", "kube_api_server", str, None,
         "Kubernetes API URL to use without credentials (e.g. kubectl proxy); default: in-cluster."),
    Flag("--metrics-interval", "collector", "interval_seconds", float, 1.0,
         "Seconds between scrapes of every engine's /metrics."),
    Flag("--metrics-timeout", "collector", "timeout_seconds", float, 1.0,
         "Longest wait for one engine's /metrics, seconds."),
    Flag("--metrics-learning-interval", "collector", "learning_interval_seconds", float, 0.25,
         "Seconds between scrapes while an engine's capacity is being learned."),
    Flag("--prefix-source", "scheduling", "prefix_source", click.Choice(["approximate", "precise"]),
         None, "Prefix-cache state: the router's routing history, or the engines' KV events "
         "[default: spec.router.prefixSource]."),
    Flag("--pending-ttl", "scheduling", "pending_ttl_seconds", float, 2.0,
         "With --prefix-source precise: seconds a routed prompt's blocks still count as cached on its "
         "engine after its first token, until its KV events arrive."),
    Flag("--kv-events-port", "scheduling", "kv_events", int, 5557,
         "With --prefix-source precise: the port engines publish KV events on (tcp://<engine host>:PORT), "
         "unless the router config's kvEvents says where."),
    Flag("--imbalance-abs", "scheduling", "imbalance_abs_threshold", float, 64.0,
         "Imbalance guard: requests above the least-loaded engine before one is skipped."),
    Flag("--imbalance-rel", "scheduling", "imbalance_rel_threshold", float, 1.5,
         "Imbalance guard: and this many times its load."),
    Flag("--log-prompts", "access", "log_prompts", bool, False,
         "Put prompt and output text in the request log lines (also on with spec.router.logPrompts).",
         is_flag=True),
    Flag("--topology-headers", "access", "topology_headers", bool, False,
         "Name the engines that served each request in x-tandem-* response headers (diagnostics: "
         "clients learn pod addresses and whether a prompt was cached).", is_flag=True),
    Flag("--max-request-bytes", "access", "max_request_bytes", int, 4 * 1024 * 1024,
         "Largest request body accepted; larger ones get 413."),
    Flag("--header-seconds", "access", "header_seconds", float, 10.0,
         "Seconds a client has to send a request's line and headers, from connecting or from its first "
         "byte after a response; then 408 and the connection is closed."),
    Flag("--max-connections", "access", "max_connections", int, 4096,
         "Client connections one gateway process (each worker) serves at once; more are answered 503 "
         "and closed."),
    Flag("--metrics-port", "access", "metrics_port", int, None,
         "Serve /metrics on this port only (the diagnostics port), behind TANDEM_METRICS_TOKEN when set; "
         "the client port then answers /metrics with 404."),
    Flag("--otlp-traces-endpoint", "tracing", "endpoint", str, None,
         "Trace requests to this OTLP endpoint (or file://DIR); wins over OTEL_* and the spec's tracing."),
    Flag("--otlp-traces-protocol", "tracing", "protocol", click.Choice(["grpc", "http/protobuf"]), None,
         "OTLP protocol of --otlp-traces-endpoint [default: the spec's, else grpc]."),
    Flag("--trace-sampling-ratio", "tracing", "sampling_ratio", float, None,
         "Share of requests without a sampled parent that are traced (parent-based)."),
    Flag("--api-keys-reload-interval", "access", "api_keys_reload_seconds", float, 2.0,
         "Seconds between checks of the API key file for changes (a Secret updated in place)."),
)  # fmt: skip
_BY_FIELD = {(flag.section, flag.field): flag.name for flag in FLAGS}


def tuning_options(command: F) -> F:
    """Add every flag of `FLAGS` to a click command."""
    for flag in reversed(FLAGS):
        command = click.option(
            flag.name,
            flag.dest,
            type=flag.type,
            default=flag.default,
            show_default=flag.default is not None and flag.default != () and not flag.is_flag,
            multiple=flag.multiple,
            is_flag=flag.is_flag,
            help=flag.help,
        )(command)
    return command


def settings_from_flags(values: Mapping[str, Any]) -> RouterSettings:
    """`RouterSettings` from the flags' values (keyed by `Flag.dest`). Raises `click.UsageError`
    naming the flag when a value is out of range."""
    sections: dict[str, dict[str, Any]] = {}
    for flag in FLAGS:
        value = values[flag.dest]
        if flag.multiple:
            value = _weights(value)
        if flag.field == "kv_events":
            value = {"port": value}
        sections.setdefault(flag.section, {})[flag.field] = value
    try:
        return RouterSettings.model_validate(sections)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first["loc"]]
        name = _BY_FIELD.get((loc[0], loc[1]), ".".join(loc)) if len(loc) > 1 else ".".join(loc)
        raise click.UsageError(f"{name}: {first['msg']}") from None
