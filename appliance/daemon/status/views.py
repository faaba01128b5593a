"""The daemon's view, typed: what `status`, the control socket's answers and the metrics read.

What it owns
    One dataclass per thing shown (StatusView and its parts: ResourceView,
    ThresholdView, InitiatorView, CountersView, GroupView, LevelView, WireView,
    SyncView, QuarantineView), each field named once here: status/build.py fills them
    from the daemon, status/metrics.py turns them into metric families, the
    control socket sends them as JSON (to_json) and the command line reads
    them back (from_json) to print its tables.  The JSON names are the field
    names, but for InitiatorView.klass ("class", a Python keyword); a
    WireView's counters are flattened into it (the wire sensor's own names).

    ThresholdView is one resource's threshold, the same object in `threshold
    show`'s answer, `threshold set`'s and `status`'s resources ("threshold").

    This module imports nothing of the daemon: the command line imports it
    without the daemon's code.

JSON
    to_json(view) -> plain dicts, lists, numbers, strings, None, the way the
    protocol carries them; from_json(cls, data) -> the dataclass again, every
    field checked against its type (a reply that does not fit raises
    ViewError, one line, never a traceback in the command line).

Worked example
    ThresholdView(threshold_s=0.012, configured_s=0.01, override=True,
                  in_force_s=0.012, setpoint_fraction=0.9, fit=None)
    to_json -> {"threshold_s": 0.012, "configured_s": 0.01, "override": true,
                "in_force_s": 0.012, "setpoint_fraction": 0.9, "fit": null};
    from_json(ThresholdView, that) gives the same object back.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")
JSON_NAME = "json"  # a field's metadata key: its name in JSON, where it is not the field's
FLATTEN = "flatten"  # a dict field whose items are the object's own (WireView.counters)


class ViewError(ValueError):
    """A reply that is not the view it should be: one line."""


@dataclass(frozen=True, slots=True)
class FitView:
    """threshold = "auto": the LQ fit behind the threshold (controller/lqfit.py)."""

    intercept_s: float | None
    slope_s_per_io: float | None
    r_squared: float | None
    windows: int
    q_lo: float | None
    q_hi: float | None
    confident: bool
    fitted: bool  # a confident fit has set the threshold at least once


@dataclass(frozen=True, slots=True)
class ThresholdView:
    """One resource's threshold (seconds; None: observed, no threshold)."""

    threshold_s: float | str | None  # asked for: seconds, "auto" or None
    configured_s: float | str | None  # the file's
    override: bool  # set at run time (`threshold set`)
    in_force_s: float | None  # what the PID regulates to now ("auto": fitted or fallback)
    setpoint_fraction: float | None  # the fraction of it the PID aims at
    fit: FitView | None  # threshold "auto" only


@dataclass(frozen=True, slots=True)
class ResourceView:
    resource: str
    threshold: ThresholdView
    mode: str  # "control" (a PID) or "observe"
    read_latency_ewma_s: float | None
    read_latency_s: float | None  # the last tick's mean (None: no reads)
    reads: int
    write_bytes_per_second: float | None
    delay_class: int
    delay_s: float
    members: list[str]  # its write-heavy set
    devices: list[str]
    # raw totals since the daemon started (core/counters.py)
    reads_completed: int
    read_time_s: float
    written_bytes: float
    # its device's busy share over the last convergence (None: not measured) and
    # whether that counts as over its threshold (controller/utilization.py)
    utilization: float | None
    saturated: bool
    # a delay that did not lower the latency (controller/futile.py): the seconds its
    # release has still to run (None: not released), the releases since the start and
    # those its latency ended early (it rose without the delay)
    futile_released_s: float | None
    futile_releases: int
    futile_refutations: int


@dataclass(frozen=True, slots=True)
class InitiatorView:
    initiator: str  # a host's: its first address, the controller's key
    host: str | None
    addresses: list[str]
    resources: list[str]
    write_bytes_per_second: dict[str, float | None]  # per resource
    written_bytes: dict[str, float]  # per resource
    write_heavy_on: list[str]
    klass: int = field(metadata={JSON_NAME: "class"})
    delay_s: float
    mode: str
    pinned: bool
    adopted: bool  # left by a previous run: held, then lowered


@dataclass(frozen=True, slots=True)
class CountersView:
    ticks: int
    tick_overruns: int
    converges: int
    sensor_errors: int
    actuator_errors: int
    reloads: int
    reload_failures: int
    state_save_errors: int
    repairs: int  # kernel objects found missing or changed under the daemon, and rebuilt
    tick_seconds_sum: float
    tick_duration_buckets: dict[str, int]  # cumulative, by upper bound (Prometheus' le)
    glided_descents: int
    unordered_descents: int
    quarantines: dict[str, int]  # per kind, what the kernel refused since the start


@dataclass(frozen=True, slots=True)
class LadderView:
    step_us: int
    max_delay_us: int
    ratio: float


@dataclass(frozen=True, slots=True)
class GroupView:
    """One group on one grouped resource (controller/groups.py)."""

    resource: str
    group: str
    priority: float
    latency_target_s: float | None
    throughput_target_bps: float | None
    throughput_target_iops: float | None
    override: dict[str, float]  # what `group set` changed ({}: the file's values)
    latency_s: float | None  # its reads' mean, the delay included
    io_latency_s: float | None  # its IOs' mean at the array
    throughput_bps: float
    iops: float
    y: float | None
    pwfte: float
    share: float
    demand: float
    delay_class: int
    delay_s: float
    target_class: int
    members: list[str]
    overloaded: bool
    resource_latency_s: float | None


@dataclass(frozen=True, slots=True)
class SyncView:
    """Bridge mode: one direction of one storage connection as the wire sensor walks it
    (bridge/conns.py's SyncRow)."""

    initiator: str
    initiator_port: int
    portal: str
    target: str
    direction: str  # "to_target" or "to_initiator"
    state: str  # "in sync", "provisional", "out of sync", "not measurable"
    out_of_sync_bytes: int
    out_of_sync_s: float
    desyncs: int
    reason: str  # why not measurable ("tls", "not iSCSI or NVMe/TCP"), else ""


@dataclass(frozen=True, slots=True)
class LevelView:
    """One Levels of a group with elastic levels (controller/levels.py)."""

    group: str
    levels: str  # "iops", "read_iops", "bandwidth", ... (the config key's stem)
    level: int  # 0: the baseline
    caps: list[float]  # per second: IOs or bytes
    rate: float  # the last convergence's, per second
    delay_s: float  # what its cap asks
    delay_class: int  # the group's level class in force
    target_class: int
    headroom: bool  # every resource it loaded had room at the last convergence
    promotions: int
    demotions: int


@dataclass(frozen=True, slots=True)
class WireView:
    """Bridge mode: the wire sensor's counts since the start (sensing/bridge.py), the
    sync of the connection directions (at most SYNC_ROWS of them, those not in sync
    first: the wire may hold 65,536; `directions` counts them all by state), the
    resources holding their class because their connections are mostly out of sync."""

    capturing: bool
    sensor: str  # "kernel" or "capture"
    held: list[str] = field(default_factory=list)
    sync: list[SyncView] = field(default_factory=list)
    directions: dict[str, int] = field(default_factory=dict)  # state -> all of them
    out_of_sync_s: float = 0.0  # over all of them
    counters: dict[str, int] = field(default_factory=dict, metadata={FLATTEN: True})


@dataclass(frozen=True, slots=True)
class QuarantineView:
    """What the kernel refused (datapath/reconcile.py): an initiator ("member") or an
    object the members share ("jumps", "gate", "leaf"), left out and retried."""

    object: str  # the initiator's address, or the object's name
    kind: str
    error: str  # the kernel's (or the address check's) one line
    for_s: float  # since it was first refused
    retries: int
    retry_in_s: float | None  # None: never (an address no initiator has)


@dataclass(frozen=True, slots=True)
class StatusView:
    mode: str  # "target" or "bridge"
    paused: bool
    restart_needed: list[str]  # keys a reload read that take effect at the next restart
    tick_s: float
    step_s: float
    max_class: int
    ladder: LadderView
    write_mode: str
    counters: CountersView
    resources: list[ResourceView]
    initiators: list[InitiatorView]
    wire: WireView | None
    groups: list[GroupView]
    quarantine: list[QuarantineView]  # what the kernel refused, retried with backoff
    levels: list[LevelView]  # the groups' elastic levels (docs/levels.md)
    # [fleet]: members, leaders, epochs, the engine's lag (core/fleetmode.py); None alone
    fleet: dict[str, Any] | None


# ------------------------------------------------------------------ JSON
@functools.cache
def _fields(cls: type) -> tuple[tuple[str, str, bool], ...]:
    """(attribute, JSON name, flattened) of a view class."""
    return tuple(
        (f.name, f.metadata.get(JSON_NAME, f.name), bool(f.metadata.get(FLATTEN)))
        for f in dataclasses.fields(cls)
    )


def to_json(v: Any) -> Any:
    """A view (or a list or dict of them) as the protocol's plain JSON values."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        out: dict[str, Any] = {}
        for attr, name, flat in _fields(type(v)):
            x = getattr(v, attr)
            if flat:
                out.update({k: to_json(y) for k, y in x.items()})
            else:
                out[name] = to_json(x)
        return out
    if isinstance(v, list | tuple):
        return [to_json(x) for x in v]
    if isinstance(v, dict):
        return {k: to_json(x) for k, x in v.items()}
    return v


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def from_json(cls: type[T], data: Any, where: str = "") -> T:
    """The view `cls` from its JSON, every field checked; ViewError otherwise."""
    return typing.cast(T, _decode(cls, data, where or cls.__name__))


def _decode(tp: Any, v: Any, where: str) -> Any:
    if tp is Any:
        return v
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in get_args(tp):
            return None
        errors = []
        for alt in get_args(tp):
            if alt is type(None):
                continue
            try:
                return _decode(alt, v, where)
            except ViewError as e:
                errors.append(str(e))
        raise ViewError(errors[0] if errors else f"{where}: null where a value is needed")
    if origin is list:
        (item,) = get_args(tp)
        if not isinstance(v, list):
            raise ViewError(f"{where}: a list is needed")
        return [_decode(item, x, f"{where}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        _key, item = get_args(tp)
        if not isinstance(v, dict):
            raise ViewError(f"{where}: an object is needed")
        return {str(k): _decode(item, x, f"{where}.{k}") for k, x in v.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise ViewError(f"{where}: an object is needed")
        hints = _hints(tp)
        kw: dict[str, Any] = {}
        named = set()
        flat_attr = None
        for attr, name, flat in _fields(tp):
            if flat:
                flat_attr = attr
                continue
            named.add(name)
            if name not in v:
                raise ViewError(f"{where}: {name}: missing")
            kw[attr] = _decode(hints[attr], v[name], f"{where}.{name}")
        if flat_attr is not None:
            rest = {k: x for k, x in v.items() if k not in named}
            kw[flat_attr] = _decode(hints[flat_attr], rest, where)
        return tp(**kw)
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ViewError(f"{where}: a number is needed")
        return float(v)
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ViewError(f"{where}: a whole number is needed")
        return v
    if tp in (str, bool):
        if not isinstance(v, tp):
            raise ViewError(f"{where}: {'text' if tp is str else 'true or false'} is needed")
        return v
    raise ViewError(f"{where}: cannot read a {tp!r}")  # a view field of a type not handled
