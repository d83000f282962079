"""Reading an engine's command-line arguments (`spec.engine.args`) the way vLLM's argparse does."""

from __future__ import annotations

from collections.abc import Sequence


def arg_value(args: Sequence[str], flag: str, *aliases: str) -> str | None:
    """The value given to `flag` or one of its `aliases` (`--flag v` or `--flag=v`); the last one when
    it is given twice, as argparse keeps; None when it is not given. Examples: `["--dtype", "half"]`
    → `"half"`; `arg_value(["-tp", "2"], "--tensor-parallel-size", "-tp")` → `"2"`."""
    value = None
    for index, arg in enumerate(args):
        for name in (flag, *aliases):
            if arg == name and index + 1 < len(args):
                value = args[index + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def without_flag(args: Sequence[str], flag: str) -> list[str]:
    """`args` without `flag` and its value (`--flag v` and `--flag=v`, every time it is given).
    Example: `without_flag(["--seed", "0", "--max-num-seqs", "4"], "--max-num-seqs")` → `["--seed", "0"]`."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            kept.append(arg)
    return kept
