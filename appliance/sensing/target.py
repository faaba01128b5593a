"""The target-host sensor: discovery every second, samples for the controller.

TargetSensor wires the adapters (diskstats, sysfs LVM map, LIO through
rtslib-fb, nvmet configfs, sock_diag) and turns counter deltas into the
controller's ReadSample (per resource, every tick) and WriteSample (per
resource and initiator, every convergence). Every path and the netns are
constructor parameters; `clock` is only used to timestamp snapshots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from santhrottle.controller.domain import ReadSample, WriteSample

from .blockdevs import LvmScanner
from .conns import ConnectionSensor
from .discovery import Discovery, acl_write_bytes, build_discovery
from .diskstats import DevInterval, DiskstatsReader, Snapshot, interval, read_latency_of
from .lio import LioSensor, LioUnavailable
from .nvmet import NvmetSensor

log = logging.getLogger(__name__)

ISCSI_PORT = 3260
NVME_TCP_PORT = 4420


@dataclass
class SensorWarnings:
    malformed_diskstats_lines: int = 0
    disappeared_devices: list[str] = field(default_factory=list)
    lio_errors: int = 0


class TargetSensor:
    def __init__(
        self,
        *,
        proc_root: str | Path = "/proc",
        sys_root: str | Path = "/sys",
        configfs_root: str | Path = "/sys/kernel/config",
        dev_root: str | Path = "/dev",
        ports: Iterable[int] = (ISCSI_PORT, NVME_TCP_PORT),
        netns: str | None = None,
        declared: Mapping[str, Iterable[str]] | None = None,
        static_map: Mapping[str, Iterable[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        connections: ConnectionSensor | None = None,
    ) -> None:
        self.sys_root = Path(sys_root)
        self.lvm = LvmScanner(sys_root, clock=clock)
        self.dev_root = str(dev_root)
        self.diskstats = DiskstatsReader(proc_root)
        self.lio = LioSensor(configfs_root)
        self.nvmet = NvmetSensor(configfs_root)
        self.conns = connections or ConnectionSensor(ports, netns)
        self.declared = {k: tuple(v) for k, v in (declared or {}).items()}
        self.static_map = {k: tuple(v) for k, v in (static_map or {}).items()}
        self.clock = clock
        self.warnings = SensorWarnings()
        self.discovery: Discovery | None = None
        self._discovery_key: object = None
        self._tick_prev: tuple[float, Snapshot] | None = None
        self._conv_prev: tuple[float, Snapshot, dict[tuple[str, str], int]] | None = None

    # -- discovery (every second) --------------------------------------
    def discover(self) -> Discovery:
        try:
            tpgs = self.lio.scan()
        except LioUnavailable as e:
            self.warnings.lio_errors += 1
            log.warning("LIO: %s", e)
            tpgs = []
        subsystems = self.nvmet.subsystems()
        ports = self.nvmet.ports()
        conns = self.conns.connections()
        lvs = self.lvm.scan()
        # The structure rarely changes; the ACL counters do, every second.
        key = (
            tuple(replace(t, acls=tuple(replace(a, write_bytes={}) for a in t.acls)) for t in tpgs),
            tuple(subsystems),
            tuple(ports),
            frozenset(conns),
            id(lvs),
        )
        if self.discovery is not None and key == self._discovery_key:
            self.discovery = replace(
                self.discovery,
                acl_write_bytes=acl_write_bytes(tpgs, self.discovery.exports),
            )
            return self.discovery
        self.discovery = build_discovery(
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
        return self.discovery

    def _snapshot(self) -> Snapshot:
        snap = self.diskstats.snapshot()
        if snap.malformed:
            self.warnings.malformed_diskstats_lines += len(snap.malformed)
            log.warning("diskstats: skipped %d malformed line(s)", len(snap.malformed))
        return snap

    def _devices(self, prev: Snapshot, cur: Snapshot, dt: float) -> dict[str, DevInterval]:
        res = interval(prev, cur, dt)
        if res.disappeared:
            self.warnings.disappeared_devices.extend(res.disappeared)
            log.warning("diskstats: device(s) gone: %s", ", ".join(res.disappeared))
        return res.devices

    # -- per tick ------------------------------------------------------
    def read_samples(self) -> list[ReadSample]:
        """Per resource: reads, their mean latency, the resource's write rate since last call."""
        now = self.clock()
        cur = self._snapshot()
        prev, self._tick_prev = self._tick_prev, (now, cur)
        if prev is None or self.discovery is None or now <= prev[0]:
            return []
        devs = self._devices(prev[1], cur, now - prev[0])
        out = []
        for name, members in self.discovery.resources.items():
            ivs = [devs[d] for d in members if d in devs]
            reads, lat = read_latency_of(ivs)
            if not ivs:
                continue
            pending = None if reads else self._reads_in_flight(members)
            out.append(ReadSample(name, reads, lat or 0.0, sum(i.write_bps for i in ivs), pending))
        return out

    def _reads_in_flight(self, devices: Iterable[str]) -> int | None:
        """Reads in flight (/sys/block/DEV/inflight: "reads writes"), read only for a
        resource without completed reads in the interval."""
        total = 0
        for d in devices:
            try:
                total += int((self.sys_root / "block" / d / "inflight").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                return None
        return total

    # -- per convergence -----------------------------------------------
    def converge(self) -> tuple[Discovery, list[WriteSample]]:
        """Re-discover, then the write rates since the last convergence.

        One call so that the ACL counters (read by the discovery's LIO scan)
        and the diskstats snapshot are taken at the same moment.
        """
        d = self.discover()
        return d, self._write_samples(d)

    def _write_samples(self, d: Discovery) -> list[WriteSample]:
        """Per (resource, initiator): write rate since the last call (see discovery.py)."""
        now = self.clock()
        cur = self._snapshot()
        acl_now = dict(d.acl_write_bytes)
        prev, self._conv_prev = self._conv_prev, (now, cur, acl_now)
        if prev is None or now <= prev[0]:
            return []
        dt = now - prev[0]
        devs = self._devices(prev[1], cur, dt)
        res_of = d.resource_of_device()
        rates: dict[tuple[str, str], float] = {}
        for dev, (who, _src) in d.device_writers.items():
            iv = devs.get(dev)
            res = res_of.get(dev)
            if iv is None or res is None:
                continue
            for ini in who:
                if (ini, res) in acl_now:
                    continue  # the ACL counter is exact for this initiator
                rates[(res, ini)] = rates.get((res, ini), 0.0) + iv.write_bps
        for (ini, res), b in acl_now.items():
            old = prev[2].get((ini, res))
            if old is not None and b >= old:
                rates[(res, ini)] = rates.get((res, ini), 0.0) + (b - old) / dt
        return [WriteSample(r, i, bps) for (r, i), bps in rates.items()]
