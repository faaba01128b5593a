"""Each initiator's IOs on a target host, for initiator groups (controller/groups.py).

What it owns
    The IoSamples of one convergence, one per (resource, initiator): its IOs,
    bytes and reads over the interval, and the read latency and IO latency it
    saw at the devices it used (io_samples(), pure); the ACL counters they
    are made from (acl_counters()); the names initiators logged in with
    (initiator_names(): explicit ACLs, generated ACLs' dynamic sessions on a
    target only one address is connected to, nvmet's debugfs). TargetSensor
    (target.py) feeds them what it already reads: the discovery, the
    diskstats intervals of the convergence, the LIO scans of two discoveries,
    nvmet's debugfs; io_samples() makes those of the resources asked for only
    (TargetSensor.want_io_samples(): the daemon's grouped resources).

Sources, per device (a LUN's or namespace's block device) and interval
    one user      the device is used by exactly one initiator: its diskstats
                  interval is that initiator's IOs (reads + writes), bytes,
                  reads, read latency (read ticks / reads) and IO latency
                  ((read + write ticks) / IOs). Exact.
    ACL           several initiators, one of them with explicit LIO ACL
                  counters on it (lio.py: num_cmds, read_mbytes, write_mbytes
                  per mapped LUN): its IOs are its SCSI commands, its bytes its
                  MiB read and written (1 MiB resolution per interval), its
                  reads its commands times the device's share of reads; its
                  latencies are the device's (LIO times nothing per ACL).
    shared        several initiators without counters: what the device did
                  minus what the ACL users account for, split equally among
                  them, at the device's latencies.
    A group's latency is then the read latency of the devices its members read
    (the device's own where it is theirs alone), weighted by their reads.

Why an equal share, not the whole device per initiator (as the write-rate
source "shared" charges, discovery.py): the groups add their members'
samples up, and a group's demand is its share of the resource's IOs
(groups.py, Little's law); charging every user a whole device would count
the device's IOs once per user and give the group with more members on it
a demand it does not have. An equal share keeps each device's total right
and splits it by what is known: nothing, on a device shared without ACLs.
The reads of an ACL user follow its commands, not its MiB read: a reader of
500 KiB/s shows 0 MiB in one interval and 1 in the next, and its group's
latency would switch between the read and the IO latency each second.

Not counted: a device without an interval (gone, or re-created: diskstats.py
gives it none), an ACL counter that went back (its mapped LUN re-created, or
a kernel that summed the per-CPU counters in 32 bits and wrapped: that
initiator counts as one without counters for the interval), initiators placed
by the static map only (no per-initiator counter), and pairs without IOs.

Worked example
    dm-1 (vg0) is used by 10.0.0.3 (an ACL) and 10.0.0.4 and 10.0.0.5
    (generated ACLs). In 1 s: 300 reads and 100 writes, 4 ms mean read
    latency; the ACL counted 120 commands and 1 MiB written. 10.0.0.3:
    120 IOs, 1 MiB, 90 reads (120 x 300/400) at 4 ms; 10.0.0.4 and 10.0.0.5:
    (400 - 120) / 2 = 140 IOs and (300 - 90) / 2 = 105 reads each, at 4 ms.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from functools import partial
from itertools import repeat
from typing import NamedTuple

from santhrottle.appliance.sensing.discovery import Discovery, Export
from santhrottle.appliance.sensing.diskstats import MS, DevInterval
from santhrottle.appliance.sensing.lio import LioTpg
from santhrottle.controller.domain import IoSample


class AclCount(NamedTuple):
    """One ACL's counters on one mapped LUN, at one LIO scan."""

    addresses: tuple[str, ...]  # its session's connections
    device: str
    commands: int
    read_bytes: int
    write_bytes: int


# (target, TPG tag, initiator name, TPG LUN) -> its counters
AclKey = tuple[str, int, str, int]


def acl_counters(tpgs: Iterable[LioTpg], exports: Iterable[Export]) -> dict[AclKey, AclCount]:
    """The explicit ACLs' counters on every mapped LUN with a device, with a session."""
    out: dict[AclKey, AclCount] = {}
    tpgs = [t for t in tpgs if t.acls]  # mostly none (generated ACLs)
    if not tpgs:
        return out
    dev = {(e.target, e.lun): e.device for e in exports if e.protocol == "iscsi" and e.device}
    for t in tpgs:
        for acl in t.acls:
            if not acl.addresses:
                continue
            for lun, cmds in acl.commands.items():
                d = dev.get((t.wwn, lun))
                if d is not None:
                    rb, wb = acl.read_bytes.get(lun, 0), acl.write_bytes.get(lun, 0)
                    out[(t.wwn, t.tag, acl.initiator, lun)] = AclCount(
                        acl.addresses, d, cmds, rb, wb
                    )
    return out


def acl_deltas(
    before: Mapping[AclKey, AclCount], now: Mapping[AclKey, AclCount]
) -> dict[tuple[str, str], tuple[float, float]]:
    """(address, device) -> (commands, bytes) between two scans; an ACL with several
    addresses has its counts split equally among them. A pair with a counter that is
    new or went back is left out (it counts as a user without counters)."""
    out: dict[tuple[str, str], list[float]] = {}
    unknown: set[tuple[str, str]] = set()
    for key, c in now.items():
        old = before.get(key)
        pairs = [(a, c.device) for a in c.addresses]
        if (
            old is None
            or old.device != c.device
            or c.commands < old.commands
            or c.read_bytes < old.read_bytes
            or c.write_bytes < old.write_bytes
        ):
            unknown.update(pairs)
            continue
        n = len(pairs)
        cmds = (c.commands - old.commands) / n
        nbytes = (c.read_bytes - old.read_bytes + c.write_bytes - old.write_bytes) / n
        for p in pairs:
            acc = out.setdefault(p, [0.0, 0.0])
            acc[0] += cmds
            acc[1] += nbytes
    return {p: (v[0], v[1]) for p, v in out.items() if p not in unknown}


# IoSample from a (resource, initiator, IOs, bytes, reads, read latency, IO latency,
# busy) tuple without a Python call per item (a cluster's users, 10,000s: make bench)
_io_sample = partial(tuple.__new__, IoSample)


class IoPlan(NamedTuple):
    """Who uses which device, from one discovery (io_plan())."""

    users: dict[str, tuple[str, tuple[str, ...]]]  # device -> (its resource, users, sorted)
    several: frozenset[tuple[str, str]]  # (resource, initiator) pairs on several devices


def io_plan(d: Discovery) -> IoPlan:
    """Every export with a device in a resource, over every initiator's exports."""
    users: dict[str, tuple[str, set[str]]] = {}
    for addr, v in d.initiators.items():
        for ex in v.exports:
            if ex.device and ex.resource:
                users.setdefault(ex.device, (ex.resource, set()))[1].add(addr)
    seen: set[tuple[str, str]] = set()
    several: set[tuple[str, str]] = set()
    for res, who in users.values():
        for ini in who:
            pair = (res, ini)
            (several if pair in seen else seen).add(pair)
    return IoPlan(
        {dev: (res, tuple(sorted(who))) for dev, (res, who) in users.items()},
        frozenset(several),
    )


def io_samples(
    plan: IoPlan,
    devices: Mapping[str, DevInterval],
    acl: Mapping[tuple[str, str], tuple[float, float]],
    resources: Collection[str] | None = None,
) -> list[IoSample]:
    """One IoSample per (resource, initiator) with IOs, of the given resources (None:
    all), from each device's users (io_plan()), the devices' intervals and the ACL
    users' counts (acl_deltas()), by the sources in the module's header. Device by
    device, then the initiators on several devices of a resource."""
    out: list[IoSample] = []
    several = plan.several
    # (resource, initiator) on several devices -> [IOs, bytes, reads, reads x read
    # latency, timed IOs, timed IOs x IO latency, busy s (NaN: one device shared)]
    acc: dict[tuple[str, str], list[float]] = {}

    def add(
        res: str,
        ini: str,
        ios: float,
        nbytes: float,
        reads: float,
        read_lat: float | None,
        io_lat: float | None,
        busy: float | None = None,
    ) -> None:
        if read_lat is None or reads <= 0:
            read_lat = None
        if io_lat is None or ios <= 0:
            io_lat = None
        if (res, ini) not in several:
            if ios > 0 or nbytes > 0:
                out.append(IoSample(res, ini, ios, nbytes, reads, read_lat, io_lat, busy))
            return
        a = acc.get((res, ini))
        if a is None:
            a = acc[(res, ini)] = [0.0] * 7
        a[6] += math.nan if busy is None else busy
        a[0] += ios
        a[1] += nbytes
        if read_lat is not None:
            a[2] += reads
            a[3] += reads * read_lat
        if io_lat is not None:
            a[4] += ios
            a[5] += ios * io_lat

    for dev, (res, who) in plan.users.items():
        iv = devices.get(dev)
        if iv is None or (resources is not None and res not in resources):
            continue
        ios = iv.reads + iv.writes
        nbytes = iv.read_bytes + iv.write_bytes
        read_lat = iv.read_latency_s
        io_lat = (iv.read_ticks_ms + iv.write_ticks_ms) * MS / ios if ios else None
        if len(who) == 1:  # its own LUN: its io_ticks are its busy time
            add(res, who[0], ios, nbytes, iv.reads, read_lat, io_lat, iv.io_ticks_ms * MS)
            continue
        read_share = iv.reads / ios if ios else 0.0
        rest_ios, rest_bytes, rest_reads = float(ios), float(nbytes), float(iv.reads)
        rest = who
        if acl:
            rest = ()
            for ini in who:
                got = acl.get((ini, dev))
                if got is None:
                    rest += (ini,)
                    continue
                cmds, ab = got
                reads = min(cmds * read_share, rest_reads)
                add(res, ini, cmds, ab, reads, read_lat, io_lat)
                rest_ios, rest_bytes, rest_reads = (
                    rest_ios - cmds,
                    rest_bytes - ab,
                    rest_reads - reads,
                )
        if not rest:
            continue
        n = len(rest)
        e_ios, e_bytes = max(rest_ios, 0.0) / n, max(rest_bytes, 0.0) / n
        e_reads = max(rest_reads, 0.0) / n
        if several and any((res, ini) in several for ini in rest):
            for ini in rest:
                add(res, ini, e_ios, e_bytes, e_reads, read_lat, io_lat)
        elif e_ios > 0 or e_bytes > 0:  # a cluster's LUN: its users' samples in C loops
            rl = read_lat if e_reads > 0 else None
            il = io_lat if e_ios > 0 else None
            row = (repeat(res), rest, repeat(e_ios), repeat(e_bytes), repeat(e_reads))
            out.extend(map(_io_sample, zip(*row, repeat(rl), repeat(il), repeat(None))))
    for (res, ini), a in acc.items():
        if a[0] > 0 or a[1] > 0:
            read_lat = a[3] / a[2] if a[2] else None
            io_lat = a[5] / a[4] if a[4] else None
            busy = None if math.isnan(a[6]) else a[6]
            out.append(IoSample(res, ini, a[0], a[1], a[2], read_lat, io_lat, busy))
    return out


def initiator_names(
    d: Discovery | None,
    tpgs: Iterable[LioTpg],
    nvme_hosts: Mapping[str, Iterable[str]],
) -> dict[str, tuple[str, ...]]:
    """address -> the names it logged in with, sorted; addresses without one left out.

    explicit LIO ACLs   the ACL's initiator name, at its sessions' addresses
                        (as discovery.py's InitiatorView.names);
    generated ACLs      a target's dynamic sessions' names when exactly one
                        address is connected to it (every session is that
                        address's); with several, which is whose is unknown;
    nvmet               the host NQNs of its controllers (nvmet.debugfs_hosts()).
    """
    out: dict[str, set[str]] = {}
    tpgs = [t for t in tpgs if t.acls or t.dynamic_sessions]  # mostly none: no cost
    for t in tpgs:
        for acl in t.acls:
            for addr in acl.addresses:
                out.setdefault(addr, set()).add(acl.initiator)
    if d is not None:
        dynamic: dict[str, set[str]] = {}  # target -> its dynamic sessions' names
        for t in tpgs:
            if t.dynamic_sessions:
                dynamic.setdefault(t.wwn, set()).update(t.dynamic_sessions)
        if dynamic:
            acl_addrs = {a for t in tpgs for acl in t.acls for a in acl.addresses}
            peers: dict[str, set[str]] = {}  # target -> the addresses connected to it
            for addr, v in d.initiators.items():
                for ex in v.exports:
                    if ex.protocol == "iscsi" and ex.target in dynamic and addr not in acl_addrs:
                        peers.setdefault(ex.target, set()).add(addr)
            for wwn, names in dynamic.items():
                who = peers.get(wwn, set())
                if len(who) == 1:
                    out.setdefault(next(iter(who)), set()).update(names)
    for addr, nqns in nvme_hosts.items():
        out.setdefault(addr, set()).update(nqns)
    return {a: tuple(sorted(n)) for a, n in sorted(out.items()) if n}
