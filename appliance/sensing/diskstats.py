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

Errors: parse_diskstats() never raises. A line it cannot read (another field
count, a number field that is not ASCII digits, a value of 2**64 or more, which
no kernel counter reaches) is skipped and kept in Snapshot.malformed. interval()
and write_bps_of() raise ValueError, one line, for an interval that is not a
finite number of seconds >= MIN_INTERVAL_S; otherwise every latency and rate
they give is finite and non-negative. For example:

    >>> snap = parse_diskstats("8 0 sda 1 0 8 4 0 0 0 0 0 4 4\n8 1 sdb ٣ 0 8 4 0 0 0 0 0 4 4")
    >>> list(snap.devices), len(snap.malformed)
    (['sda'], 1)
    >>> interval(snap, snap, float("nan"))
    Traceback (most recent call last):
    ValueError: diskstats interval must be a finite number of seconds >= 1e-06, got nan
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from operator import mul, sub
from pathlib import Path
from typing import NamedTuple

from santhrottle.appliance.sensing.keptfile import KeptFile
from santhrottle.controller.domain import DeviceSample, UtilizationSample

SECTOR_BYTES = 512  # diskstats sectors are always 512 bytes
FIELD_COUNTS = (14, 18, 20)
WRAP_32 = 1 << 32
COUNTER_LIMIT = 1 << 64  # an unsigned long is at most 64 bits: a larger value is garbage
# Below this an interval gives rates no device has (and, near 0, overflows a float)
MIN_INTERVAL_S = 1e-6
MS = 1e-3
# A line of /proc/diskstats and its third field, the device's name (DiskstatsReader)
_NAMED_LINE = re.compile(r"^([ \t]*[^\s]+[ \t]+[^\s]+[ \t]+([^\s]+)[^\n]*)", re.MULTILINE)


class DevCounters(NamedTuple):
    """One line of /proc/diskstats (a tuple: a pass builds 1,000s of them, make bench)."""

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


# Tuple positions. The cumulative counters we difference are 3..10 and 12..13;
# in_flight (11) is a gauge.
_READS, _READ_SECTORS, _READ_TICKS = 3, 5, 6
_WRITES, _WRITE_SECTORS, _WRITE_TICKS = 7, 9, 10
_IN_FLIGHT, _IO_TICKS, _WEIGHTED = 11, 12, 13


@dataclass
class Snapshot:
    devices: dict[str, DevCounters] = field(default_factory=dict)
    malformed: list[str] = field(default_factory=list)  # skipped lines, for a counted warning


def parse_diskstats(text: str) -> Snapshot:
    snap = Snapshot()
    lines = text.splitlines()
    for i in range(0, len(lines), _PARSE_BLOCK_LINES):
        block = lines[i : i + _PARSE_BLOCK_LINES]
        if not _parse_columns(list(map(str.split, block)), snap.devices):
            _parse_lines(block, snap)
    return snap


def _parse_lines(lines: list[str], snap: Snapshot) -> None:
    """Line by line: any mix of field counts, malformed lines skipped and kept."""
    devices, make = snap.devices, _new_counters
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        if len(parts) not in FIELD_COUNTS:
            snap.malformed.append(line)
            continue
        digits = "".join((parts[0], parts[1], *parts[3:14]))
        if not (digits.isascii() and digits.isdigit()):  # int() takes "+1", "1_0", "٣"
            snap.malformed.append(line)
            continue
        try:
            nums = list(map(int, parts[3:14]))
            major, minor = int(parts[0]), int(parts[1])
        except ValueError:  # more digits than int() converts
            snap.malformed.append(line)
            continue
        if max(major, minor, *nums) >= COUNTER_LIMIT:
            snap.malformed.append(line)
            continue
        name = parts[2]
        devices[name] = make((major, minor, name, *nums))


_NUMBER_COLUMNS = (0, 1, *range(3, 14))  # every field we keep but the name
# Lines per column-by-column block: small enough that a block's strings and ints
# stay in the CPU's caches (the whole file at once was slower than line by line
# in make bench, where the sock_diag dump has just evicted everything)
_PARSE_BLOCK_LINES = 64


def _parse_columns(rows: list[list[str]], devices: dict[str, DevCounters]) -> bool:
    """A block of split lines column by column, in C loops, into `devices`, when
    every line has the same valid field count and every number is ASCII digits below
    COUNTER_LIMIT (1,000 devices: ~2.1 -> 1.8 ms in make bench). False, and nothing
    added, otherwise: _parse_lines() then says which lines it skipped."""
    widths = set(map(len, rows))
    if len(widths) != 1 or widths.pop() not in FIELD_COUNTS:
        return False
    columns = list(zip(*rows, strict=True))
    digits = "".join("".join(columns[i]) for i in _NUMBER_COLUMNS)
    if not (digits.isascii() and digits.isdigit()):
        return False
    try:
        nums = [list(map(int, columns[i])) for i in _NUMBER_COLUMNS]
    except ValueError:
        return False
    if max(map(max, nums)) >= COUNTER_LIMIT:
        return False
    names = columns[2]
    counters = map(_new_counters, zip(nums[0], nums[1], names, *nums[2:], strict=True))
    devices.update(zip(names, counters, strict=True))
    return True


class DevInterval(NamedTuple):
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


# NamedTuples from a tuple without a Python-level call (a pass builds 1,000s)
_new_counters = partial(tuple.__new__, DevCounters)
_new_interval = partial(tuple.__new__, DevInterval)


def _delta(old: int, new: int) -> int | None:
    if new >= old:
        return new - old
    if old < WRAP_32:
        return new + WRAP_32 - old
    return None


def _deltas(old: DevCounters, new: DevCounters) -> list[int] | None:
    """new - old for the cumulative counters at positions 3..10 and 12..13 (in_flight,
    a gauge, is skipped: list index i is tuple position 3 + i, or 4 + i from 8 on);
    None when a counter went back further than a 32-bit wrap explains."""
    d = list(map(sub, new[3:11], old[3:11]))
    d += map(sub, new[12:14], old[12:14])
    if min(d) >= 0:
        return d
    olds = (*old[3:11], *old[12:14])
    news = (*new[3:11], *new[12:14])
    for i, (a, b) in enumerate(zip(olds, news, strict=True)):
        v = _delta(a, b)
        if v is None:
            return None
        d[i] = v
    return d


def _check_interval(interval_s: float) -> None:
    try:
        ok = math.isfinite(interval_s) and interval_s >= MIN_INTERVAL_S
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(
            "diskstats interval must be a finite number of seconds >= "
            f"{MIN_INTERVAL_S:g}, got {interval_s!r}"
        )


def interval(prev: Snapshot, cur: Snapshot, interval_s: float) -> IntervalResult:
    _check_interval(interval_s)
    res = _interval_columns(prev, cur, interval_s)
    return res if res is not None else _interval_by_device(prev, cur, interval_s)


def _interval_by_device(prev: Snapshot, cur: Snapshot, interval_s: float) -> IntervalResult:
    """Device by device: disappearances, re-created devices, wraps and resets."""
    out = IntervalResult()
    make = _new_interval
    for name, old in prev.devices.items():
        new = cur.devices.get(name)
        if new is None:
            out.disappeared.append(name)
            continue
        if new[:2] != old[:2]:  # major:minor
            out.reset.append(name)
            continue
        d = _deltas(old, new)
        if d is None:
            out.reset.append(name)
            continue
        out.devices[name] = make(
            (
                name,
                interval_s,
                d[_READS - 3],
                d[_WRITES - 3],
                d[_READ_SECTORS - 3] * SECTOR_BYTES,
                d[_WRITE_SECTORS - 3] * SECTOR_BYTES,
                d[_READ_TICKS - 3],
                d[_WRITE_TICKS - 3],
                new[_IN_FLIGHT],
                d[_IO_TICKS - 4],  # after the skipped in_flight
                d[_WEIGHTED - 4],
            )
        )
    return out


_CUMULATIVE = (*range(3, 11), 12, 13)  # the counters we difference (in_flight, 11, is a gauge)


def _interval_columns(prev: Snapshot, cur: Snapshot, interval_s: float) -> IntervalResult | None:
    """interval() column by column, in C loops, in the common case: the same devices
    in the same order, none re-created, no counter gone back (1,000 devices: ~1.6 ->
    1.05 ms in make bench). None otherwise (_interval_by_device())."""
    if not prev.devices or list(prev.devices) != list(cur.devices):
        return None
    old = list(zip(*prev.devices.values(), strict=True))
    new = list(zip(*cur.devices.values(), strict=True))
    if old[0] != new[0] or old[1] != new[1]:  # major:minor
        return None
    d = {i: list(map(sub, new[i], old[i])) for i in _CUMULATIVE}
    if min(map(min, d.values())) < 0:
        return None
    intervals = zip(
        new[2],
        repeat(interval_s),
        d[_READS],
        d[_WRITES],
        map(mul, d[_READ_SECTORS], repeat(SECTOR_BYTES)),
        map(mul, d[_WRITE_SECTORS], repeat(SECTOR_BYTES)),
        d[_READ_TICKS],
        d[_WRITE_TICKS],
        new[_IN_FLIGHT],
        d[_IO_TICKS],
        d[_WEIGHTED],
    )
    return IntervalResult(dict(zip(new[2], map(_new_interval, intervals), strict=True)))


def write_bps_of(
    prev: Snapshot, cur: Snapshot, interval_s: float, devices: Iterable[str]
) -> dict[str, float]:
    """Write bytes/s of the given devices only (the per-second pass needs no more).
    A device missing from either snapshot, re-created (another major:minor) or
    whose write counter went back further than a 32-bit wrap is left out."""
    _check_interval(interval_s)
    out: dict[str, float] = {}
    po, pc = prev.devices, cur.devices
    scale = SECTOR_BYTES / interval_s
    for name in devices:
        old, new = po.get(name), pc.get(name)
        if old is None or new is None or new.major != old.major or new.minor != old.minor:
            continue  # gone, or re-created under another major:minor
        v = new.write_sectors - old.write_sectors
        if v < 0:  # a 32-bit wrap, or a reset (no rate)
            wrapped = _delta(old.write_sectors, new.write_sectors)
            if wrapped is None:
                continue
            v = wrapped
        out[name] = v * scale
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


def device_sample_of(resource: str, devs: Iterable[DevInterval]) -> DeviceSample | None:
    """A resource's devices as Pesto's LQ line sees them: IOs completed (reads and
    writes), their mean latency, the mean IOs in flight (weighted io time /
    interval, Little's law). None without completed IOs."""
    ios = ticks = weighted = 0
    span_s = 0.0
    for d in devs:
        ios += d.reads + d.writes
        ticks += d.read_ticks_ms + d.write_ticks_ms
        weighted += d.weighted_ms
        span_s = max(span_s, d.interval_s)
    if not ios or span_s <= 0.0:
        return None
    return DeviceSample(resource, ios, ticks * MS / ios, weighted * MS / span_s)


def utilization_of(resource: str, devs: Iterable[DevInterval]) -> UtilizationSample:
    """A resource's busy share: the busiest of its devices' io_ticks / interval (as
    iostat's %util), unclamped, with the interval as its span (controller/
    utilization.py adds the ticks' busy time up before it clamps: io_ticks takes a
    completed IO's whole time at once, across a tick's edge)."""
    share, span = 0.0, None
    for d in devs:
        share = max(share, d.io_ticks_ms * MS / d.interval_s)
        span = d.interval_s
    return UtilizationSample(resource, share, span)


class DiskstatsReader:
    """Reads /proc/diskstats; the path is a parameter so tests use captured files.

    The file stays open (sensing/keptfile.py): each snapshot reads it again from
    offset 0, the tick's and the convergence's threads share the descriptor, and a
    process that is out of file descriptors (a flood of connections elsewhere)
    still reads its samples.  snapshot(devices) parses the lines of those devices
    only, found by one regular expression that takes each line's name (the others,
    the loop, nbd and sr devices the daemon has no use for, are neither split nor
    converted, and a malformed one is not noted), where they are fewer than half
    of the file's lines; otherwise every line, as picking them would cost more
    (make bench: 1,000 devices, all of them wanted)."""

    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self.path = Path(proc_root) / "diskstats"
        self._file = KeptFile(self.path)

    def snapshot(self, devices: Collection[str] | None = None) -> Snapshot:
        """Every device's counters, or those of `devices` (and maybe others: above)."""
        text = self._file.read().decode("ascii", errors="replace")
        if devices is not None and 2 * len(devices) < text.count("\n"):
            names = devices if isinstance(devices, frozenset | set) else frozenset(devices)
            text = "\n".join([line for line, name in _NAMED_LINE.findall(text) if name in names])
        return parse_diskstats(text)

    def close(self) -> None:
        self._file.close()
