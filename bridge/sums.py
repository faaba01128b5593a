"""What the wire's samples are made of: volumes, and the sums per volume and initiator.

Problem
    The tracker (tracker.py, the Python walk) and the in-kernel sensor's
    reader (ksums.py) give the bridge sensor the same figures: per volume
    the reads completed, their latency and the write bytes of each tick;
    per (volume, initiator) the write bytes and IOs of each convergence.
    Sums holds them between two takes; Volume names what they are about.

Names
    A Volume is a LUN of an iSCSI target or a namespace of an NVMe
    subsystem at a portal (address:port, [v6]:port); its target is "" until
    a login or connect named it. lun_number() reads SAM's 8-byte LUN field
    (peripheral and flat addressing).

Law
    read(), wrote(), write_done() add to the sums; take_tick(),
    take_writes() and take_initiator_ios() hand over what accumulated since
    their last call and start afresh, so an IO is counted in exactly one
    tick and one convergence.

Worked example
    s = Sums(); v = Volume("iscsi", "10.0.0.9:3260", "iqn.x:t", 2);
    s.read(v, "10.0.0.2", 0.004); s.read(v, "10.0.0.2", 0.010);
    s.take_tick() -> ({v: VolumeReads(2, 0.014)}, {}): a mean of 7 ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

# NSIDs that name no namespace: 0 (the fabrics connect, keep-alive, admin commands)
# and the broadcast NSID (a flush of every namespace).
NO_NAMESPACE = (0, 0xFFFFFFFF)

ISCSI = "iscsi"
NVME = "nvme"


class Volume(NamedTuple):
    """What the wire can name: a LUN of an iSCSI target or a namespace of an NVMe
    subsystem, at a portal; target "" until the login or connect was seen. A tuple: it
    keys the sums of every completion (hashed in C)."""

    proto: str
    portal: str  # target address:port
    target: str  # IQN or NQN
    unit: int  # LUN or NSID

    def __str__(self) -> str:
        kind = "lun" if self.proto == ISCSI else "nsid"
        return f"{self.proto} {self.portal} {self.target or '?'} {kind} {self.unit}"


@dataclass(slots=True)
class VolumeReads:
    reads: int = 0
    latency_sum_s: float = 0.0
    writes: int = 0  # write commands completed (per initiator: take_initiator_ios)

    @property
    def mean_s(self) -> float:
        return self.latency_sum_s / self.reads if self.reads else math.nan


def portal_name(addr: str, port: int) -> str:
    """A target's address and port as a volume name writes them ([v6]:port for IPv6)."""
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def lun_number(raw: int) -> int:
    """The LUN of the 8-byte LUN field (SAM: peripheral and flat addressing)."""
    method = raw >> 62
    if method == 0:
        return (raw >> 48) & 0xFF
    if method == 1:
        return (raw >> 48) & 0x3FFF
    return raw


class Sums:
    """The sums since the last takes (module header)."""

    __slots__ = ("initiator_ios", "reads", "volume_writes", "writes")

    def __init__(self) -> None:
        self.reads: dict[Volume, VolumeReads] = {}
        self.volume_writes: dict[Volume, int] = {}  # per tick: the resource's write rate
        self.writes: dict[tuple[Volume, str], int] = {}  # per convergence and initiator
        # per (volume, initiator) per convergence, for initiator groups: reads and writes
        self.initiator_ios: dict[tuple[Volume, str], VolumeReads] = {}

    def read(self, vol: Volume, initiator: str, latency_s: float, n: int = 1) -> None:
        """n reads completed, latency_s their latencies' sum."""
        r = self.reads.get(vol)
        if r is None:
            r = self.reads[vol] = VolumeReads()
        r.reads += n
        r.latency_sum_s += latency_s
        ri = self._initiator_io(vol, initiator)
        ri.reads += n
        ri.latency_sum_s += latency_s

    def wrote(self, vol: Volume, initiator: str, nbytes: int) -> None:
        k = (vol, initiator)
        self.writes[k] = self.writes.get(k, 0) + nbytes
        self.volume_writes[vol] = self.volume_writes.get(vol, 0) + nbytes

    def write_done(self, vol: Volume, initiator: str, n: int = 1) -> None:
        """n write commands completed."""
        self._initiator_io(vol, initiator).writes += n

    def _initiator_io(self, vol: Volume, initiator: str) -> VolumeReads:
        k = (vol, initiator)
        r = self.initiator_ios.get(k)
        if r is None:
            r = self.initiator_ios[k] = VolumeReads()
        return r

    def take_tick(self) -> tuple[dict[Volume, VolumeReads], dict[Volume, int]]:
        """Reads completed and write bytes per volume since the last call (a tick)."""
        reads, self.reads = self.reads, {}
        writes, self.volume_writes = self.volume_writes, {}
        return reads, writes

    def take_writes(self) -> dict[tuple[Volume, str], int]:
        """Write bytes per (volume, initiator address) since the last call (a convergence)."""
        out, self.writes = self.writes, {}
        return out

    def take_initiator_ios(self) -> dict[tuple[Volume, str], VolumeReads]:
        """Reads (their latency) and writes completed per (volume, initiator address)
        since the last call (a convergence)."""
        out, self.initiator_ios = self.initiator_ios, {}
        return out
