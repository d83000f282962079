"""How a command ends on a failure it found itself: one line on stderr, `tandem: error: ...`, and an
exit code (1: something failed; 2: bad input, as click's usage errors). `tandem.cli.main.Failure`
shows a command's `click.ClickException` the same way."""

from __future__ import annotations

from typing import NoReturn

import click


def fail(message: str, *, code: int = 1) -> NoReturn:
    """Print `tandem: error: <message>` on stderr and exit with `code`."""
    click.echo(f"tandem: error: {message}", err=True)
    raise SystemExit(code)
