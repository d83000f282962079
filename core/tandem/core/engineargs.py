"""Reading an engine's command-line arguments (`spec.engine.args`) the way vLLM's argparse does."""

from __future__ import annotations

from collections.abc import Sequence


def arg_value(args: Sequence[str], flag: str) -> str | None:
    """The value given to `flag` (`--flag v` or `--flag=v`); the last one when it is given twice,
    as argparse keeps; None when it is not given. Example: `["--dtype", "half"]` → `"half"`."""
    value = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value
