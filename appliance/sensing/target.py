"""The target-host sensor: discovery every second, samples for the controller.

TargetSensor wires the adapters (diskstats, sysfs LVM map, LIO through
rtslib-fb, nvmet configfs and debugfs, sock_diag) and turns counter deltas
into the controller's ReadSample (per resource, every tick), WriteSample (per
resource and initiator, every convergence) and, for initiator groups,
`io_samples` (IoSample per resource and initiator, every convergence, by
initiator_io.py's sources) and initiator_names() (address -> IQNs and host
NQNs). Every path and the netns are constructor parameters; `clock` is only
used to timestamp snapshots.

Errors: a LioUnavailable becomes a warning (`warnings.lio_errors`, no LIO
targets that pass), and the LIO objects a scan skipped are added up in
`warnings.lio_skipped`; the sock_diag dump's OSError (SockDiagError included)
and a diskstats file that cannot be read (OSError) are raised to the caller.
An interval shorter than diskstats.MIN_INTERVAL_S gives no sample. For example,
after a converge() over a tree whose one ACL has an empty `info`:

    >>> sensor.warnings.lio_errors, sensor.warnings.lio_skipped
    (0, 1)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from santhrottle.appliance.sensing.blockdevs import LogicalVolume, LvmScanner
from santhrottle.appliance.sensing.conns import ConnectionSensor
from santhrottle.appliance.sensing.discovery import Discovery, acl_write_bytes, build_discovery
from santhrottle.appliance.sensing.diskstats import (
    MIN_INTERVAL_S,
    DevInterval,
    DiskstatsReader,
    Snapshot,
    device_sample_of,
    interval,
    read_latency_of,
    utilization_of,
    write_bps_of,
)
from santhrottle.appliance.sensing.initiator_io import (
    AclCount,
    AclKey,
    IoPlan,
    acl_counters,
    acl_deltas,
    initiator_names,
    io_plan,
    io_samples,
)
from santhrottle.appliance.sensing.keptfile import KeptFile
from santhrottle.appliance.sensing.lio import LioSensor, LioTpg, LioUnavailable
from santhrottle.appliance.sensing.nvmet import (
    DEFAULT_DEBUGFS,
    NvmetSensor,
    debugfs_controllers,
    debugfs_hosts,
)
from santhrottle.controller.domain import (
    DeviceSample,
    IoSample,
    ReadSample,
    UtilizationSample,
    WriteSample,
)

log = logging.getLogger(__name__)
# WriteSample from a (resource, initiator, bps) tuple without a Python call per item
_write_sample = partial(tuple.__new__, WriteSample)

ISCSI_PORT = 3260
NVME_TCP_PORT = 4420


@dataclass
class SensorWarnings:
    malformed_diskstats_lines: int = 0
    disappeared_devices: list[str] = field(default_factory=list)
    lio_errors: int = 0
    lio_skipped: int = 0  # unreadable LIO objects skipped, summed over scans (lio.py)


class TargetSensor:
    def __init__(
        self,
        *,
        proc_root: str | Path = "/proc",
        sys_root: str | Path = "/sys",
        configfs_root: str | Path = "/sys/kernel/config",
        dev_root: str | Path = "/dev",
        debugfs_root: str | Path = DEFAULT_DEBUGFS,
        ports: Iterable[int] = (ISCSI_PORT, NVME_TCP_PORT),
        netns: str | None = None,
        declared: Mapping[str, Iterable[str]] | None = None,
        static_map: Mapping[str, Iterable[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        connections: ConnectionSensor | None = None,
        snapshot_reuse_s: float = 0.0,
    ) -> None:
        self.sys_root = Path(sys_root)
        self.lvm = LvmScanner(sys_root, clock=clock)
        self.dev_root = str(dev_root)
        self.diskstats = DiskstatsReader(proc_root)
        self.lio = LioSensor(configfs_root, clock=clock)
        self.nvmet = NvmetSensor(configfs_root)
        self.debugfs_root = Path(debugfs_root)
        self.conns = connections or ConnectionSensor(ports, netns)
        self.declared = {k: tuple(v) for k, v in (declared or {}).items()}
        self.static_map = {k: tuple(v) for k, v in (static_map or {}).items()}
        self.clock = clock
        # converge() takes the per-tick pass's diskstats snapshot when it is at
        # most this old (the daemon: one tick) instead of parsing the file again
        self.snapshot_reuse_s = snapshot_reuse_s
        self.warnings = SensorWarnings()
        self._discovery: Discovery | None = None
        self.discoveries = 0  # how many times the discovery was rebuilt
        self._discovery_key: tuple[object, ...] = ()
        self._charges = _Charges()
        self._busy_devices: dict[str, tuple[str, ...]] = {}  # resource -> its PVs
        # the devices whose diskstats lines are parsed (None: all, before a discovery)
        self._watched: frozenset[str] | None = None
        self._tick_prev: tuple[float, Snapshot] | None = None
        self._inflight: dict[str, KeptFile] = {}  # device -> its /sys/block/DEV/inflight
        self._inflight_of = 0  # the discovery (self.discoveries) they were kept for
        self._device_samples: list[DeviceSample] = []
        self._utilization: list[UtilizationSample] = []  # of the same pass
        # (snapshot time, snapshot, ACL read time, ACL counters) of the last convergence
        self._conv_prev: tuple[float, Snapshot, float, dict[tuple[str, str], int]] | None = None
        # initiator groups: the last convergence's IoSamples, of the resources asked
        # for (want_io_samples(): the daemon's grouped ones; none until asked), the ACL
        # counters of the last discovery and of the one before, each device's users,
        # nvmet's host names
        self.io_samples: list[IoSample] = []
        self.io_span_s: float | None = None  # the time io_samples cover
        self.io_resources: frozenset[str] = frozenset()
        self._acl_io: dict[AclKey, AclCount] = {}
        self._acl_io_prev: dict[AclKey, AclCount] | None = None
        self._io_plan = IoPlan({}, frozenset())
        self._nvme_ctrls: list[Path] | None = None
        self._nvme_hosts: dict[str, tuple[str, ...]] = {}
        self._names: dict[str, tuple[str, ...]] = {}

    # -- discovery (every second) --------------------------------------
    def discover(self) -> Discovery:
        try:
            tpgs = self.lio.scan()
            self.warnings.lio_skipped += len(self.lio.last_skipped)
        except LioUnavailable as e:
            self.warnings.lio_errors += 1
            log.warning("LIO: %s", e)
            tpgs = []
        subsystems = self.nvmet.subsystems()
        ports = self.nvmet.ports()
        conns = self.conns.connections()
        lvs = self.lvm.scan()
        # The structure rarely changes; the ACL counters do, every second (they
        # are not part of LioAcl's equality). The sensors return the same object
        # for an unchanged connection dump or LVM map: `is` before `==`.
        key = (tpgs, subsystems, ports, conns, lvs)
        same = self._discovery is not None and all(
            a is b or a == b for a, b in zip(key, self._discovery_key, strict=True)
        )
        if same:
            assert self._discovery is not None
            disc = replace(
                self._discovery, acl_write_bytes=acl_write_bytes(tpgs, self._discovery.exports)
            )
            self._discovery = disc
            self._acl_io = acl_counters(tpgs, disc.exports)
            self._read_names(tpgs, rebuilt=False)
            return disc
        self._discovery = build_discovery(
            lio=tpgs,
            nvmet_subsystems=subsystems,
            nvmet_ports=ports,
            conns=conns,
            lvs=lvs,
            declared=self.declared,
            static_map=self.static_map,
            dev_root=self.dev_root,
        )
        self._discovery_key = key
        self._charges = _device_charges(self._discovery)
        self._busy_devices = busy_devices(self._discovery.resources, lvs)
        self._io_plan = io_plan(self._discovery)
        self._watched = _watched(self._discovery, self._busy_devices, self._charges, self._io_plan)
        self._acl_io = acl_counters(tpgs, self._discovery.exports)
        self._read_names(tpgs, rebuilt=True)
        self.discoveries += 1
        return self._discovery

    def _read_names(self, tpgs: list[LioTpg], rebuilt: bool) -> None:
        """The initiators' names (initiator_io.initiator_names()), here in the
        convergence's thread, not in the tick that asks for them. nvmet's debugfs is
        read again when the discovery was rebuilt (new connections) or the controllers
        listed changed."""
        ctrls = debugfs_controllers(self.debugfs_root)
        if rebuilt or ctrls != self._nvme_ctrls:
            self._nvme_ctrls = ctrls
            self._nvme_hosts = debugfs_hosts(ctrls)
        self._names = initiator_names(self._discovery, tpgs, self._nvme_hosts)

    def initiator_names(self) -> dict[str, tuple[str, ...]]:
        """address -> the IQNs / host NQNs it logged in with, as of the last discovery
        (initiator_io.initiator_names(): explicit ACLs, generated ACLs on a target one
        address uses, nvmet's debugfs when the kernel has it)."""
        return self._names

    def _snapshot(self) -> Snapshot:
        """The counters of the devices the discovery uses (of all before the first)."""
        snap = self.diskstats.snapshot(self._watched)
        if snap.malformed:
            self.warnings.malformed_diskstats_lines += len(snap.malformed)
            log.warning("diskstats: skipped %d malformed line(s)", len(snap.malformed))
        return snap

    def _devices(self, prev: Snapshot, cur: Snapshot, dt: float) -> dict[str, DevInterval]:
        res = interval(prev, cur, dt)
        self._gone(res.disappeared)
        return res.devices

    def _gone(self, names: Iterable[str]) -> None:
        """Devices of the last snapshot missing from this one: warned of, but for those
        a new discovery stopped watching."""
        watched = self._watched
        gone = [n for n in names if watched is None or n in watched]
        if gone:
            self.warnings.disappeared_devices.extend(gone)
            log.warning("diskstats: device(s) gone: %s", ", ".join(gone))

    # -- per tick ------------------------------------------------------
    def read_samples(self) -> list[ReadSample]:
        """Per resource: reads, their mean latency, the resource's write rate since last call."""
        now = self.clock()
        cur = self._snapshot()
        prev, self._tick_prev = self._tick_prev, (now, cur)
        if prev is None or self._discovery is None or now - prev[0] < MIN_INTERVAL_S:
            return []
        devs = self._devices(prev[1], cur, now - prev[0])
        if self._inflight_of != self.discoveries:  # here, in the tick's thread, which reads them
            self._inflight_of = self.discoveries
            self._close_inflight(d for m in self._discovery.resources.values() for d in m)
        out = []
        self._device_samples = []
        self._utilization = []
        for name, members in self._discovery.resources.items():
            ivs = [devs[d] for d in members if d in devs]
            reads, lat = read_latency_of(ivs)
            if not ivs:
                continue
            dev = device_sample_of(name, ivs)
            if dev is not None:
                self._device_samples.append(dev)
            pvs = [devs[d] for d in self._busy_devices.get(name, ()) if d in devs]
            self._utilization.append(utilization_of(name, pvs or ivs))
            pending = None if reads else self._reads_in_flight(members)
            out.append(ReadSample(name, reads, lat or 0.0, sum(i.write_bps for i in ivs), pending))
        return out

    def device_samples(self) -> list[DeviceSample]:
        """Per resource, of the last read_samples() pass: its devices' IOs, their mean
        latency and the mean IOs in flight (Pesto's L and Q, for threshold "auto")."""
        return self._device_samples

    def utilization_samples(self) -> list[UtilizationSample]:
        """Per resource, of the last read_samples() pass: the share of the interval
        with IO in flight (io_ticks, iostat's %util) of the busiest device its
        members sit on (busy_devices())."""
        return self._utilization

    def _reads_in_flight(self, devices: Iterable[str]) -> int | None:
        """Reads in flight (/sys/block/DEV/inflight: "reads writes"), read only for a
        resource without completed reads in the interval; the files kept open
        (keptfile.py) while their devices are in the discovery."""
        total = 0
        for d in devices:
            f = self._inflight.get(d)
            if f is None:
                f = self._inflight[d] = KeptFile(self.sys_root / "block" / d / "inflight")
            try:
                total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                return None
        return total

    def _close_inflight(self, keep: Iterable[str] = ()) -> None:
        """The inflight files of devices not in `keep` closed and forgotten."""
        keep = set(keep)
        for d in [d for d in self._inflight if d not in keep]:
            self._inflight.pop(d).close()

    # -- per convergence -----------------------------------------------
    def converge(self) -> tuple[Discovery, list[WriteSample]]:
        """Re-discover, then the write rates since the last convergence.

        Rates are over exact intervals: the diskstats part between the two
        snapshots used (the per-tick pass's, when at most snapshot_reuse_s
        old), the ACL part between the two discoveries' LIO scans.
        """
        d = self.discover()
        return d, self._write_samples(d)

    def _write_samples(self, d: Discovery) -> list[WriteSample]:
        """Per (resource, initiator): write rate since the last call (see discovery.py)."""
        now = self.clock()  # the ACL counters were read just now, by discover()
        tick = self._tick_prev  # (time, snapshot) of the last per-tick pass
        if tick is not None and 0.0 <= now - tick[0] <= self.snapshot_reuse_s:
            snap_t, cur = tick
        else:
            snap_t, cur = now, self._snapshot()
        acl_now = d.acl_write_bytes
        prev, self._conv_prev = self._conv_prev, (snap_t, cur, now, acl_now)
        acl_io_prev, self._acl_io_prev = self._acl_io_prev, self._acl_io
        self.io_samples = []
        if prev is None:
            return []
        if snap_t - prev[0] >= MIN_INTERVAL_S and acl_io_prev is not None:
            self.io_samples = self._io_samples(prev[1], cur, snap_t - prev[0], acl_io_prev)
            self.io_span_s = snap_t - prev[0]  # the time they cover
        out: list[WriteSample] = []
        if snap_t - prev[0] >= MIN_INTERVAL_S:  # device sources: between the two snapshots
            self._gone(name for name in prev[1].devices if name not in cur.devices)
            ch = self._charges
            bps_of = write_bps_of(prev[1], cur, snap_t - prev[0], ch.devices)
            dev_col, res_col, ini_col = ch.single
            if len(bps_of) == len(ch.devices):  # all have a rate: C loops, no call per pair
                bps_col = map(bps_of.__getitem__, dev_col)
                out.extend(map(_write_sample, zip(res_col, ini_col, bps_col, strict=True)))
            else:  # a device gone or re-created: its pairs get no sample
                got_col = map(bps_of.get, dev_col)
                out.extend(
                    _write_sample(s)
                    for s in zip(res_col, ini_col, got_col, strict=True)
                    if s[2] is not None
                )
            for pair, devs in ch.multi.items():  # charged by several devices: summed
                got = [bps_of[d] for d in devs if d in bps_of]
                if got:
                    out.append(_write_sample((*pair, sum(got))))
        if now - prev[2] >= MIN_INTERVAL_S:  # ACL counters: between the two discoveries
            dt = now - prev[2]
            for (ini, res), b in acl_now.items():
                old = prev[3].get((ini, res))
                if old is not None and b >= old:
                    out.append(_write_sample((res, ini, (b - old) / dt)))
        return out

    def want_io_samples(self, resources: Iterable[str]) -> None:
        """The resources whose IoSamples the next convergences make: the daemon's
        grouped resources. None asked (the default): no samples, nothing computed --
        10,000 initiators' samples cost about a third of a convergence (make bench)."""
        self.io_resources = frozenset(resources)

    def close(self) -> None:
        """The files it keeps open: diskstats, the devices' inflight (the rest is
        opened per read)."""
        if isinstance(self.diskstats, DiskstatsReader):
            self.diskstats.close()
        self._close_inflight()

    def _io_samples(
        self, prev: Snapshot, cur: Snapshot, dt: float, acl_prev: dict[AclKey, AclCount]
    ) -> list[IoSample]:
        """Per (resource, initiator), for initiator groups: the used devices' intervals
        between the two snapshots, the ACL counters between the two discoveries."""
        want = self.io_resources
        if not want:
            return []
        users = {dev: u for dev, u in self._io_plan.users.items() if u[0] in want}
        if not users:
            return []
        p, c = prev.devices, cur.devices
        devs = interval(
            Snapshot({n: p[n] for n in users if n in p}),
            Snapshot({n: c[n] for n in users if n in c}),
            dt,
        ).devices
        return io_samples(self._io_plan, devs, acl_deltas(acl_prev, self._acl_io), want)


def busy_devices(
    resources: Mapping[str, Iterable[str]], lvs: Mapping[str, LogicalVolume]
) -> dict[str, tuple[str, ...]]:
    """Per resource, the devices whose io_ticks say how busy it is: its LVs' PVs
    (each LV's sysfs slaves), a member that is no LV (or has no slaves) itself. Two
    tenants' LVs on one disk each count only their own IOs' time; the disk counts
    the time any of them had one in flight, which is how busy the array was: 40 %
    and 40 % that never overlap make 80 %."""
    out = {}
    for name, members in resources.items():
        devs: set[str] = set()
        for m in members:
            lv = lvs.get(m)
            devs.update(lv.slaves if lv is not None and lv.slaves else (m,))
        out[name] = tuple(sorted(devs))
    return out


def _watched(
    d: Discovery, busy: Mapping[str, Iterable[str]], ch: _Charges, plan: IoPlan
) -> frozenset[str]:
    """The devices whose diskstats the sensor parses: the resources' members, the
    devices that say how busy they are, those write rates are charged from, those
    initiator groups read."""
    return frozenset(
        [
            *(dev for members in d.resources.values() for dev in members),
            *(dev for devs in busy.values() for dev in devs),
            *ch.devices,
            *(dev for devs in ch.multi.values() for dev in devs),
            *plan.users,
        ]
    )


@dataclass
class _Charges:
    """Which device's diskstats write rate goes to which (resource, initiator) pair,
    computed once per discovery. Pairs with an exact ACL counter are left out
    (their rate comes from the counter)."""

    devices: tuple[str, ...] = ()
    # pairs charged by one device only, as three columns (device, resource,
    # initiator), a device's pairs next to each other
    single: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] = ((), (), ())
    # pair -> devices, for an initiator with several LUNs on one resource
    multi: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)


def _device_charges(d: Discovery) -> _Charges:
    res_of = d.resource_of_device()
    by_pair: dict[tuple[str, str], list[str]] = {}
    for dev, (who, _src) in d.device_writers.items():
        res = res_of.get(dev)
        if res is not None:
            for ini in who:
                if (ini, res) not in d.acl_write_bytes:
                    by_pair.setdefault((res, ini), []).append(dev)
    ch = _Charges()
    cols: dict[str, tuple[list[str], list[str]]] = {}
    for pair, devs in by_pair.items():
        if len(devs) == 1:
            rc, ic = cols.setdefault(devs[0], ([], []))
            rc.append(pair[0])
            ic.append(pair[1])
        else:
            ch.multi[pair] = tuple(devs)
    ch.single = (
        tuple(dev for dev, (rc, _) in cols.items() for _ in rc),
        tuple(r for rc, _ in cols.values() for r in rc),
        tuple(i for _, ic in cols.values() for i in ic),
    )
    ch.devices = tuple(sorted({dev for devs in by_pair.values() for dev in devs}))
    return ch
