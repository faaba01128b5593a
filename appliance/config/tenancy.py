"""The Kinds of a group's elastic levels and of the meter's prices (docs/levels.md).

What it owns
    levels(measure): a [groups.NAME] *_levels value, a list of rising caps:
    IOs per second (numbers, or "600iops") for iops_levels, byte rates
    ("20MB/s") for bandwidth_levels; parsed to a tuple of caps per second,
    checked by the controller's own Levels (controller/levels.py). LEVEL_KEYS
    names the six keys: iops_levels, read_iops_levels, write_iops_levels,
    bandwidth_levels, read_bandwidth_levels, write_bandwidth_levels.

Worked example
    iops_levels = [600, 1200, "2400iops"] -> (600.0, 1200.0, 2400.0);
    bandwidth_levels = ["20MB/s", "40MB/s"] -> (20e6, 40e6);
    iops_levels = [600, 600] -> "[600, 600] are not levels: levels must rise from
    one to the next".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from santhrottle.appliance.config.kinds import (
    IOPS_SUFFIX,
    MAX_IOPS,
    Kind,
    KindError,
    byte_rate,
    kind_error,
    quote,
)
from santhrottle.controller import disktime
from santhrottle.controller.levels import Levels, LevelsError

# At most this many levels in one Levels: IOTune's are four; a hundred is a typo.
MAX_LEVELS = 32
# (config key, Levels.measure, Levels.direction)
LEVEL_KEYS = tuple(
    (f"{'' if d == 'all' else d + '_'}{m}_levels", m, d)
    for m in ("iops", "bandwidth")
    for d in ("all", "read", "write")
)


def _iops(v: Any) -> float:
    if isinstance(v, str) and v.strip().lower().endswith(IOPS_SUFFIX):
        try:
            v = float(v.strip()[: -len(IOPS_SUFFIX)])
        except ValueError:
            raise kind_error(v, 'is not a rate of IOs: e.g. 600 or "600iops"') from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < MAX_IOPS:
        raise kind_error(v, f'is not a rate of IOs: e.g. 600 or "600iops" (below {MAX_IOPS:g})')
    return float(v)


def levels(measure: str) -> Kind:
    """A list of rising caps: IOPS or byte rates."""
    rate = byte_rate()

    def parse(v: Any) -> tuple[float, ...]:
        if not isinstance(v, list) or not v:
            raise kind_error(v, "must be a list of levels, lowest first")
        if len(v) > MAX_LEVELS:
            raise KindError(f"{len(v)} levels: at most {MAX_LEVELS}")
        caps = tuple(_iops(x) if measure == "iops" else float(rate.parse(x)) for x in v)
        try:
            Levels(caps, measure)
        except LevelsError as e:
            raise KindError(f"{quote(v)} are not levels: {e}") from None
        return caps

    if measure == "iops":
        return Kind('list of rising IOPS, e.g. [600, 1200, 2400, "4800iops"]', parse)
    return Kind('list of rising byte rates, e.g. ["20MB/s", "40MB/s"]', parse)


def group_levels(values: dict[str, Any]) -> tuple[Levels, ...]:
    """A [groups.NAME] table's parsed values -> its Levels, in LEVEL_KEYS' order."""
    return tuple(
        Levels(values[key], measure, direction)
        for key, measure, direction in LEVEL_KEYS
        if values.get(key) is not None
    )


@dataclass(frozen=True)
class MeteringConfig:
    """[metering] (config/schema.py): the period, how long closed ones are kept, the prices."""

    period_s: float = 3600.0
    retention_s: float = 400 * 86400.0
    price_per_iops_hour: float = 0.0
    price_per_mib_s_hour: float = 0.0


def metering(values: dict[str, Any]) -> MeteringConfig:
    """[metering]'s parsed values -> MeteringConfig."""
    return MeteringConfig(
        values["period"],
        values["retention"],
        values["price_per_iops_hour"],
        values["price_per_mib_s_hour"],
    )


class _Reserving(Protocol):
    name: str
    utilization_target: float | None
    resources: tuple[str, ...]


def over_reserved(groups: Iterable[_Reserving]) -> tuple[str, str] | None:
    """(key, message) when the groups' reservations on a resource sum to more than
    100 % (controller/disktime.py), at the file's last reservation: the one that
    tips it; None when they fit."""
    res = [g for g in groups if g.utilization_target is not None]
    line = disktime.over_reserved((g.name, g.utilization_target or 0.0, g.resources) for g in res)
    if line is None:
        return None
    return f"groups.{res[-1].name}.utilization_target", line.split(": ", 1)[1]
