"""Kubernetes quantities as numbers. Pure."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tandem.core.quantity import parse_bytes, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", Decimal(2**30)),
        ("32Gi", Decimal(32 * 2**30)),
        ("500M", Decimal(500 * 10**6)),
        ("500m", Decimal("0.5")),
        ("1.5Ki", Decimal(1536)),
        ("7", Decimal(7)),
        ("1e3", Decimal(1000)),
        ("5E-1", Decimal("0.5")),
        ("1E", Decimal(10**18)),
        (".5", Decimal("0.5")),
        ("2.", Decimal(2)),
    ],
)
def test_quantities_parse_to_their_value(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


def test_byte_quantities_round_down_to_whole_bytes() -> None:
    assert parse_bytes("1.5Gi") == 1610612736


@pytest.mark.parametrize("text", ["", "Gi", "1 GB", "1Xi", "-1Gi", "1e", "1e3Gi", "."])
def test_malformed_quantities_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)
