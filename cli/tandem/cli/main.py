"""`tandem`: the composition root of every process Tandem runs.

Each subcommand parses its flags into typed settings, configures logging, and hands over to one
component's `run`/`serve` function. Failures end with a non-zero exit code and one line on stderr
saying why (`tandem: error: ...`).
"""

from __future__ import annotations

import click

from tandem.cli.bench import bench
from tandem.cli.crd import crd
from tandem.cli.operator import operator
from tandem.cli.router import router
from tandem.cli.sim import sim
from tandem.cli.up import up
from tandem.cli.validate import validate


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="tandem", prog_name="tandem")
def cli() -> None:
    """Tandem: a control plane for disaggregated LLM inference (prefill and decode pools, a Redis KV
    pool, a prefix-, SLO- and fairness-aware OpenAI gateway, and an autoscaler)."""


cli.add_command(validate)
cli.add_command(up)
cli.add_command(sim)
cli.add_command(router)
cli.add_command(bench)
cli.add_command(operator)
cli.add_command(crd)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="tandem")


if __name__ == "__main__":
    main()
