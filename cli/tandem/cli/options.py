"""Options shared by the long-running commands (`sim`, `router`, `operator`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])

LOG_LEVELS = ("debug", "info", "warning", "error")


def logging_options(func: F) -> F:
    """Add `--log-level` and `--log-format` (passed as `log_level` and `log_format`)."""
    func = click.option(
        "--log-format",
        type=click.Choice(["json", "text"]),
        default="json",
        show_default=True,
        help="json: one JSON object per line (for log pipelines); text: for terminals.",
    )(func)
    return click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True)(func)


#: `-f/--file FILE`: InferenceService documents (`tandem validate`, `tandem render`).
documents_file = click.option(
    "-f",
    "--file",
    "path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="YAML file with one or more InferenceService documents.",
)
