"""`tandem router`'s scheduling and collector flags land in `RouterSettings` (pure: no server runs).

Real: the flag table (`tandem.cli.routerflags.FLAGS`) and `settings_from_flags`; the values are what
click would pass.
"""

from __future__ import annotations

from typing import Any

import click
import pytest

from tandem.cli.routerflags import FLAGS, settings_from_flags


def flags(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {flag.dest: flag.default for flag in FLAGS}
    values.update(overrides)
    return values


def test_the_defaults_are_the_settings_defaults() -> None:
    settings = settings_from_flags(flags())
    assert (settings.collector.interval_seconds, settings.collector.timeout_seconds) == (1.0, 1.0)
    assert settings.scheduling.prefix_source is None  # spec.router.prefixSource decides
    assert settings.scheduling.kv_events.port == 5557
    assert (settings.scheduling.imbalance_abs_threshold, settings.scheduling.imbalance_rel_threshold) == (
        64,
        1.5,
    )


def test_scheduling_flags_set_their_fields() -> None:
    settings = settings_from_flags(
        flags(
            metrics_interval=0.5,
            metrics_timeout=0.25,
            prefix_source="precise",
            kv_events_port=6000,
            imbalance_abs=8,
            imbalance_rel=2,
        )
    )
    assert (settings.collector.interval_seconds, settings.collector.timeout_seconds) == (0.5, 0.25)
    assert (settings.scheduling.prefix_source, settings.scheduling.kv_events.port) == ("precise", 6000)
    assert (settings.scheduling.imbalance_abs_threshold, settings.scheduling.imbalance_rel_threshold) == (
        8,
        2,
    )


@pytest.mark.parametrize(
    ("override", "flag"),
    [
        ({"metrics_interval": 0}, "--metrics-interval"),
        ({"kv_events_port": 70000}, "--kv-events-port"),
        ({"imbalance_rel": 0.5}, "--imbalance-rel"),
    ],
)
def test_a_value_out_of_range_names_its_flag(override: dict[str, Any], flag: str) -> None:
    with pytest.raises(click.UsageError, match=flag):
        settings_from_flags(flags(**override))
