"""/proc/diskstats: per-device counters and per-interval rates.

Format (Documentation/admin-guide/iostats.rst): major minor name, then
11 fields (kernel < 4.18), 15 (4.18+: discards) or 17 (5.5+: flushes), so
14, 18 or 20 whitespace-separated fields per line. Times are in ms.

Counters are unsigned long in the kernel: 64-bit on the machines we run
on, 32-bit on old/32-bit kernels. A counter that goes backwards is taken
as a wrap at 2**32 if the old value fit in 32 bits (the only width at
which a wrap is plausible within one interval), otherwise as a reset (a
device removed and re-created with the same name): that device gets no
interval for that pass. A device missing from the new snapshot has
disappeared; it is dropped and reported.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

SECTOR_BYTES = 512  # diskstats sectors are always 512 bytes
FIELD_COUNTS = (14, 18, 20)
WRAP_32 = 1 << 32
MS = 1e-3


@dataclass(frozen=True, slots=True)
class DevCounters:
    major: int
    minor: int
    name: str
    reads: int
    reads_merged: int
    read_sectors: int
    read_ticks_ms: int
    writes: int
    writes_merged: int
    write_sectors: int
    write_ticks_ms: int
    in_flight: int
    io_ticks_ms: int
    weighted_ms: int


# positions of the cumulative counters we difference (in_flight is a gauge)
_COUNTERS = (
    "reads",
    "reads_merged",
    "read_sectors",
    "read_ticks_ms",
    "writes",
    "writes_merged",
    "write_sectors",
    "write_ticks_ms",
    "io_ticks_ms",
    "weighted_ms",
)


@dataclass
class Snapshot:
    devices: dict[str, DevCounters] = field(default_factory=dict)
    malformed: list[str] = field(default_factory=list)  # skipped lines, for a counted warning


def parse_diskstats(text: str) -> Snapshot:
    snap = Snapshot()
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) not in FIELD_COUNTS:
            snap.malformed.append(line)
            continue
        try:
            nums = [int(p) for p in parts[3:14]]
            major, minor = int(parts[0]), int(parts[1])
        except ValueError:
            snap.malformed.append(line)
            continue
        if any(n < 0 for n in nums) or major < 0 or minor < 0:
            snap.malformed.append(line)
            continue
        name = parts[2]
        snap.devices[name] = DevCounters(major, minor, name, *nums)
    return snap


@dataclass(frozen=True, slots=True)
class DevInterval:
    """One device over one interval."""

    name: str
    interval_s: float
    reads: int
    writes: int
    read_bytes: int
    write_bytes: int
    read_ticks_ms: int
    write_ticks_ms: int
    in_flight: int
    io_ticks_ms: int
    weighted_ms: int

    @property
    def read_latency_s(self) -> float | None:
        """Mean time per completed read (delta read ticks / delta reads)."""
        return self.read_ticks_ms * MS / self.reads if self.reads else None

    @property
    def write_latency_s(self) -> float | None:
        return self.write_ticks_ms * MS / self.writes if self.writes else None

    @property
    def write_bps(self) -> float:
        return self.write_bytes / self.interval_s

    @property
    def read_bps(self) -> float:
        return self.read_bytes / self.interval_s

    @property
    def utilization(self) -> float:
        """Share of the interval with IO in flight (io_ticks), 0..1."""
        return min(1.0, self.io_ticks_ms * MS / self.interval_s)


@dataclass
class IntervalResult:
    devices: dict[str, DevInterval] = field(default_factory=dict)
    disappeared: list[str] = field(default_factory=list)
    reset: list[str] = field(default_factory=list)  # counters went backwards: no interval


def _delta(old: int, new: int) -> int | None:
    if new >= old:
        return new - old
    if old < WRAP_32:
        return new + WRAP_32 - old
    return None


def interval(prev: Snapshot, cur: Snapshot, interval_s: float) -> IntervalResult:
    if interval_s <= 0.0:
        raise ValueError(f"diskstats interval must be > 0 s, got {interval_s}")
    out = IntervalResult()
    for name, old in prev.devices.items():
        new = cur.devices.get(name)
        if new is None:
            out.disappeared.append(name)
            continue
        if (new.major, new.minor) != (old.major, old.minor):
            out.reset.append(name)
            continue
        d: dict[str, int] = {}
        for f in _COUNTERS:
            v = _delta(getattr(old, f), getattr(new, f))
            if v is None:
                break
            d[f] = v
        else:
            out.devices[name] = DevInterval(
                name=name,
                interval_s=interval_s,
                reads=d["reads"],
                writes=d["writes"],
                read_bytes=d["read_sectors"] * SECTOR_BYTES,
                write_bytes=d["write_sectors"] * SECTOR_BYTES,
                read_ticks_ms=d["read_ticks_ms"],
                write_ticks_ms=d["write_ticks_ms"],
                in_flight=new.in_flight,
                io_ticks_ms=d["io_ticks_ms"],
                weighted_ms=d["weighted_ms"],
            )
            continue
        out.reset.append(name)
    return out


def read_latency_of(devs: Iterable[DevInterval]) -> tuple[int, float | None]:
    """Read-weighted mean read latency over the devices that had reads.

    Devices without reads in the interval do not count (paper 2.3.2: only
    consumers with read activity). Returns (reads, mean latency or None).
    """
    reads = ticks = 0
    for d in devs:
        if d.reads:
            reads += d.reads
            ticks += d.read_ticks_ms
    return reads, (ticks * MS / reads if reads else None)


class DiskstatsReader:
    """Reads /proc/diskstats; the path is a parameter so tests use captured files."""

    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self.path = Path(proc_root) / "diskstats"

    def snapshot(self) -> Snapshot:
        return parse_diskstats(self.path.read_text(encoding="ascii", errors="replace"))
