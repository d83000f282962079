"""`tandem`: the composition root of every process Tandem runs.

Each subcommand parses its flags into typed settings, configures logging, and hands over to one
component's `run`/`serve` function. Failures end with a non-zero exit code and one line on stderr
saying why (`tandem: error: ...`).

Subcommands are imported only when invoked (or when `--help` lists them): `tandem sim` must not pay
for importing kopf, the Kubernetes client and the gateway, since the local runtime and the benchmark
harness start many engine processes.
"""

from __future__ import annotations

import importlib
from typing import IO, Any

import click

#: Subcommand name → "module:attribute" of its click command, in the order `--help` lists them.
COMMANDS = {
    "up": "tandem.cli.up:up",
    "status": "tandem.cli.status:status",
    "trace": "tandem.cli.trace:trace",
    "validate": "tandem.cli.validate:validate",
    "sim": "tandem.cli.sim:sim",
    "router": "tandem.cli.router:router",
    "operator": "tandem.cli.operator:operator",
    "crd": "tandem.cli.crd:crd",
    "render": "tandem.cli.render:render",
    "adapters": "tandem.cli.adapters:adapters",
    "bench": "tandem.cli.bench:bench",
    "kvpool": "tandem.cli.kvpool:kvpool",
    "autoscaler": "tandem.cli.autoscaler:autoscaler",
    "dev": "tandem.cli.dev:dev",
}


class Failure(click.ClickException):
    """A `click.ClickException` shown as every Tandem failure is: `tandem: error: ...` on stderr."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"tandem: error: {self.format_message()}", err=True)


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use, and whose failures (a command's
    `click.ClickException`) read `tandem: error: ...` like the rest; usage errors keep click's form."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if type(exc) is not click.ClickException:  # UsageError & co. (exit 2, with a hint)
                raise
            raise Failure(exc.message) from None  # same exit code, 1

    def __init__(self, *args: object, lazy: dict[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self._lazy, *sorted(super().list_commands(ctx))]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self._lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = target.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="tandem", prog_name="tandem")
def cli() -> None:
    """Tandem: a control plane for disaggregated LLM inference (prefill and decode pools, a Redis KV
    pool, a prefix-, SLO- and fairness-aware OpenAI gateway, and an autoscaler)."""


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="tandem")


if __name__ == "__main__":
    main()
