"""Who loads what: exports (LUNs, namespaces) -> devices -> resources, initiators -> resources.

build_discovery() is pure: it takes what the adapters read (LIO TPGs, nvmet
subsystems and ports, established connections, the LVM map, resources
declared in config, static maps) and returns one Discovery. The daemon
refreshes it every second.

Matching a connection to an export
    iSCSI: the connection's local address and port match a TPG's portal
    (a wildcard portal 0.0.0.0 / :: matches any local address). Explicit
    ACL sessions name their initiator's address directly.
    NVMe/TCP: the local address and port match an nvmet port; the port's
    subsystems are what the host can reach.
    A connection that matches portals of several targets (one wildcard
    portal in front of many targets, with generated ACLs) cannot be placed
    from the kernel's state: it is reported as ambiguous and left to the
    static map.

Write-rate sources, per (initiator, resource) (docs/sensing.md)
    "acl"    LIO per-ACL mapped-LUN statistics (explicit ACLs only)
    "device" the LUN's block device in diskstats, when exactly one
             initiator is connected to that LUN
    "shared" the LUN's block device when several initiators share it: each
             is charged the whole device's writes (conservative: any of them
             may be the writer)
    "static" a static map entry: the resource is known but no per-initiator
             counter is; no write rate (it never joins a write-heavy set by
             itself, but pin works)

Errors: build_discovery() raises nothing on what the adapters read: an address
or portal that does not parse matches nothing, a path that does not resolve has
no device. The static map is validated by the configuration's parser; an entry
that is not a network is left out here. For example, an ACL session address
"garbage" is an initiator without resources, and the static map skips it:

    >>> acl = LioAcl("iqn.x:ini", ("garbage",), (0,))
    >>> tpg = LioTpg("iscsi", "iqn.x:tgt", 1, True, False, (), (), (acl,))
    >>> d = build_discovery(lio=[tpg], static_map={"10.0.0.0/24": ["vg0"]})
    >>> d.initiators["garbage"].resources
    set()
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from santhrottle.appliance.sensing.blockdevs import (
    LogicalVolume,
    lv_index,
    resolve_device_path,
    volume_groups,
)
from santhrottle.appliance.sensing.conns import TcpConn
from santhrottle.appliance.sensing.lio import LioTpg
from santhrottle.appliance.sensing.nvmet import NvmetPort, NvmetSubsystem

WILDCARDS = {"0.0.0.0", "::", "[::]", ""}


@dataclass(frozen=True, slots=True)
class Export:
    protocol: str  # "iscsi" | "nvme-tcp"
    target: str  # IQN or subsystem NQN
    lun: int  # LUN number or NSID
    device: str | None  # kernel block device name ("dm-3")
    resource: str | None


@dataclass
class InitiatorView:
    address: str
    names: set[str] = field(default_factory=set)  # IQNs from ACL sessions
    exports: list[Export] = field(default_factory=list)
    resources: set[str] = field(default_factory=set)
    write_sources: dict[str, str] = field(default_factory=dict)  # resource -> source


@dataclass
class Discovery:
    resources: dict[str, tuple[str, ...]]  # resource -> member devices
    exports: list[Export]
    initiators: dict[str, InitiatorView]
    # device -> initiators charged with its writes, and how
    device_writers: dict[str, tuple[tuple[str, ...], str]]
    # (initiator, resource) -> {tpg lun device: ACL write bytes}
    acl_write_bytes: dict[tuple[str, str], int]
    ambiguous: list[str]  # connections that could not be placed

    def resource_of_device(self) -> dict[str, str]:
        return {d: r for r, devs in self.resources.items() for d in devs}


def _canon(ip: str) -> str | None:
    """Canonical address text, "*" for a wildcard, None if unparsable."""
    ip = ip.strip("[]")
    if ip in WILDCARDS:
        return "*"
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class _PortalIndex:
    """(local address, port) -> entries, wildcard portals per port: O(1) per connection."""

    def __init__(self) -> None:
        self._exact: dict[tuple[str, int | None], list[int]] = {}

    def add(self, ip: str, port: int | None, entry: int) -> None:
        key = _canon(ip)
        if key is not None:
            self._exact.setdefault((key, port), []).append(entry)

    def match(self, conn: TcpConn) -> list[int]:
        out: list[int] = []
        for key in (
            (conn.local_ip, conn.local_port),
            ("*", conn.local_port),
            (conn.local_ip, None),
            ("*", None),
        ):
            out.extend(self._exact.get(key, ()))
        return out


def acl_write_bytes(
    tpgs: Iterable[LioTpg], exports: Iterable[Export]
) -> dict[tuple[str, str], int]:
    """(initiator address, resource) -> bytes written, from LIO's per-ACL LUN counters."""
    out: dict[tuple[str, str], int] = {}
    tpgs = [t for t in tpgs if t.acls]  # every second: mostly none (generated ACLs)
    if not tpgs:
        return out
    res = {(e.target, e.lun): e.resource for e in exports if e.protocol == "iscsi"}
    for t in tpgs:
        for acl in t.acls:
            for n, b in acl.write_bytes.items():
                r = res.get((t.wwn, n))
                if r:
                    for addr in acl.addresses:
                        out[(addr, r)] = out.get((addr, r), 0) + b
    return out


def build_discovery(
    *,
    lio: Iterable[LioTpg] = (),
    nvmet_subsystems: Iterable[NvmetSubsystem] = (),
    nvmet_ports: Iterable[NvmetPort] = (),
    conns: Iterable[TcpConn] = (),
    lvs: Mapping[str, LogicalVolume] | None = None,
    declared: Mapping[str, Iterable[str]] | None = None,
    static_map: Mapping[str, Iterable[str]] | None = None,
    dev_root: str = "/dev",
) -> Discovery:
    lvs = dict(lvs or {})
    resources: dict[str, tuple[str, ...]] = {
        vg: tuple(devs) for vg, devs in volume_groups(lvs).items()
    }
    for name, devs in (declared or {}).items():  # config wins over LVM
        resources[name] = tuple(sorted(devs))
    res_of = {d: r for r, devs in resources.items() for d in devs}
    by_vg_lv = lv_index(lvs)

    def export(proto: str, target: str, lun: int, path: str) -> Export:
        dev = resolve_device_path(path, by_vg_lv, dev_root) if path else None
        return Export(proto, target, lun, dev, res_of.get(dev) if dev else None)

    initiators: dict[str, InitiatorView] = {}
    exports: list[Export] = []
    ambiguous: list[str] = []
    # export -> initiators connected to it
    users: dict[Export, set[str]] = {}

    def view(addr: str) -> InitiatorView:
        v = initiators.get(addr)
        if v is None:
            v = initiators[addr] = InitiatorView(addr)
        return v

    def attach(addr: str, ex: Export) -> None:
        v = view(addr)
        who = users.setdefault(ex, set())
        if addr not in who:
            who.add(addr)
            v.exports.append(ex)
        if ex.resource:
            v.resources.add(ex.resource)

    conns = list(conns)
    tpgs = list(lio)
    tpg_exports: list[list[Export]] = []
    for t in tpgs:
        exs = [export("iscsi", t.wwn, lun.lun, lun.udev_path) for lun in t.luns]
        tpg_exports.append(exs)
        exports.extend(exs)
        by_lun = {e.lun: e for e in exs}
        for acl in t.acls:
            for addr in acl.addresses:
                view(addr).names.add(acl.initiator)
                for n in acl.mapped_luns:
                    if n in by_lun:
                        attach(addr, by_lun[n])
    acl_addrs = {a for t in tpgs for acl in t.acls for a in acl.addresses}
    acl_bytes = acl_write_bytes(tpgs, exports)

    subsys = {s.nqn: s for s in nvmet_subsystems}
    nv_exports = {
        s.nqn: [export("nvme-tcp", s.nqn, ns.nsid, ns.device_path) for ns in s.namespaces]
        for s in subsys.values()
    }
    for exs in nv_exports.values():
        exports.extend(exs)
    ports = [p for p in nvmet_ports if p.trtype in ("tcp", "")]
    iscsi_index = _PortalIndex()
    for i, t in enumerate(tpgs):
        if t.generate_node_acls:
            for ip, port in t.portals:
                iscsi_index.add(ip, port, i)
    nvme_index = _PortalIndex()
    for i, p in enumerate(ports):
        nvme_index.add(p.traddr, p.trsvcid, i)

    for c in conns:
        if c.peer_ip in acl_addrs:
            continue  # placed by its ACL session
        iscsi = iscsi_index.match(c)
        nvme = [ports[i] for i in nvme_index.match(c)]
        targets = {tpgs[i].wwn for i in iscsi} | {n for p in nvme for n in p.subsystems}
        if len(targets) > 1:
            ambiguous.append(
                f"{c.peer_ip} -> {c.local_ip}:{c.local_port} matches {len(targets)} targets"
            )
            view(c.peer_ip)
            continue
        for i in iscsi:
            for ex in tpg_exports[i]:
                attach(c.peer_ip, ex)
        for p in nvme:
            for nqn in p.subsystems:
                for ex in nv_exports.get(nqn, []):
                    attach(c.peer_ip, ex)

    parsed: dict[str, ipaddress.IPv4Address | ipaddress.IPv6Address | None] = {}

    def ip_of(addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        if addr not in parsed:
            parsed[addr] = _address(addr)
        return parsed[addr]

    for spec, res_names in (static_map or {}).items():
        try:
            net = ipaddress.ip_network(spec, strict=False)
        except (TypeError, ValueError):  # the config's parser refuses it: not here
            continue
        addrs = [a for a in initiators if (ip := ip_of(a)) is not None and ip in net]
        if net.num_addresses == 1:
            addrs = addrs or [str(net.network_address)]
        for a in addrs:
            v = view(a)
            for r in res_names:
                if r not in v.resources:
                    v.resources.add(r)
                    v.write_sources.setdefault(r, "static")

    device_writers: dict[str, tuple[tuple[str, ...], str]] = {}
    for ex, addrs in users.items():
        if not ex.device:
            continue
        who = tuple(sorted(addrs))
        device_writers[ex.device] = (who, "device" if len(who) == 1 else "shared")
    for addr, v in initiators.items():
        for ex in v.exports:
            if ex.resource and ex.device:
                src = "acl" if (addr, ex.resource) in acl_bytes else device_writers[ex.device][1]
                if v.write_sources.get(ex.resource) != "acl":
                    v.write_sources[ex.resource] = src
    return Discovery(resources, exports, initiators, device_writers, acl_bytes, ambiguous)
