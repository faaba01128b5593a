"""Resources on a bridge: named groups of the volumes the wire can name, and their samples.

Problem
    On a target host a resource is a volume group whose devices diskstats
    counts. On a bridge the only names are the wire's: a LUN of an iSCSI
    target or a namespace of an NVMe subsystem at a portal (tracker.py's
    Volume). The admin groups them into resources in the configuration
    (`[resources.array1] volumes = [...]`); this module parses those names
    and turns the tracker's per-volume figures into the controller's
    samples, so that controller/ takes the same ReadSample and WriteSample
    as on a target host.

Names
    iscsi://PORTAL/IQN/LUN and nvme://PORTAL/NQN/NSID; PORTAL is address
    or address:port ([v6-address]:port; the port defaults to 3260 and
    4420), IQN or NQN may be "*" (any target at that portal, and the
    volumes of sessions whose login the sensor did not see), LUN or NSID
    may be "*" (all of them).

Law
    A resource's tick: reads = the sum over its volumes, read latency = the
    read-weighted mean (sum of latency sums / sum of reads: the same rule
    as diskstats' on a target host), write rate = its volumes' write bytes
    / the interval. Its convergence: per initiator, its write bytes on the
    resource's volumes / the interval. A volume in no resource is counted
    by no resource (`santhrottle resources` shows it, so the admin can name
    it). A volume in two resources counts in both.

What the wire shows
    volume_rows(): every volume the live connections have sent commands
    to, with its initiators, the resources it is in and its last tick's
    reads and latency, named as the configuration takes it -- an admin
    writes the resources from that list.

Bounds
    A name that does not parse raises VolumeNameError naming the part.

Sync
    out_of_sync(): the resources whose connections (those that can carry
    their volumes: protocol, portal, target) are mostly out of sync: the
    bridge sensor holds their class rather than act on a partial sample.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from santhrottle.controller.domain import IoSample, ReadSample, WriteSample

from .pdu import ISCSI_PORT, NVME_TCP_PORT
from .sums import ISCSI, NVME, Volume, VolumeReads

ANY = "*"
_DEFAULT_PORTS = {ISCSI: ISCSI_PORT, NVME: NVME_TCP_PORT}
# A resource whose live connections are more than this share out of sync holds its
# class: its reads are a partial sample (docs/bridge.md, "Sync").
OUT_OF_SYNC_HOLD_SHARE = 0.5


class VolumeNameError(ValueError):
    """A volume name that does not parse; the message names the part."""


@dataclass(frozen=True, slots=True)
class VolumePattern:
    proto: str
    portal: str  # as the tracker writes it: address:port, [v6]:port
    target: str  # or ANY
    unit: int | None  # None: any

    def matches(self, v: Volume) -> bool:
        return (
            v.proto == self.proto
            and v.portal == self.portal
            and (self.target == ANY or v.target == self.target)
            and (self.unit is None or v.unit == self.unit)
        )


def parse_volume(name: str) -> VolumePattern:
    """iscsi://PORTAL/IQN/LUN or nvme://PORTAL/NQN/NSID (see the module header)."""
    scheme, sep, rest = name.partition("://")
    if not sep or scheme not in _DEFAULT_PORTS:
        raise VolumeNameError(f"volume {name!r}: must start with iscsi:// or nvme://")
    parts = rest.split("/")
    if len(parts) != 3:
        raise VolumeNameError(f"volume {name!r}: want {scheme}://PORTAL/NAME/UNIT")
    portal_s, target, unit_s = parts
    portal = _portal(name, portal_s, _DEFAULT_PORTS[scheme])
    if not target:
        raise VolumeNameError(f"volume {name!r}: the target name is empty (use * for any)")
    if unit_s == ANY:
        unit = None
    elif unit_s.isdigit():
        unit = int(unit_s)
    else:
        what = "LUN" if scheme == ISCSI else "NSID"
        raise VolumeNameError(f"volume {name!r}: {what} must be a number or *, got {unit_s!r}")
    return VolumePattern(scheme, portal, target, unit)


def _portal(name: str, s: str, default_port: int) -> str:
    if s.startswith("["):  # [v6]:port or [v6]
        host, _, tail = s[1:].partition("]")
        port_s = tail[1:] if tail.startswith(":") else ""
        if tail and not tail.startswith(":"):
            raise VolumeNameError(f"volume {name!r}: bad portal {s!r}")
    else:
        host, _, port_s = s.partition(":")
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise VolumeNameError(f"volume {name!r}: portal {host!r} is not an IP address") from None
    if port_s and not (port_s.isdigit() and 0 < int(port_s) < 65536):
        raise VolumeNameError(f"volume {name!r}: bad port {port_s!r}")
    port = int(port_s) if port_s else default_port
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"


class VolumeMap:
    """Resource name -> its volume patterns; which resources a volume belongs to."""

    def __init__(self, resources: Mapping[str, Iterable[str]]) -> None:
        self.patterns = {r: [parse_volume(v) for v in vols] for r, vols in resources.items()}
        self._of: dict[Volume, tuple[str, ...]] = {}

    def resources_of(self, v: Volume) -> tuple[str, ...]:
        got = self._of.get(v)
        if got is None:
            got = self._of[v] = tuple(
                r for r, pats in self.patterns.items() if any(p.matches(v) for p in pats)
            )
        return got

    def out_of_sync(self, conns: Mapping[tuple[str, str, str], tuple[int, int]]) -> set[str]:
        """The resources most of whose connections -- (protocol, portal, target) ->
        (connections, those with a direction not in sync), the tracker's out_of_sync() --
        are out of sync (more than OUT_OF_SYNC_HOLD_SHARE)."""
        out = set()
        for name, pats in self.patterns.items():
            n = m = 0
            for (proto, portal, target), (total, lost) in conns.items():
                if any(
                    p.proto == proto and p.portal == portal and p.target in (ANY, target)
                    for p in pats
                ):
                    n += total
                    m += lost
            if n and m > OUT_OF_SYNC_HOLD_SHARE * n:
                out.add(name)
        return out

    def read_samples(
        self, reads: Mapping[Volume, VolumeReads], writes: Mapping[Volume, int], interval_s: float
    ) -> list[ReadSample]:
        """One tick's samples, one per resource with reads or writes on its volumes."""
        acc: dict[str, list[float]] = {}  # resource -> [reads, latency sum, write bytes]
        for v, r in reads.items():
            for name in self.resources_of(v):
                a = acc.setdefault(name, [0, 0.0, 0])
                a[0] += r.reads
                a[1] += r.latency_sum_s
        for v, nbytes in writes.items():
            for name in self.resources_of(v):
                acc.setdefault(name, [0, 0.0, 0])[2] += nbytes
        return [
            ReadSample(name, int(n), lat / n if n else 0.0, wbytes / interval_s)
            for name, (n, lat, wbytes) in sorted(acc.items())
        ]

    def write_samples(
        self, writes: Mapping[tuple[Volume, str], int], interval_s: float
    ) -> list[WriteSample]:
        """One convergence's samples, one per (resource, initiator)."""
        acc: dict[tuple[str, str], int] = {}
        for (v, ini), nbytes in writes.items():
            for name in self.resources_of(v):
                acc[name, ini] = acc.get((name, ini), 0) + nbytes
        return [WriteSample(r, ini, b / interval_s) for (r, ini), b in sorted(acc.items())]

    def io_samples(
        self,
        reads: Mapping[tuple[Volume, str], VolumeReads],
        writes: Mapping[tuple[Volume, str], int],
    ) -> list[IoSample]:
        """One convergence's IoSamples for initiator groups, one per (resource,
        initiator): its IOs (reads and writes completed), its reads and their latency
        at the array, and its bytes written."""
        acc: dict[tuple[str, str], list[float]] = {}  # reads, latency sum, bytes, writes
        for (v, ini), r in reads.items():
            for name in self.resources_of(v):
                a = acc.setdefault((name, ini), [0.0, 0.0, 0.0, 0.0])
                a[0] += r.reads
                a[1] += r.latency_sum_s
                a[3] += r.writes
        for (v, ini), nbytes in writes.items():
            for name in self.resources_of(v):
                acc.setdefault((name, ini), [0.0, 0.0, 0.0, 0.0])[2] += nbytes
        return [
            IoSample(r, ini, n + nw, nbytes, n, lat / n if n else None)
            for (r, ini), (n, lat, nbytes, nw) in sorted(acc.items())
        ]


@dataclass(frozen=True, slots=True)
class VolumeRow:
    """One line of the volumes the wire shows: the admin's material for the config."""

    name: str  # as the configuration writes it (iscsi://PORTAL/IQN/LUN, nvme://...)
    resources: tuple[str, ...]  # the resources it belongs to (none: not configured)
    initiators: tuple[str, ...]
    reads: int  # in the last tick
    read_latency_s: float | None  # their mean; None without reads


def volume_name(v: Volume) -> str:
    """The name the configuration takes for v ("*" for a target not seen at login)."""
    return f"{v.proto}://{v.portal}/{v.target or ANY}/{v.unit}"


def volume_rows(
    seen: Mapping[Volume, Iterable[str]], last_tick: Mapping[Volume, VolumeReads], vmap: VolumeMap
) -> list[VolumeRow]:
    """Every volume seen (Tracker.seen()) or read in the last tick, sorted by name."""
    out = []
    for v in sorted(set(seen) | set(last_tick), key=volume_name):
        r = last_tick.get(v)
        out.append(
            VolumeRow(
                volume_name(v),
                vmap.resources_of(v),
                tuple(sorted(seen.get(v, ()))),
                r.reads if r else 0,
                r.mean_s if r and r.reads else None,
            )
        )
    return out
