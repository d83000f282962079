"""`tandem sim`: serve one simulated vLLM engine (see docs/sim.md)."""

from __future__ import annotations

from typing import Any, get_args

import click
from pydantic import ValidationError

from tandem.cli.options import logging_options
from tandem.core.logs import configure_logging
from tandem.sim.engine.profiles import PROFILES, Profile
from tandem.sim.settings import DEFAULT_PROFILE, MaxLoRARank, SimSettings


def profile_table(block_size: int = 16) -> str:
    """One line per profile: model shape, device, KV bytes per token and the derived KV cache."""
    header = (
        f"{'profile':<18} {'model':<26} {'params':>7} {'layers':>6} {'kv_heads':>8} {'head_dim':>8} "
        f"{'kv_B/token':>10} {'device':<15} {'TFLOP/s':>7} {'TB/s':>6} {'gpu_blocks':>10} {'max_len':>7}"
    )
    return "\n".join([header, *(_profile_line(p, block_size) for p in PROFILES.values())])


def _profile_line(profile: Profile, block_size: int) -> str:
    model, device = profile.model, profile.accelerator
    return (
        f"{profile.name:<18} {model.model_id:<26} {_count(model.params):>7} {model.layers:>6} "
        f"{model.kv_heads:>8} {model.head_dim:>8} {model.kv_bytes_per_token:>10} {device.name:<15.15} "
        f"{device.peak_flops / 1e12:>7.4g} {device.memory_bandwidth / 1e12:>6.3g} "
        f"{profile.num_gpu_blocks(block_size):>10} {profile.max_model_len:>7}"
    )


def _count(value: float) -> str:
    """7.6e9 → "7.6B", 2.2e6 → "2.2M"."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _list_profiles(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(profile_table())
        ctx.exit(0)


def build_settings(values: dict[str, Any]) -> SimSettings:
    """Validate the engine flags once; a bad value is a usage error (exit code 2) naming the flag.
    `--max-lora-rank` arrives as click's choice string; each `--lora-modules` value stays one string
    (SimSettings parses vLLM's two forms)."""
    values = dict(values)
    if isinstance(values.get("max_lora_rank"), str):
        values["max_lora_rank"] = int(values["max_lora_rank"])
    if isinstance(values.get("lora_modules"), tuple):
        values["lora_modules"] = list(values["lora_modules"])
    try:
        return SimSettings.model_validate(values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            loc = error["loc"]
            problems.append(f"--{str(loc[0]).replace('_', '-')}: {message}" if loc else message)
        raise click.UsageError("; ".join(problems)) from None


@click.command()
@click.option(
    "--list-profiles",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_list_profiles,
    help="Print the model/GPU profiles and exit.",
)
@click.option(
    "--profile", default=DEFAULT_PROFILE, show_default=True, help="Model/GPU profile of the time model."
)
@click.option("--model", default=None, help="Model name used in KV pool keys [default: the profile's model].")
@click.option("--served-model-name", default=None, help="Model name clients send [default: --model].")
@click.option(
    "--max-model-len", type=int, default=None, help="Context limit in tokens [default: the profile's]."
)
@click.option("--max-num-seqs", type=int, default=256, show_default=True, help="Most sequences per step.")
@click.option(
    "--max-num-batched-tokens",
    type=int,
    default=8192,
    show_default=True,
    help="Token budget per step (chunked prefill splits longer prompts).",
)
@click.option("--block-size", type=int, default=16, show_default=True, help="Tokens per KV block.")
@click.option(
    "--num-gpu-blocks", type=int, default=None, help="KV blocks [default: derived from the profile]."
)
@click.option(
    "--time-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Simulated seconds per wall second (100: runs 100x faster than real time).",
)
@click.option(
    "--kv-role",
    type=click.Choice(["none", "producer", "consumer", "both"]),
    default="none",
    show_default=True,
    help="Write prompt KV to the pool (producer) and/or read it (consumer).",
)
@click.option("--kv-pool", default=None, help="KV pool URL, redis://HOST:PORT.")
@click.option(
    "--kv-chunk-size",
    type=int,
    default=256,
    show_default=True,
    help="Tokens per KV pool chunk (a multiple of --block-size).",
)
@click.option(
    "--kv-bytes-scale",
    type=float,
    default=1 / 64,
    show_default="1/64",
    help="Fraction of the true KV bytes actually stored per chunk.",
)
@click.option(
    "--kv-generation",
    default=None,
    help="This engine's KV generation (e.g. its pod's tandem.dev/kv-layout): pool chunks another "
    "generation wrote are loaded as a real engine would, counted, and garble the answer.",
)
@click.option(
    "--kv-layout",
    default=None,
    help="This engine's KV layout (its pod's tandem.dev/kv-layout), in its pool keys' scope as Tandem's "
    "connector puts it: engines of two layouts share no chunk.",
)
@click.option("--seed", type=int, default=None, help="Seed for unseeded sampling [default: random].")
@click.option(
    "--otlp-traces-endpoint",
    default=None,
    help="Send vLLM's llm_request span of every finished request here (OTLP; protocol from "
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, grpc by default), or write them to file://DIR.",
)
@click.option(
    "--kv-events-endpoint",
    default=None,
    help="Publish vLLM KV events on a ZMQ PUB socket bound here, e.g. tcp://127.0.0.1:5557.",
)
@click.option(
    "--kv-events-replay-endpoint",
    default=None,
    help="Serve KV-event replays on a ZMQ ROUTER socket bound here, e.g. tcp://127.0.0.1:5558.",
)
@click.option("--kv-events-topic", default="", help="Topic frame of every KV-event message.")
@click.option(
    "--kv-events-encoding",
    type=click.Choice(["array", "map"]),
    default="map",
    show_default=True,
    help="Event encoding: map (vLLM >= PR #42892) or array (older vLLM, positional).",
)
@click.option(
    "--kv-events-buffer-steps",
    type=int,
    default=10_000,
    show_default=True,
    help="Batches kept for replay.",
)
@click.option(
    "--enable-lora", is_flag=True, default=False, help="Serve LoRA adapters (vLLM's --enable-lora)."
)
@click.option(
    "--max-loras", type=int, default=1, show_default=True, help="Most distinct adapters in one batch."
)
@click.option(
    "--max-lora-rank",
    type=click.Choice([str(rank) for rank in get_args(MaxLoRARank)]),
    default="16",
    show_default=True,
    help="Largest adapter rank accepted.",
)
@click.option(
    "--max-cpu-loras", type=int, default=None, help="Adapters kept in CPU memory [default: --max-loras]."
)
@click.option(
    "--lora-modules",
    multiple=True,
    help='An adapter served from the start: `name=path` or JSON {"name", "path"[, "base_model_name"]}, '
    "as vLLM's; repeatable.",
)
@click.option(
    "--api-key",
    envvar="VLLM_API_KEY",
    default=None,
    help="Require `Authorization: Bearer KEY` on /v1/* as vLLM does (env VLLM_API_KEY, where a "
    "cluster puts it); /health and /metrics stay open.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port to listen on."
)
@logging_options
def sim(*, host: str, port: int, log_level: str, log_format: str, **engine: Any) -> None:
    """Serve a simulated vLLM engine: the OpenAI endpoints, /tokenize, /metrics with vLLM's names,
    continuous batching on a roofline time model, prefix caching, KV roles over Redis, and vLLM's
    KV events over ZMQ."""
    settings = build_settings(engine)
    configure_logging(log_level, json_lines=log_format == "json")
    # Imported here so `tandem --help` and the other commands do not pay for the server stack.
    import uvicorn

    from tandem.sim.app import create_app

    try:
        app = create_app(settings)
    except ValueError as exc:  # a --lora-modules adapter that does not load, a bad resolver directory
        raise click.UsageError(str(exc)) from None
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
