"""Domain types shared by the controller, the simulator and the appliance.

Units are in the names: seconds (_s), bytes per second (_bps), classes
(integer delay steps; class k delays packets by k * step_s).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .ladder import Ladder

# Paper 2.3: the PID runs every 100 ms, the write-heavy sets converge every 1 s.
TICK_S = 0.100
CONVERGE_S = 1.0
# The control laws (controller/pid.py): "log" acts on the logarithm of the
# delay (its speed does not depend on the array); "paper" is the method
# paper's PID on the class index, kept for comparison.
LAWS = ("log", "paper")
# Law "log"'s offset (LogGains.offset_x_threshold), in thresholds: at most this.
OFFSET_X_THRESHOLD_MAX = 10.0


@dataclass(frozen=True, slots=True)
class PidGains:
    """Gains of the paper's PID on the class index (law "paper", controller/pid.py)."""

    # The error is relative: measured / threshold - setpoint_fraction, so the
    # same gains serve a 1 ms and a 20 ms threshold (decide.py, "Law"). Tuned on
    # sim/scenarios/paper.toml with the linear ladder: 15 classes per
    # unit of relative error = 7.5 ms of delay for a latency 100 % too high.
    kp_class_per_rel_error: float = 15.0
    ti_s: float = 0.25
    # Derivative off: it differentiates the sensor noise of a few reads per
    # tick; the EWMA already damps, and the PID is used as PI (paper 3.6).
    td_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LogGains:
    """Gains of the PID on ln(delay) (law "log", controller/pid.py).

    Kp is in natural-log units of delay per unit of relative error: 1.0 and
    a latency 10 % over the setpoint move the delay by e^0.1 = +10.5 % at
    once (the proportional part), and by as much again every Ti/tick ticks.
    Tuned on the generated plants of `santhrottle-simulate --sweep`
    (docs/controller.md, "Tuning").
    """

    kp_log_per_rel_error: float = 1.0
    ti_s: float = 0.5
    td_s: float = 0.0
    # The law acts on ln(delay + offset), offset = this x the threshold in
    # force: a writer's IO takes about the device's latency plus its delay, so
    # where the delay is short against the latency, a change of ln(delay) alone
    # would barely change the writers' rate (controller/pid.py, "offset").
    offset_x_threshold: float = 0.5


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    tick_s: float = TICK_S
    converge_s: float = CONVERGE_S
    # The delay of every class (controller/ladder.py); shared with the data path.
    ladder: Ladder = field(default_factory=Ladder)
    law: str = "log"
    gains: PidGains = field(default_factory=PidGains)
    log_gains: LogGains = field(default_factory=LogGains)
    # The PID regulates to setpoint_fraction x threshold: the threshold is the
    # admin's limit, and the latency's noise around the setpoint (a few % in
    # the 1 s mean) must fall under it, not around it.
    setpoint_fraction: float = 0.90
    # ... and up to setpoint_quiet_fraction where the 1 s mean latency scatters
    # little: 1 - setpoint_noise_z x its relative sd (controller/setpoint.py).
    # A quiet fraction <= setpoint_fraction: the setpoint is fixed.
    setpoint_quiet_fraction: float = 0.97
    setpoint_noise_z: float = 2.33
    # The emitted class follows the PID's class up at once, but down only
    # once the PID's class plus class_hysteresis is below it: sensor noise
    # moves the PID every tick, and each emitted change costs one netlink
    # message per member of the set. In ladder classes: 4 = 2 ms near 0,
    # ~20 % past 10 ms.
    class_hysteresis: float = 4.0
    # A class goes down by at most this many classes per tick (0: no limit),
    # the release included. Lowering an initiator's delay by D lets its packets
    # of the next D overtake those still queued in the slower netem class; one
    # overtaken data segment is enough for the target's RACK to fast-retransmit
    # (its reordering window is min_rtt/4 until it has seen reordering). Small
    # decreases leave few packets to overtake (docs/lab.md, "Retransmissions").
    class_decrease_max_per_tick: int = 1
    # A delay goes up by at most a factor class_increase_max_ratio_per_tick
    # per tick, but always by delay_increase_min_s_per_tick if wanted (ratio
    # 0: no limit). It bounds an initiator's effective class (a writer that
    # joins a set at 60 ms climbs to it) and a resource's class (its PID then
    # tracks the class it got). The target's TCP arms a tail-loss probe
    # 2 x srtt + 2 jiffies after its last transmission; an initiator whose
    # delay jumps past that before srtt has followed gets a spurious probe, a
    # retransmission (docs/lab.md, "Retransmissions"). 1.25 keeps a rise under
    # the probe timer even if srtt lags by two ticks; 1 ms from 0 is under the
    # timer's floor of 2 jiffies.
    class_increase_max_ratio_per_tick: float = 1.25
    delay_increase_min_s_per_tick: float = 0.001
    # Read-latency EWMA: smooths the ~6 reads/tick of a 256 kB/s reader.
    read_ewma_tau_s: float = 0.2
    # Write-rate EWMA: long enough to keep a writer in its set through a
    # 5 s pause (controller/writeheavy.py, "Idle behaviour").
    write_ewma_tau_s: float = 8.0
    write_heavy_enter_bps: float = 1024.0 * 1024.0
    write_heavy_leave_bps: float = 256.0 * 1024.0
    # Also write-heavy: a pair writing this share of its resource's fair share
    # (controller/writeheavy.py): many small writers that together load it.
    write_heavy_share: float = 0.5
    # No reads on a resource for this long: its latency is unobservable and
    # throttling its writers helps nobody; release the class.
    read_idle_release_s: float = 3.0
    # threshold = "auto": the latency at this fraction of the device's peak
    # throughput on its LQ line (SIOC's convention, Pesto section 5).
    auto_alpha: float = 0.9
    # Groups with levels (controller/levels.py) are promoted only while every
    # resource they load is busy less than this share of the time (IOTune's
    # utilization threshold for tuning): a device busy 90 % of the time has
    # little left to give a tenant's next level.
    promote_below_utilization: float = 0.9

    def __post_init__(self) -> None:
        if self.law not in LAWS:
            raise ValueError(f"control law must be one of {', '.join(LAWS)}, got {self.law!r}")

    @property
    def max_class(self) -> int:
        return self.ladder.max_class


@dataclass(frozen=True, slots=True)
class Resource:
    """A shared resource (an LVM volume group) and its read-latency threshold.

    auto: the threshold is Pesto's, C / (1 - auto_alpha) of the resource's LQ
    line fitted online (controller/lqfit.py); threshold_s is the fallback
    held until the fit is confident (math.inf: observed until then).
    utilization_threshold: the saturation trigger beside the latency
    (controller/utilization.py).
    """

    name: str
    threshold_s: float
    auto: bool = False
    # A resource busy more than this share of a convergence counts, for the next
    # one, as over its latency threshold (controller/utilization.py); None: no trigger.
    utilization_threshold: float | None = None


@dataclass(frozen=True, slots=True)
class ReadSample:
    """A resource over the sensor interval ending now: reads, their mean latency, write rate.

    write_bps is the whole resource's write rate (e.g. the sum over its LVs
    in diskstats); None when the sensor cannot tell, which never holds the PID.
    reads_in_flight: reads issued and not completed at the end of an interval
    without completed reads (a stalled reader, not an idle one); None: unknown.
    """

    resource: str
    reads: int
    read_latency_s: float
    write_bps: float | None = None
    reads_in_flight: int | None = None


class WriteSample(NamedTuple):
    """Write rate of one initiator on one resource over the sensor interval.

    A tuple: a convergence carries one per (resource, initiator) pair, 10,000s
    of them (make bench); decide() folds them in as they are.
    """

    resource: str
    initiator: str
    write_bps: float


class DeviceSample(NamedTuple):
    """A resource's devices over the sensor interval, as Pesto's LQ line sees them.

    ios: IOs (reads and writes) completed; latency_s: their mean latency;
    in_flight: the mean number of IOs outstanding over the interval (the
    time-weighted queue, diskstats' weighted io time / interval).
    """

    resource: str
    ios: int
    latency_s: float
    in_flight: float


class IoSample(NamedTuple):
    """One initiator's IOs on one resource over the interval ending now.

    read_latency_s: its reads' mean latency at the array; latency_s: all its
    IOs'; None where the sensor cannot tell per initiator (the resource's
    stands in). busy_s: the time its own device (a LUN no other initiator
    uses) had at least one IO in flight over the interval, its io_ticks (of
    several, their sum); None where it shares its device or the sensor has
    no such counter (disktime.attribute())."""

    resource: str
    initiator: str
    ios: float
    bytes: float
    reads: float
    read_latency_s: float | None = None
    latency_s: float | None = None
    busy_s: float | None = None


class UtilizationSample(NamedTuple):
    """A resource's busy share over the sensor interval ending now: the share of the
    time its device had at least one IO in flight (diskstats' io_ticks; on a bridge,
    a volume with a command in flight); of a resource of several devices, the
    busiest's. Not clamped: io_ticks grows by a whole IO's time when it completes, so
    an interval may read above 1 and the one before it as much below (utilization.py
    clamps the convergence's figure). span_s: the interval it covers (each sample
    weighs its span); None: every sample weighs the same (equal ticks)."""

    resource: str
    utilization: float
    span_s: float | None = None


@dataclass(frozen=True, slots=True)
class Samples:
    """What the sensors produced since the previous decide()."""

    reads: Sequence[ReadSample] = ()
    writes: Sequence[WriteSample] = ()
    devices: Sequence[DeviceSample] = ()
    ios: Sequence[IoSample] = ()  # every convergence, for grouped resources (groups.py)
    utilization: Sequence[UtilizationSample] = ()  # every tick (utilization.py)
    # How many sensor convergences `ios` holds, each scaled to one convergence (the
    # daemon's worker converges on a clock of its own, and may be slower); None: one per
    # controller convergence (the simulator's).
    io_batches: int | None = None


@dataclass(slots=True)
class Decisions:
    """What one decide() decided; only changes, the full view is in the state."""

    now_s: float
    ticked: bool = False
    converged: bool = False
    late_ticks: int = 0  # ticks skipped because decide() was called late
    resource_classes: dict[str, int] = field(default_factory=dict)  # changed only
    initiator_classes: dict[str, int] = field(default_factory=dict)  # changed; 0 = none
    joined: Mapping[str, set[str]] = field(default_factory=dict)
    left: Mapping[str, set[str]] = field(default_factory=dict)
    futile: list[str] = field(default_factory=list)  # released at this convergence (futile.py)
    # whose release the latency ended at this convergence: it rose without the delay
    futile_refuted: list[str] = field(default_factory=list)
