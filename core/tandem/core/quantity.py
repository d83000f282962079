"""Kubernetes resource quantities (`32Gi`, `500M`, `1.5`, `1e3`) as numbers.

The grammar of apimachinery's `resource.Quantity` (a number, then a binary or decimal suffix or a
decimal exponent), without negative values, which no size or count Tandem reads can take. Kept here
rather than taken from the `kubernetes` client, which Tandem does not depend on (docs/decisions.md).
"""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "K": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(
    r"^\+?(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:[eE](?P<exponent>[+-]?[0-9]+)|(?P<suffix>[a-zA-Z]*))$"
)


def parse_quantity(text: str) -> Decimal:
    """`"1Gi"` → 1073741824, `"500m"` → 0.5, `"1e3"` → 1000 (but `"1E"` is 10**18, the suffix);
    raises ValueError for anything else."""
    match = _QUANTITY.match(text.strip())
    if not match or (match["exponent"] is None and match["suffix"] not in _SUFFIXES):
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number = Decimal(match["number"])
    if match["exponent"] is not None:
        return number.scaleb(int(match["exponent"]))
    return number * _SUFFIXES[match["suffix"]]


def parse_bytes(text: str) -> int:
    """A memory quantity in whole bytes, rounded down: `"1.5Gi"` → 1610612736."""
    return int(parse_quantity(text))
