"""The controller's state: what decide() reads and updates, and nothing else.

What it holds
    ControllerState: the configuration in force, one ResourceState per
    resource, the write-heavy sets (controller/writeheavy.py), every
    initiator's effective class (> 0 only) and those the ramp still holds
    below it (`rising`), the two cadences' next deadlines, the groups'
    state (controller/groups.py), the groups' levels (controller/levels.py),
    the resources' utilization (controller/utilization.py) and what the
    holds need.
    ResourceState: a resource's threshold, its read-latency EWMA and PID,
    its class, and the bookkeeping of its holds (decide.py, "Law"): the
    last tick with reads, the write rate's EWMA (the write-drop hold), the
    hold's deadline and base class, the ticks without writers, the noise
    gauge of its setpoint (controller/setpoint.py), its LQ fit (threshold
    "auto", controller/lqfit.py).

Who changes it
    decide() every call (controller/decide.py), in place; restate.py between
    calls (new parameters, a restart's last classes, groups, a resource
    that goes); fleet.follow() on an appliance that follows a leader.
    effective.py recomputes the initiators' classes from it. The types
    here only build and read: what moves a class lives with the law.

Bounds
    A resource's class is in [0, config.max_class]; `effective` holds only
    classes > 0, and `rising` only initiators below the class they are
    owed. A threshold is > 0 s (set_resource refuses others).

Worked example
    new_state(ControllerConfig(), [Resource("vg0", 0.010)]) -> one
    ResourceState at class 0 with an empty EWMA, the law "log" PID at its
    floor, no members; state.rise_to[0] = 2 (the ramp from no delay:
    1 ms, class 2 of the default ladder).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .domain import ControllerConfig, IoSample, Resource
from .ewma import Ewma
from .futile import Futility
from .groups import GroupsState
from .levels import LevelsState
from .lqfit import LqEstimator, LqFit
from .pid import Pid, new_pid
from .ramp import rise_table
from .rhythm import Rhythm
from .setpoint import NoiseGauge
from .utilization import UtilizationState
from .writeheavy import CONTENDED_FLOOR_FRACTION, WriteHeavySets

# A member that stopped writing while others go on holds its resource's class
# (no decrease) for at most this long: writers pause and come back (the
# method paper's pause 5 s), and the delay the others need alone is too
# little for them all; one that stays away longer has gone (decide.py, "Law").
AWAY_HOLD_S = 10.0
# A resource's own write rate is smoothed over this long to see it drop (the
# write-drop hold, decide.py): a writer that stopped.
WRITE_RATE_TAU_S = 1.0


def write_heavy_sets(c: ControllerConfig) -> WriteHeavySets:
    """The write-heavy sets of a configuration (its thresholds validated)."""
    return WriteHeavySets(
        c.write_ewma_tau_s,
        c.write_heavy_enter_bps,
        c.write_heavy_leave_bps,
        c.write_heavy_share,
        AWAY_HOLD_S if c.write_heavy_share else 0.0,
    )


@dataclass(slots=True)
class ResourceState:
    resource: Resource
    ewma: Ewma
    pid: Pid
    delay_class: int = 0
    last_read_s: float | None = None
    lq: LqEstimator | None = None  # threshold "auto": the LQ fit
    noise: NoiseGauge = field(default_factory=NoiseGauge)  # the setpoint's (setpoint.py)
    write_rate: Ewma = field(default_factory=lambda: Ewma(WRITE_RATE_TAU_S))
    drop_hold_until_s: float = -math.inf  # writes dropped, or came back: no decrease until then
    drop_ticks: int = 0  # ticks in a row with the write rate under WRITE_DROP_FRACTION
    hold_base: int | None = None  # the class when the hold in force began (None: no hold)
    quiet_ticks: int = 0  # ticks in a row with reads but no writers
    rhythm: Rhythm = field(default_factory=Rhythm)  # when no writes means none (rhythm.py)
    floor_ticks: int = 0  # ticks in a row the PID wanted no delay (decide.py, "release")
    futile: Futility = field(default_factory=Futility)  # a delay that does not work (futile.py)

    def setpoint(self, c: ControllerConfig) -> float:
        """The setpoint in force, a fraction of the threshold in force."""
        return self.noise.setpoint(
            c.setpoint_fraction, c.setpoint_quiet_fraction, c.setpoint_noise_z
        )

    def threshold_s(self, alpha: float) -> float:
        """The threshold in force: the fitted one (auto, once confident), else the set one."""
        if self.lq is not None:
            fit = self.lq.last_confident
            if fit is not None:
                return fit.threshold_s(alpha) or self.resource.threshold_s
        return self.resource.threshold_s

    @property
    def fit(self) -> LqFit | None:
        return None if self.lq is None else self.lq.fit


@dataclass
class ControllerState:
    config: ControllerConfig
    resources: dict[str, ResourceState] = field(default_factory=dict)
    sets: WriteHeavySets | None = None
    effective: dict[str, int] = field(default_factory=dict)  # initiator -> class (> 0 only)
    rising: set[str] = field(default_factory=set)  # initiators the ramp holds below their class
    next_tick_s: float | None = None
    next_converge_s: float | None = None
    late_ticks_total: int = 0
    rise_to: tuple[int, ...] = ()  # rise() of every class (the ramp), from the config
    no_writers_bps: float = 0.0  # a resource writing less holds its class
    away: set[str] = field(default_factory=set)  # resources with a member away
    groups: GroupsState = field(default_factory=GroupsState)  # grouped resources (groups.py)
    grouped: frozenset[str] = frozenset()  # resources whose classes come from their groups
    ios: list[IoSample] = field(default_factory=list)  # since the last convergence (groups)
    io_batches: int | None = None  # the sensor convergences in `ios` (Samples.io_batches)
    levels: LevelsState = field(default_factory=LevelsState)  # groups' levels (levels.py)
    utilization: UtilizationState = field(default_factory=UtilizationState)  # utilization.py

    def __post_init__(self) -> None:
        c = self.config
        self.rise_to = rise_table(c)
        # with the relative write-heavy rules a writer of 64 KiB/s is throttled, so
        # it is a writer here too; without them, write_heavy_leave as before
        self.no_writers_bps = (
            c.write_heavy_leave_bps * CONTENDED_FLOOR_FRACTION
            if c.write_heavy_share
            else c.write_heavy_leave_bps
        )
        if self.sets is None:
            self.sets = write_heavy_sets(c)

    @property
    def write_sets(self) -> WriteHeavySets:
        assert self.sets is not None
        return self.sets

    def set_resource(self, resource: Resource) -> None:
        """Add a resource, or change its threshold keeping its PID state."""
        if resource.threshold_s <= 0.0:
            raise ValueError(f"threshold of {resource.name} must be > 0 s")
        rs = self.resources.get(resource.name)
        if rs is not None:
            rs.resource = resource
            if resource.auto and rs.lq is None:
                rs.lq = LqEstimator()
            elif not resource.auto:
                rs.lq = None
            return
        c = self.config
        self.resources[resource.name] = ResourceState(
            resource,
            Ewma(c.read_ewma_tau_s),
            new_pid(c),
            lq=LqEstimator() if resource.auto else None,
        )

    def effective_class(self, initiator: str) -> int:
        return self.effective.get(initiator, 0)

    def members(self, resource: str) -> set[str]:
        return self.write_sets.members.get(resource, set())


def new_state(config: ControllerConfig, resources: list[Resource]) -> ControllerState:
    state = ControllerState(config)
    for r in resources:
        state.set_resource(r)
    return state
