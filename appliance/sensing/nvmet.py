"""nvmet (the kernel NVMe-oF target) from configfs: subsystems, namespaces, ports, hosts.

Layout (drivers/nvme/target/configfs.c), below <configfs>/nvmet:
    subsystems/<nqn>/attr_allow_any_host
    subsystems/<nqn>/allowed_hosts/<hostnqn>          (symlinks)
    subsystems/<nqn>/namespaces/<nsid>/device_path, enable
    ports/<id>/addr_trtype, addr_adrfam, addr_traddr, addr_trsvcid
    ports/<id>/subsystems/<nqn>                       (symlinks)
There is no python library for it beyond nvmetcli's private module, and the
tree is plain files; read it directly. nvmet keeps no host addresses:
connected hosts are the peers of established connections on the ports'
trsvcid (conns.py), mapped to subsystems through the port they connected to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class NvmetNamespace:
    nsid: int
    device_path: str
    enabled: bool


@dataclass(frozen=True, slots=True)
class NvmetSubsystem:
    nqn: str
    allow_any_host: bool
    allowed_hosts: tuple[str, ...]
    namespaces: tuple[NvmetNamespace, ...]


@dataclass(frozen=True, slots=True)
class NvmetPort:
    port_id: str
    trtype: str
    traddr: str
    trsvcid: int | None
    subsystems: tuple[str, ...]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _ls(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


class NvmetSensor:
    def __init__(self, configfs_root: str | Path = "/sys/kernel/config") -> None:
        self.root = Path(configfs_root) / "nvmet"

    def subsystems(self) -> list[NvmetSubsystem]:
        out = []
        for nqn in _ls(self.root / "subsystems"):
            base = self.root / "subsystems" / nqn
            nss = []
            for nsid in _ls(base / "namespaces"):
                if not nsid.isdigit():
                    continue
                ns = base / "namespaces" / nsid
                nss.append(
                    NvmetNamespace(
                        int(nsid), _read(ns / "device_path"), _read(ns / "enable") == "1"
                    )
                )
            out.append(
                NvmetSubsystem(
                    nqn,
                    _read(base / "attr_allow_any_host") == "1",
                    tuple(_ls(base / "allowed_hosts")),
                    tuple(nss),
                )
            )
        return out

    def ports(self) -> list[NvmetPort]:
        out = []
        for pid in _ls(self.root / "ports"):
            base = self.root / "ports" / pid
            svc = _read(base / "addr_trsvcid")
            out.append(
                NvmetPort(
                    pid,
                    _read(base / "addr_trtype"),
                    _read(base / "addr_traddr"),
                    int(svc) if svc.isdigit() else None,
                    tuple(_ls(base / "subsystems")),
                )
            )
        return out
