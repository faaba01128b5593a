"""Simulation scenarios: TOML text -> validated Scenario (pure: the caller reads the file).

The plant's tables ([run], [[resource]], [[stream]], [[group]]) are the
simulator's own, checked here; a bad field raises ScenarioError naming it
(`stream[2].depth: must be > 0`), so the CLI can print one line and exit 2.
The controller's tables are the daemon's: [controller] and [datapath]'s
step, max_delay and ladder_ratio are read by the configuration's own parser
(appliance/config: parse_controller), with the same keys, units, bounds and
cross-field checks as santhrottle.toml, and a [[group]]'s priority and
targets by the schema's kinds of [groups.NAME]. The format is documented in
docs/simulator.md; the paper's experiment is sim/scenarios/paper.toml.

Overrides (parse_scenario's `overrides`): keys of [controller] or of the
scenario's [datapath] keys, by their bare names, with values as the file
would give them (`ti_log = "1s"`, `ladder_ratio = 1.0`): the sweep's
variants (sim/sweep.py).

Worked example
    [run] duration_s = 130, thresholds_ms = [10, 15, 20]; [controller]
    ti_log = "1s" -> Scenario.thresholds_s (0.010, 0.015, 0.020) and
    controller.log_gains.ti_s 1.0; [controller] ti_log = 1 -> "controller.ti_log:
    1 is not a duration: give a number and a unit, ... (line 12)".
"""

from __future__ import annotations

import itertools
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from santhrottle.appliance.config.kinds import KindError
from santhrottle.appliance.config.parse import ConfigError, parse_controller
from santhrottle.appliance.config.schema import BY_NAME
from santhrottle.appliance.config.tenancy import LEVEL_KEYS
from santhrottle.controller.domain import ControllerConfig
from santhrottle.controller.groups import Group

from . import tenants
from .bursty import Arrivals

KIB = 1024.0
# [datapath] in a scenario: the ladder's keys (the rest is the kernel's)
DATAPATH_KEYS = ("step", "max_delay", "ladder_ratio")
# [controller] keys a scenario does not take: its thresholds are [run]'s
NOT_IN_SCENARIOS = ("default_threshold",)


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; the message names the field."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """On from start_s for on_s, off for off_s, repeated `cycles` times (0 = until the end)."""

    start_s: float = 0.0
    on_s: float = math.inf
    off_s: float = 0.0
    cycles: int = 0

    def windows(self, duration_s: float) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        t = self.start_s
        while t < duration_s and (self.cycles == 0 or len(out) < self.cycles):
            out.append((t, min(t + self.on_s, duration_s)))
            if math.isinf(self.on_s) or self.on_s + self.off_s <= 0.0:
                break
            t += self.on_s + self.off_s
        return out


@dataclass(frozen=True, slots=True)
class Stream:
    name: str
    kind: str  # "read" | "write"
    loop: str  # "open" | "closed" | "bursty"
    resource: str
    initiator: str
    size_bytes: float
    depth: float = 0.0  # closed loop
    rate_iops: float = 0.0  # open loop; closed loop: a cap (0: none)
    overhead_s: float = 0.0  # closed loop: time per IO outside the device and the delay
    schedule: Schedule = field(default_factory=Schedule)
    cost: float = 1.0  # an IO's work at the device, in ordinary IOs (sim/plant.py)
    arrivals: Arrivals | None = None  # loop "bursty" (sim/bursty.py; depth: its queue)


@dataclass(frozen=True, slots=True)
class ResourceModel:
    name: str
    intercept_s: float
    slope_s_per_io: float
    noise: float  # relative standard deviation of one read's latency
    utilization_threshold: float | None = None  # the saturation trigger (utilization.py)
    nominal_iops: float | None = None  # what a rate reservation is a share of (tenants.py)


@dataclass(frozen=True, slots=True)
class GroupModel:
    """A [[group]]: its spec, its members (initiators), its live changes (at_s, new spec)."""

    group: Group
    members: tuple[str, ...]
    changes: tuple[tuple[float, Group], ...] = ()


@dataclass(frozen=True, slots=True)
class Scenario:
    duration_s: float
    dt_s: float  # the plant's time resolution (the loop's dt)
    seed: int
    settle_s: float | None
    resources: tuple[ResourceModel, ...]
    streams: tuple[Stream, ...]
    thresholds_s: tuple[float, ...]
    controller: ControllerConfig
    groups: tuple[GroupModel, ...] = ()  # every resource is grouped when one has a target
    stalls: tuple[tuple[float, float], ...] = ()  # the array's stalls: (start, end), sorted
    compare: tuple[str, ...] = ()  # the other policies to run (sim/tenants.py)

    def switch_ons(self) -> list[float]:
        """Times at which write streams switch on (deduplicated, sorted)."""
        ts = {
            round(a, 9)
            for s in self.streams
            if s.kind == "write"
            for a, _ in s.schedule.windows(self.duration_s)
        }
        return sorted(ts)

    def default_settle_s(self) -> float:
        """End of the writers' first on-period: the sets learn who writes then."""
        if self.settle_s is not None:
            return self.settle_s
        ends = [
            s.schedule.windows(self.duration_s)[0][1]
            for s in self.streams
            if s.kind == "write" and s.schedule.windows(self.duration_s)
        ]
        return min(ends) if ends else 0.0


class _Table:
    """A TOML table that remembers its path and which keys were used."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise ScenarioError(f"{path}: must be a table")
        self.data: dict[str, Any] = data
        self.path = path
        self.used: set[str] = set()

    def _where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        self.used.add(key)
        if key not in self.data:
            if required:
                raise ScenarioError(f"{self._where(key)}: missing")
            return default
        return self.data[key]

    def number(
        self,
        key: str,
        default: float | None = None,
        *,
        lo: float | None = None,
        lo_open: bool = False,
        hi: float | None = None,
    ) -> float:
        v = self.get(key, default, required=default is None)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ScenarioError(f"{self._where(key)}: must be a finite number, got {v!r}")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise ScenarioError(f"{self._where(key)}: must be {'>' if lo_open else '>='} {lo}")
        if hi is not None and v > hi:
            raise ScenarioError(f"{self._where(key)}: must be <= {hi}")
        return float(v)

    def integer(self, key: str, default: int | None = None, *, lo: int = 0) -> int:
        v = self.get(key, default, required=default is None)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ScenarioError(f"{self._where(key)}: must be an integer, got {v!r}")
        if v < lo:
            raise ScenarioError(f"{self._where(key)}: must be >= {lo}")
        return v

    def string(self, key: str, default: str | None = None, choices: tuple[str, ...] = ()) -> str:
        v = self.get(key, default, required=default is None)
        if not isinstance(v, str) or not v:
            raise ScenarioError(f"{self._where(key)}: must be a non-empty string, got {v!r}")
        if choices and v not in choices:
            raise ScenarioError(f"{self._where(key)}: must be one of {', '.join(choices)}")
        return v

    def table(self, key: str) -> _Table:
        return _Table(self.get(key, {}), self._where(key))

    def tables(self, key: str) -> list[_Table]:
        v = self.get(key, [])
        if not isinstance(v, list) or not v:
            raise ScenarioError(f"{self._where(key)}: needs at least one [[{key}]] table")
        return [_Table(x, f"{key}[{i}]") for i, x in enumerate(v)]

    def done(self) -> None:
        extra = sorted(set(self.data) - self.used)
        if extra:
            raise ScenarioError(f"{self._where(extra[0])}: unknown field")


def parse_scenario(text: str, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """A scenario from its TOML text; overrides: [controller] or [datapath] keys by their
    bare names (the module's doc). ScenarioError naming the field."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"not valid TOML: {e}") from None
    top = _Table(raw, "")

    run = top.table("run")
    duration_s = run.number("duration_s", lo=0.0, lo_open=True)
    dt_s = run.number("dt_s", 0.01, lo=0.0, lo_open=True, hi=0.1)
    seed = run.integer("seed", 1)
    settle_raw = run.get("settle_s")
    settle_s = None if settle_raw is None else run.number("settle_s", lo=0.0, hi=duration_s)
    thr = run.get("thresholds_ms", required=True)
    if (
        not isinstance(thr, list)
        or not thr
        or not all(isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in thr)
    ):
        raise ScenarioError("run.thresholds_ms: must be a list of numbers > 0")
    compare = run.get("compare", [])
    if not isinstance(compare, list) or not all(isinstance(x, str) for x in compare):
        raise ScenarioError("run.compare: must be a list of policy names")
    compare = [tenants.check_policy(x, ScenarioError) for x in compare]
    run.done()

    resources: list[ResourceModel] = []
    for t in top.tables("resource"):
        r = ResourceModel(
            name=t.string("name"),
            intercept_s=t.number("intercept_ms", lo=0.0) / 1000.0,
            slope_s_per_io=t.number("slope_ms_per_io", lo=0.0) / 1000.0,
            noise=t.number("noise", 0.0, lo=0.0, hi=5.0),
            **tenants.resource_extras(t, top.data.get("controller", {}), _kind),
        )
        t.done()
        if any(x.name == r.name for x in resources):
            raise ScenarioError(f"{t.path}.name: duplicate resource {r.name!r}")
        resources.append(r)
    names = {r.name for r in resources}

    streams: list[Stream] = []
    for t in top.tables("stream"):
        streams.extend(_parse_stream(t, names, duration_s))

    groups = _parse_groups(top, {s.initiator for s in streams}, duration_s)
    stalls = _parse_stalls(top, duration_s)
    config = _controller(top, text, overrides or {})
    if config.tick_s < dt_s:
        raise ScenarioError("controller.tick: must be at least run.dt_s")
    top.done()

    for r in resources:
        open_iops = sum(s.rate_iops for s in streams if s.resource == r.name and s.loop == "open")
        if r.slope_s_per_io * open_iops >= 1.0:
            raise ScenarioError(
                f"resource {r.name!r}: open-loop streams ({open_iops:.0f} IOPS) exceed the "
                f"device's peak of {1.0 / r.slope_s_per_io:.0f} IOPS (1 / slope_ms_per_io)"
            )
    return Scenario(
        duration_s=duration_s,
        dt_s=dt_s,
        seed=seed,
        settle_s=settle_s,
        resources=tuple(resources),
        streams=tuple(streams),
        thresholds_s=tuple(float(x) / 1000.0 for x in thr),
        controller=config,
        groups=groups,
        stalls=stalls,
        compare=tuple(compare),
    )


def _controller(top: _Table, text: str, overrides: Mapping[str, Any]) -> ControllerConfig:
    """[controller] and [datapath] (its ladder keys) with the overrides, as the daemon's
    configuration reads them."""
    tables: dict[str, dict[str, Any]] = {}
    for name, allowed in (("controller", None), ("datapath", DATAPATH_KEYS)):
        t = top.table(name)
        tables[name] = dict(t.data)
        for key in t.data:
            if key in NOT_IN_SCENARIOS:
                raise ScenarioError(f"{name}.{key}: not in a scenario (run.thresholds_ms)")
            if allowed is not None and key not in allowed:
                raise ScenarioError(
                    f"{name}.{key}: not in a scenario (it takes {', '.join(allowed)})"
                )
    for key, value in overrides.items():
        if f"controller.{key}" in BY_NAME and key not in NOT_IN_SCENARIOS:
            tables["controller"][key] = value
        elif key in DATAPATH_KEYS:
            tables["datapath"][key] = value
        else:
            raise ScenarioError(
                f"controller.{key}: unknown key (nor one of a scenario's [datapath]: "
                f"{', '.join(DATAPATH_KEYS)})"
            )
    try:
        return parse_controller(tables, text, "")
    except ConfigError as e:
        raise ScenarioError(_without_path(str(e))) from None


def _without_path(message: str) -> str:
    """The config parser's ":LINE: key: problem" as "key: problem (line LINE)"."""
    m = re.match(r"^:(\d+): (.*)$", message)
    if m:
        return f"{m.group(2)} (line {m.group(1)})"
    return message.removeprefix(": ")


def _kind(where: str, dotted: str, raw: Any) -> Any:
    """raw as the daemon's configuration takes the key `dotted`; ScenarioError naming
    where."""
    try:
        return BY_NAME[dotted].kind.parse(raw)
    except KindError as e:
        raise ScenarioError(f"{where}: {e}") from None


def _group_spec(t: _Table, name: str, base: Group | None = None) -> Group:
    """A group's priority and targets from t, as [groups.NAME] takes them (the schema's
    kinds: priority = 2, latency_target = "10ms", throughput_target = "25MiB/s" or
    "5000iops"); what t does not name stays as in base."""
    b = base or Group(name)
    missing = object()

    def value(key: str) -> Any:
        t.used.add(key)
        if key not in t.data:
            return missing
        try:
            return BY_NAME[f"groups.NAME.{key}"].kind.parse(t.data[key])
        except KindError as e:
            raise ScenarioError(f"{t._where(key)}: {e}") from None

    priority, latency, tp = value("priority"), value("latency_target"), value("throughput_target")
    bps, iops = b.throughput_target_bps, b.throughput_target_iops
    if tp is not missing:  # one throughput target: a byte rate or IOs per second
        bps, iops = (tp[0], None) if tp[1] == "B/s" else (None, tp[0])
    return Group(
        name,
        priority=b.priority if priority is missing else priority,
        latency_target_s=b.latency_target_s if latency is missing else latency,
        throughput_target_bps=bps,
        throughput_target_iops=iops,
        **tenants.group_extras(t, b, LEVEL_KEYS, _kind),
    )


def _parse_groups(top: _Table, initiators: set[str], duration_s: float) -> tuple[GroupModel, ...]:
    if "group" not in top.data:
        top.used.add("group")
        return ()
    out: list[GroupModel] = []
    seen: set[str] = set()
    for t in top.tables("group"):
        name = t.string("name")
        if name in {g.group.name for g in out} or name == "default":
            raise ScenarioError(f"{t.path}.name: duplicate or reserved group name {name!r}")
        members = t.get("members", required=True)
        if (
            not isinstance(members, list)
            or not members
            or not all(isinstance(m, str) and m in initiators for m in members)
        ):
            raise ScenarioError(f"{t.path}.members: must list initiators of the [[stream]]s")
        if seen & set(members):
            raise ScenarioError(f"{t.path}.members: an initiator is in one group only")
        seen.update(members)
        spec = _group_spec(t, name)
        changes: list[tuple[float, Group]] = []
        raw = t.get("changes", [])
        if not isinstance(raw, list):
            raise ScenarioError(f"{t.path}.changes: must be a list of tables")
        for i, c in enumerate(raw):
            ct = _Table(c, f"{t.path}.changes[{i}]")
            at_s = ct.number("at_s", lo=0.0, hi=duration_s)
            changes.append((at_s, _group_spec(ct, name, changes[-1][1] if changes else spec)))
            ct.done()
        t.done()
        out.append(GroupModel(spec, tuple(members), tuple(changes)))
    tenants.check_reservations([g.group for g in out], ScenarioError)
    return tuple(out)


def _parse_stalls(top: _Table, duration_s: float) -> tuple[tuple[float, float], ...]:
    """[[stall]]: windows in which the array serves nothing (a guest or an array that
    stalls): start_s, duration_s, and every_s to repeat them (0: once; cycles, 0: to the
    end)."""
    if "stall" not in top.data:
        top.used.add("stall")
        return ()
    out: list[tuple[float, float]] = []
    for t in top.tables("stall"):
        start = t.number("start_s", lo=0.0, hi=duration_s)
        length = t.number("duration_s", lo=0.0, lo_open=True, hi=duration_s)
        every = t.number("every_s", 0.0, lo=0.0)
        cycles = t.integer("cycles", 0, lo=0)
        t.done()
        if every and every <= length:
            raise ScenarioError(f"{t.path}.every_s: must be more than duration_s")
        sched = Schedule(start, length, every - length if every else 0.0, cycles if every else 1)
        out.extend(sched.windows(duration_s))
    out.sort()
    if any(b[0] < a[1] for a, b in itertools.pairwise(out)):
        raise ScenarioError("stall: the stalls overlap")
    return tuple(out)


def _parse_stream(t: _Table, resources: set[str], duration_s: float) -> list[Stream]:
    name = t.string("name")
    kind = t.string("kind", choices=("read", "write"))
    loop = t.string("loop", choices=("open", "closed", "bursty"))
    resource = t.string("resource")
    if resource not in resources:
        raise ScenarioError(f"{t.path}.resource: no [[resource]] named {resource!r}")
    initiator = t.string("initiator")
    size_bytes = t.number("size_kib", lo=0.0, lo_open=True) * KIB
    count = t.integer("count", 1, lo=1)
    depth = rate_iops = overhead_s = 0.0
    cost = t.number("cost", 1.0, lo=0.0, lo_open=True)
    arrivals = None
    if loop == "bursty":  # arrivals at their own pace, at most depth outstanding
        depth = t.number("depth", lo=0.0, lo_open=True)
        arrivals = tenants.arrivals(t, name, ScenarioError)
    elif loop == "closed":
        depth = t.number("depth", lo=0.0, lo_open=True)
        overhead_s = t.number("overhead_ms", 0.0, lo=0.0) / 1000.0
        if "rate_kib_per_s" in t.data:  # a cap, as fio's --rate at an iodepth: 0 = none
            rate_iops = t.number("rate_kib_per_s", lo=0.0, lo_open=True) * KIB / size_bytes
    else:
        rate_iops = t.number("rate_kib_per_s", lo=0.0, lo_open=True) * KIB / size_bytes
        if "depth" in t.data:
            raise ScenarioError(f'{t.path}.depth: only for loop = "closed"')
    st = t.table("schedule")
    schedule = Schedule(
        start_s=st.number("start_s", 0.0, lo=0.0, hi=duration_s),
        on_s=st.number("on_s", math.inf, lo=0.0, lo_open=True) if "on_s" in st.data else math.inf,
        off_s=st.number("off_s", 0.0, lo=0.0),
        cycles=st.integer("cycles", 0, lo=0),
    )
    st.used.add("on_s")
    st.done()
    t.done()
    names = [name] if count == 1 else [f"{name}#{i}" for i in range(count)]
    return [
        Stream(
            name=n,
            kind=kind,
            loop=loop,
            resource=resource,
            initiator=initiator,
            size_bytes=size_bytes,
            depth=depth,
            rate_iops=rate_iops,
            overhead_s=overhead_s,
            schedule=schedule,
            cost=cost,
            arrivals=arrivals,
        )
        for n in names
    ]
