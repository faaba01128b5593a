"""Runtime overrides of a group's targets and priority (`santhrottle group set`).

What it owns
    GroupOverride: what an admin set on one [groups.NAME] at run time, each
    field None where the file's value stays: the priority, the latency
    target (seconds) and the throughput target ((value, "B/s" or "iops"), as
    the config's throughput() Kind gives it: setting one unit drops the
    other).  The checks of each value (check_*), with the configuration
    file's own Kinds and bounds (config/schema.py's groups.NAME keys), for
    the control socket's requests (daemon/control/requests.py) and the state file
    (daemon/core/state.py); merge() of a new set over an earlier one; overlay()
    of the override on the file's group, the values the controller gets
    (grouping.specs); to_json() / from_json() for the state file and the
    answers; prune() of the overrides of groups the configuration no longer
    has (a reload, a restart with another file), with a log line.

Lifetime
    Like a threshold override: kept in the daemon's state file, so it
    survives a restart; a reload keeps it while the group exists;
    `santhrottle group reset NAME` drops it (the file's values again).

Worked example
    [groups.db] priority = 2, latency_target = "10ms", throughput_target = "200MB/s";
    `santhrottle group set db --priority 4 --throughput-target 5000iops` ->
    GroupOverride(priority=4.0, throughput_target=(5000.0, "iops")); overlay() ->
    priority 4, latency target 0.010 s, throughput 5000 IOs/s and no B/s target;
    to_json() -> {"priority": 4.0, "throughput_target_iops": 5000.0}.
    check_latency_target_s(90) -> KindError "90 s is above 60s".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from santhrottle.appliance.config.kinds import IOPS_SUFFIX, KindError, positive_number, quote
from santhrottle.appliance.config.parse import GroupConfig
from santhrottle.appliance.config.schema import key
from santhrottle.appliance.units import MAX_BYTE_RATE_BYTES_S

log = logging.getLogger("santhrottled")

NS_PER_S = 10**9
BYTES_PER_S = "B/s"
# The JSON keys of an override's fields (state file, answers), in this order.
FIELDS = ("priority", "latency_target_s", "throughput_target_bps", "throughput_target_iops")
PRIORITY_KEY = key("groups.NAME.priority")
LATENCY_KEY = key("groups.NAME.latency_target")
THROUGHPUT_KEY = key("groups.NAME.throughput_target")


@dataclass(frozen=True)
class GroupOverride:
    priority: float | None = None
    latency_target_s: float | None = None
    throughput_target: tuple[float, str] | None = None  # (value, "B/s" or "iops")

    def empty(self) -> bool:
        return self == GroupOverride()


def _through(kind_parse: Any, text: str, v: Any, shown: str) -> Any:
    """text through the file's Kind; its error quotes what was sent, not text."""
    try:
        return kind_parse(text)
    except KindError as e:
        raise KindError(str(e).replace(repr(text), shown, 1)) from None


def check_priority(v: Any) -> float:
    """A priority as the file takes it: a number within MIN_PRIORITY..MAX_PRIORITY."""
    positive_number(v, "a number")
    return float(PRIORITY_KEY.kind.parse(v))


def check_latency_target_s(v: Any) -> float:
    """Seconds, rounded to whole ns, within the file's bounds for latency_target."""
    s = positive_number(v, "a number of seconds")
    ns = int((Decimal(repr(s)) * NS_PER_S).to_integral_value())
    if ns <= 0:
        raise KindError(f"{quote(v)} is below 1ns")
    return float(_through(LATENCY_KEY.kind.parse, f"{ns}ns", v, f"{quote(v)} s"))


def check_throughput_bps(v: Any) -> float:
    """Bytes per second, > 0, through the file's throughput Kind."""
    x = positive_number(v, "a number of bytes per second")
    if x > MAX_BYTE_RATE_BYTES_S:
        raise KindError(f"{quote(v)} B/s is above {MAX_BYTE_RATE_BYTES_S} B/s")
    text = format(Decimal(repr(x)), "f") + BYTES_PER_S
    value, _unit = _through(THROUGHPUT_KEY.kind.parse, text, v, f"{quote(v)} B/s")
    return float(value)


def check_throughput_iops(v: Any) -> float:
    """IOs per second, > 0, through the file's throughput Kind."""
    x = positive_number(v, "a number of IOs per second")
    value, _unit = _through(THROUGHPUT_KEY.kind.parse, f"{x!r}{IOPS_SUFFIX}", v, quote(v))
    return float(value)


def merge(old: GroupOverride | None, new: GroupOverride) -> GroupOverride:
    """new's fields over old's (a throughput target replaces the other unit's)."""
    if old is None:
        return new
    return GroupOverride(
        new.priority if new.priority is not None else old.priority,
        new.latency_target_s if new.latency_target_s is not None else old.latency_target_s,
        new.throughput_target if new.throughput_target is not None else old.throughput_target,
    )


def overlay(g: GroupConfig, o: GroupOverride | None) -> GroupConfig:
    """The file's group with the override's fields in force."""
    if o is None:
        return g
    out = g
    if o.priority is not None:
        out = replace(out, priority=o.priority)
    if o.latency_target_s is not None:
        out = replace(out, latency_target_s=o.latency_target_s)
    if o.throughput_target is not None:
        value, unit = o.throughput_target
        out = replace(
            out,
            throughput_target_bps=value if unit == BYTES_PER_S else None,
            throughput_target_iops=value if unit == IOPS_SUFFIX else None,
        )
    return out


def to_json(o: GroupOverride | None) -> dict[str, float]:
    """The fields set, by their JSON keys ({} for none)."""
    if o is None:
        return {}
    out: dict[str, float] = {}
    if o.priority is not None:
        out["priority"] = o.priority
    if o.latency_target_s is not None:
        out["latency_target_s"] = o.latency_target_s
    if o.throughput_target is not None:
        value, unit = o.throughput_target
        out["throughput_target_bps" if unit == BYTES_PER_S else "throughput_target_iops"] = value
    return out


def from_json(doc: Any) -> GroupOverride:
    """An override from to_json()'s shape; KindError naming the field otherwise."""
    if not isinstance(doc, Mapping):
        raise KindError("must be an object of " + ", ".join(FIELDS))
    extra = sorted(str(k) for k in doc if k not in FIELDS)
    if extra:
        raise KindError(f"unknown field {quote(extra[0])} (expected: {', '.join(FIELDS)})")
    checks = (check_priority, check_latency_target_s, check_throughput_bps, check_throughput_iops)
    got: dict[str, float] = {}
    for field, check in zip(FIELDS, checks, strict=True):
        if doc.get(field) is not None:
            try:
                got[field] = check(doc[field])
            except KindError as e:
                raise KindError(f"{field}: {e}") from None
    if "throughput_target_bps" in got and "throughput_target_iops" in got:
        raise KindError("throughput_target_bps and throughput_target_iops: one or the other")
    tp: tuple[float, str] | None = None
    if "throughput_target_bps" in got:
        tp = (got["throughput_target_bps"], BYTES_PER_S)
    elif "throughput_target_iops" in got:
        tp = (got["throughput_target_iops"], IOPS_SUFFIX)
    return GroupOverride(got.get("priority"), got.get("latency_target_s"), tp)


def prune(
    overrides: MutableMapping[str, GroupOverride], groups: Mapping[str, Any], why: str
) -> list[str]:
    """Drop the overrides of groups no longer configured (logged); their names."""
    gone = sorted(n for n in overrides if n not in groups)
    for name in gone:
        log.warning(
            "groups: %s: group %r is no longer configured; its runtime override %s is dropped",
            why,
            name,
            to_json(overrides.pop(name)),
        )
    return gone
