"""What the daemon asks of its sensors, and of the data path: the two interfaces of the loop.

Sensors
    What every sensor gives the daemon: the tick's samples (read_samples,
    device_samples, utilization_samples: each resource's busy share), the
    convergence's discovery and write samples (converge), and for the
    initiator groups (core/grouping.py) the IoSamples of the last
    convergence with the time they cover, the names the
    initiators logged in with, and which resources want IoSamples.  A target
    host's is sensing/target.py's TargetSensor, a bridge's
    sensing/bridge.py's BridgeSensor.  `discoveries` counts the times the
    discovery was rebuilt (the daemon freezes the garbage collector's view
    of it after each, core/gcwatch.py GcFreezer); a sensor that builds no
    long-lived discovery leaves it at 0.

BridgeSensors
    The wire sensor's extension (bridge mode): started once the bridge is
    set up, reconfigured with the resources' volumes at a reload, its
    volumes (`santhrottle resources`), its counters and whether it captures
    (status, metrics).  The daemon is handed it as its own argument, so no
    code asks a sensor what it can do.

Actuator
    What the loop asks of the data path (datapath/actuator.py's Datapath):
    reconcile() the kernel's members with the classes wanted, advance_glides() the glide
    leaves, the members it holds (the one record of what the kernel holds:
    the daemon keeps no copy), the members it could not apply (quarantine),
    missing(), drift() and repair() of the objects it owns, cleanup().
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from santhrottle.controller.domain import (
    DeviceSample,
    IoSample,
    ReadSample,
    UtilizationSample,
    WriteSample,
)


class SeenInitiator(Protocol):
    """An initiator as discovery sees it."""

    @property
    def resources(self) -> Iterable[str]: ...


class Discovery(Protocol):
    """Who loads what (sensing/discovery.py's Discovery): resource -> its devices,
    initiator address -> what it loads."""

    @property
    def resources(self) -> Mapping[str, Sequence[str]]: ...

    @property
    def initiators(self) -> Mapping[str, SeenInitiator]: ...


class Sensors(Protocol):
    io_samples: list[IoSample]  # the last convergence's, per (resource, initiator)
    io_span_s: float | None  # the time io_samples cover (None: one convergence)
    discoveries: int  # times the discovery was rebuilt

    def read_samples(self) -> list[ReadSample]: ...

    def device_samples(self) -> list[DeviceSample]: ...

    def utilization_samples(self) -> list[UtilizationSample]: ...

    def converge(self) -> tuple[Discovery | None, list[WriteSample]]: ...

    def initiator_names(self) -> Mapping[str, Iterable[str]]: ...

    def want_io_samples(self, resources: Iterable[str]) -> None: ...

    def close(self) -> None: ...


class SyncRow(Protocol):
    """One direction of one connection as the wire sensor walks it (bridge/conns.py)."""

    initiator: str
    initiator_port: int
    portal: str
    target: str
    direction: str
    state: str
    out_of_sync_bytes: int
    out_of_sync_s: float
    desyncs: int
    reason: str


class VolumeRow(Protocol):
    """One volume the wire has shown (bridge/volumes.py)."""

    @property
    def name(self) -> str: ...

    @property
    def resources(self) -> Sequence[str]: ...

    @property
    def initiators(self) -> Sequence[str]: ...

    @property
    def reads(self) -> float: ...

    @property
    def read_latency_s(self) -> float | None: ...


class BridgeSensors(Sensors, Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def running(self) -> bool: ...

    def start(self) -> None: ...

    def reconfigure(self, resources: Mapping[str, Iterable[str]]) -> None: ...

    def volume_rows(self) -> Sequence[VolumeRow]: ...

    def counters(self) -> dict[str, int]: ...

    def sync(self) -> Sequence[SyncRow]: ...

    @property
    def held(self) -> frozenset[str]: ...


class Quarantined(Protocol):
    """What the kernel refused (datapath/reconcile.py)."""

    kind: str  # "member", or a shared object's kind: "jumps", "gate", "leaf"
    error: str
    since: float
    retries: int
    retry_at: float  # math.inf: never (an address no initiator has)


class Actuator(Protocol):
    def apply(self) -> Any: ...

    # ip -> (class before, class after, mode) of what changed in the kernel
    def reconcile(
        self, want: Mapping[str, tuple[int, str]], *, ordered: bool = True
    ) -> Mapping[str, tuple[int, int, str]]: ...

    def advance_glides(self) -> int: ...

    def members(self) -> Mapping[str, tuple[int, str]]: ...

    def quarantined(self) -> Mapping[str, Quarantined]: ...

    # drift (datapath/drift.py): what the data path left, compared with the kernel on
    # another thread, and rebuilt
    def expected(self) -> Any: ...

    def missing(self, expected: Any) -> list[str]: ...

    def drift(self, expected: Any) -> list[str]: ...

    def repair(self) -> int: ...

    def cleanup(self) -> Any: ...

    # descents through a glide leaf (in order) and without one (every leaf busy)
    @property
    def glided(self) -> int: ...

    @property
    def unordered_moves(self) -> int: ...

    @property
    def errors(self) -> int: ...  # the kernel's refusals since the start

    @property
    def quarantines(self) -> Mapping[str, int]: ...  # per kind: entries made since the start
