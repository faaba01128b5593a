"""Simulation scenarios: TOML text -> validated Scenario (pure: the caller reads the file).

Every field is checked here, and a bad one raises ScenarioError naming it
(`stream[2].depth: must be > 0`), so the CLI can print one line and exit 2.
The format is documented in docs/simulator.md; the paper's experiment is
sim/scenarios/paper.toml.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from typing import Any

from santhrottle.controller.domain import (
    LAWS,
    OFFSET_X_THRESHOLD_MAX,
    TICK_S,
    ControllerConfig,
    LogGains,
    PidGains,
)
from santhrottle.controller.groups import Group
from santhrottle.controller.ladder import Ladder, LadderError

KIB = 1024.0


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
    loop: str  # "open" | "closed"
    resource: str
    initiator: str
    size_bytes: float
    depth: float = 0.0  # closed loop
    rate_iops: float = 0.0  # open loop; closed loop: a cap (0: none)
    overhead_s: float = 0.0  # closed loop: time per IO outside the device and the delay
    schedule: Schedule = field(default_factory=Schedule)


@dataclass(frozen=True, slots=True)
class ResourceModel:
    name: str
    intercept_s: float
    slope_s_per_io: float
    noise: float  # relative standard deviation of one read's latency


@dataclass(frozen=True, slots=True)
class GroupModel:
    """A [[group]]: its spec, its members (initiators), its live changes (at_s, new spec)."""

    group: Group
    members: tuple[str, ...]
    changes: tuple[tuple[float, Group], ...] = ()


@dataclass(frozen=True, slots=True)
class Scenario:
    duration_s: float
    sim_step_s: float
    seed: int
    settle_s: float | None
    resources: tuple[ResourceModel, ...]
    streams: tuple[Stream, ...]
    thresholds_s: tuple[float, ...]
    controller: ControllerConfig
    groups: tuple[GroupModel, ...] = ()  # every resource is grouped when there are any

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


def parse_scenario(text: str) -> Scenario:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"not valid TOML: {e}") from None
    top = _Table(raw, "")

    run = top.table("run")
    duration_s = run.number("duration_s", lo=0.0, lo_open=True)
    sim_step_s = run.number("sim_step_s", 0.01, lo=0.0, lo_open=True, hi=0.1)
    seed = run.integer("seed", 1)
    settle_raw = run.get("settle_s")
    settle_s = None if settle_raw is None else run.number("settle_s", lo=0.0, hi=duration_s)
    run.done()

    resources: list[ResourceModel] = []
    for t in top.tables("resource"):
        r = ResourceModel(
            name=t.string("name"),
            intercept_s=t.number("intercept_ms", lo=0.0) / 1000.0,
            slope_s_per_io=t.number("slope_ms_per_io", lo=0.0) / 1000.0,
            noise=t.number("noise", 0.0, lo=0.0, hi=5.0),
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

    ctl = top.table("controller")
    thr = ctl.get("thresholds_ms", required=True)
    if (
        not isinstance(thr, list)
        or not thr
        or not all(isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in thr)
    ):
        raise ScenarioError("controller.thresholds_ms: must be a list of numbers > 0")
    tick_s = ctl.number("tick_ms", TICK_S * 1000.0, lo=0.0, lo_open=True) / 1000.0
    if tick_s < sim_step_s:
        raise ScenarioError("controller.tick_ms: must be >= run.sim_step_s")
    d = ControllerConfig()
    g, lg, lad = d.gains, d.log_gains, d.ladder
    try:
        ladder = Ladder(
            round(ctl.number("step_ms", lad.step_us / 1000.0, lo=0.0, lo_open=True) * 1000.0),
            round(ctl.number("max_delay_ms", lad.max_delay_us / 1000.0, lo=0.0) * 1000.0),
            ctl.number("ladder_ratio", lad.ratio, lo=1.0, hi=2.0),
        )
    except LadderError as e:
        raise ScenarioError(f"controller: {e}") from None
    config = ControllerConfig(
        tick_s=tick_s,
        converge_s=ctl.number("converge_s", d.converge_s, lo=tick_s),
        ladder=ladder,
        law=ctl.string("law", d.law, LAWS),
        log_gains=LogGains(
            kp_log_per_rel_error=ctl.number(
                "kp_log_per_rel_error", lg.kp_log_per_rel_error, lo=0.0
            ),
            ti_s=ctl.number("ti_log_s", lg.ti_s, lo=0.0, lo_open=True),
            td_s=ctl.number("td_log_s", lg.td_s, lo=0.0),
            offset_x_threshold=ctl.number(
                "offset_log_x_threshold", lg.offset_x_threshold, lo=0.0, hi=OFFSET_X_THRESHOLD_MAX
            ),
        ),
        gains=PidGains(
            kp_class_per_rel_error=ctl.number(
                "kp_class_per_rel_error", g.kp_class_per_rel_error, lo=0.0
            ),
            ti_s=ctl.number("ti_s", g.ti_s, lo=0.0, lo_open=True),
            td_s=ctl.number("td_s", g.td_s, lo=0.0),
        ),
        setpoint_fraction=ctl.number(
            "setpoint_fraction", d.setpoint_fraction, lo=0.0, lo_open=True, hi=1.0
        ),
        setpoint_quiet_fraction=ctl.number(
            "setpoint_quiet_fraction", d.setpoint_quiet_fraction, lo=0.0, hi=1.0
        ),
        setpoint_noise_z=ctl.number("setpoint_noise_z", d.setpoint_noise_z, lo=0.0, hi=10.0),
        class_hysteresis=ctl.number("class_hysteresis", d.class_hysteresis, lo=0.0),
        class_decrease_max_per_tick=ctl.integer(
            "class_decrease_max_per_tick", d.class_decrease_max_per_tick, lo=0
        ),
        class_increase_max_ratio_per_tick=ctl.number(
            "class_increase_max_ratio_per_tick", d.class_increase_max_ratio_per_tick, lo=0.0
        ),
        delay_increase_min_s_per_tick=ctl.number(
            "delay_increase_min_ms_per_tick", d.delay_increase_min_s_per_tick * 1000.0, lo=0.0
        )
        / 1000.0,
        read_ewma_tau_s=ctl.number("read_ewma_tau_s", d.read_ewma_tau_s, lo=0.0),
        write_ewma_tau_s=ctl.number("write_ewma_tau_s", d.write_ewma_tau_s, lo=0.0, lo_open=True),
        write_heavy_enter_bps=ctl.number(
            "write_heavy_enter_kib_per_s", d.write_heavy_enter_bps / KIB, lo=0.0, lo_open=True
        )
        * KIB,
        write_heavy_leave_bps=ctl.number(
            "write_heavy_leave_kib_per_s", d.write_heavy_leave_bps / KIB, lo=0.0
        )
        * KIB,
        read_idle_release_s=ctl.number("read_idle_release_s", d.read_idle_release_s, lo=0.0),
        write_heavy_share=ctl.number("write_heavy_share", d.write_heavy_share, lo=0.0, hi=1.0),
    )
    if 0.0 < config.class_increase_max_ratio_per_tick < 1.0:
        raise ScenarioError(
            "controller.class_increase_max_ratio_per_tick: must be 0 (no limit) or >= 1"
        )
    if config.write_heavy_leave_bps >= config.write_heavy_enter_bps:
        raise ScenarioError(
            "controller.write_heavy_leave_kib_per_s: must be below write_heavy_enter_kib_per_s"
        )
    ctl.done()
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
        sim_step_s=sim_step_s,
        seed=seed,
        settle_s=settle_s,
        resources=tuple(resources),
        streams=tuple(streams),
        thresholds_s=tuple(float(x) / 1000.0 for x in thr),
        controller=config,
        groups=groups,
    )


def _group_spec(t: _Table, name: str, base: Group | None = None) -> Group:
    """A group's targets and priority from t; what t does not name stays as in base."""
    b = base or Group(name)

    def opt(key: str, scale: float, old: float | None) -> float | None:
        if key not in t.data:
            t.used.add(key)
            return old
        return t.number(key, lo=0.0, lo_open=True) * scale

    return Group(
        name,
        priority=t.number("priority", b.priority, lo=0.0, lo_open=True),
        latency_target_s=opt("latency_target_ms", 1e-3, b.latency_target_s),
        throughput_target_bps=opt("throughput_target_mib_s", KIB * KIB, b.throughput_target_bps),
        throughput_target_iops=opt("throughput_target_iops", 1.0, b.throughput_target_iops),
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
    return tuple(out)


def _parse_stream(t: _Table, resources: set[str], duration_s: float) -> list[Stream]:
    name = t.string("name")
    kind = t.string("kind", choices=("read", "write"))
    loop = t.string("loop", choices=("open", "closed"))
    resource = t.string("resource")
    if resource not in resources:
        raise ScenarioError(f"{t.path}.resource: no [[resource]] named {resource!r}")
    initiator = t.string("initiator")
    size_bytes = t.number("size_kib", lo=0.0, lo_open=True) * KIB
    count = t.integer("count", 1, lo=1)
    depth = rate_iops = overhead_s = 0.0
    if loop == "closed":
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
        )
        for n in names
    ]
