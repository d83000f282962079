"""A peer router given as a command line: `--peer-command NAME=TEMPLATE` (pure, but for `find_program`).

TEMPLATE is split like a shell would (`shlex.split`, no shell runs it), then every `{placeholder}`
in every argument is replaced by what the harness planned:

| placeholder | value |
| --- | --- |
| `{host}` | `127.0.0.1` |
| `{port}` | the port the router must listen on (on `{host}`) |
| `{metrics_port}` | another free port, for a metrics listener if the router wants one |
| `{model}` | the served model name |
| `{decode_models}` | the model name once per decode engine, comma-separated (a model per URL) |
| `{decode_urls}` | the decode engines' base URLs, comma-separated (`http://127.0.0.1:8101,http://...`) |
| `{decode_urls_space}` | the same, space-separated; as a whole argument, one argument per URL |
| `{prefill_urls}`, `{prefill_urls_space}` | the prefill engines' (`--pd`; empty without) |

Example: `a --backends {decode_urls_space} --at {host}:{port}` with two engines →
`a --backends http://127.0.0.1:1 http://127.0.0.1:2 --at 127.0.0.1:9000`. Any other `{word}` is an
error naming it; braces around anything else (`{"a": 1}`) are kept as they are.
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
#: Placeholders that stand for several URLs; as a whole argument they become one argument each.
LISTS = ("decode_urls_space", "prefill_urls_space")
PLACEHOLDERS = (
    "host", "port", "metrics_port", "model", "decode_models", "decode_urls", "prefill_urls", *LISTS,
)  # fmt: skip
#: A target label given by the user (`--peer-command NAME=...`, `--variant NAME=...`).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class PeerCommandError(ValueError):
    """A `--peer-command` value that cannot be run; the message names the flag and what is wrong."""


@dataclass(frozen=True)
class PeerCommand:
    """One `--peer-command`: its label, the template as given, and the template split into arguments."""

    name: str
    template: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Wiring:
    """What the harness planned for the peer: its ports, the model, the engines' base URLs."""

    port: int
    metrics_port: int
    model: str
    decode: tuple[str, ...]
    prefill: tuple[str, ...] = ()

    def values(self) -> dict[str, str]:
        """Each placeholder's text inside a longer argument."""
        return {
            "host": LOOPBACK, "port": str(self.port), "metrics_port": str(self.metrics_port),
            "model": self.model, "decode_models": ",".join([self.model] * len(self.decode)),
            "decode_urls": ",".join(self.decode), "prefill_urls": ",".join(self.prefill),
            "decode_urls_space": " ".join(self.decode), "prefill_urls_space": " ".join(self.prefill),
        }  # fmt: skip

    def lists(self) -> dict[str, tuple[str, ...]]:
        """The arguments a whole-argument list placeholder becomes."""
        return {"decode_urls_space": self.decode, "prefill_urls_space": self.prefill}


def placeholders(argv: Sequence[str]) -> list[str]:
    """Every `{word}` in the arguments, in order of first appearance."""
    return list(dict.fromkeys(m.group(1) for arg in argv for m in _FIELD.finditer(arg)))


def parse_peer_command(value: str) -> PeerCommand:
    """`NAME=TEMPLATE` → a PeerCommand. Raises PeerCommandError for a missing `=`, a NAME other than
    letters, digits and `-_.` (starting with a letter or digit, at most 64), a TEMPLATE that does not
    split (an unclosed quote) or is empty, or unknown placeholders (all named)."""
    name, sep, template = value.partition("=")
    name = name.strip()
    if not sep:
        raise PeerCommandError(f"--peer-command {value!r}: expected NAME=TEMPLATE")
    if not NAME.fullmatch(name):
        raise PeerCommandError(
            f"--peer-command {name!r}: NAME must be letters, digits and -_. (starting with a letter or digit)"
        )
    try:
        argv = tuple(shlex.split(template))
    except ValueError as exc:
        raise PeerCommandError(f"--peer-command {name}: cannot split the command: {exc}") from None
    if not argv:
        raise PeerCommandError(f"--peer-command {name}: the command is empty")
    unknown = [p for p in placeholders(argv) if p not in PLACEHOLDERS]
    if unknown:
        raise PeerCommandError(
            f"--peer-command {name}: unknown placeholder(s) {', '.join('{' + p + '}' for p in unknown)}; "
            f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
        )
    return PeerCommand(name, template.strip(), argv)


def fill(argv: Sequence[str], wiring: Wiring) -> tuple[str, ...]:
    """The command line with every placeholder replaced (module doc); an argument that is exactly a list
    placeholder becomes one argument per URL (none when there are none)."""
    values, lists = wiring.values(), wiring.lists()
    out: list[str] = []
    for arg in argv:
        whole = _FIELD.fullmatch(arg)
        if whole is not None and whole.group(1) in lists:
            out.extend(lists[whole.group(1)])
            continue
        out.append(_FIELD.sub(lambda m: _value(values, m.group(1)), arg))
    return tuple(out)


def _value(values: Mapping[str, str], key: str) -> str:
    if key not in values:
        raise PeerCommandError(f"unknown placeholder {{{key}}}")
    return values[key]


def find_program(peer: PeerCommand) -> str | None:
    """The program the command starts (a path, or a name looked up on PATH), if it is executable."""
    return shutil.which(peer.argv[0])
