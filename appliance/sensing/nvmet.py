"""nvmet (the kernel NVMe-oF target) from configfs: subsystems, namespaces, ports, hosts.

Layout (drivers/nvme/target/configfs.c), below <configfs>/nvmet:
    subsystems/<nqn>/attr_allow_any_host
    subsystems/<nqn>/allowed_hosts/<hostnqn>          (symlinks)
    subsystems/<nqn>/namespaces/<nsid>/device_path, enable
    ports/<id>/addr_trtype, addr_adrfam, addr_traddr, addr_trsvcid
    ports/<id>/subsystems/<nqn>                       (symlinks)
There is no python library for it beyond nvmetcli's private module, and the
tree is plain files; read it directly. nvmet's configfs keeps no host addresses:
connected hosts are the peers of established connections on the ports'
trsvcid (conns.py), mapped to subsystems through the port they connected to.

Host names per connection (debugfs_hosts()): kernels with nvmet's debugfs
(drivers/nvme/target/debugfs.c, "nvmet: add debugfs support", Linux 6.10;
CONFIG_NVME_TARGET_DEBUGFS; root only) show each controller, one per host
connection to a subsystem, below <debugfs>/nvmet:
    <subsystem nqn>/ctrl<cntlid>/hostnqn        the NQN the host connected with
    <subsystem nqn>/ctrl<cntlid>/host_traddr    its address ("%pISc": no port)
Without that tree (an older kernel, debugfs not mounted, not root) there are
no names: the groups match NVMe hosts by address only.

Errors: none. A file that cannot be read is empty text (a controller without
a host NQN and an address is left out), a directory that cannot
be listed has no entries, bytes that are not UTF-8 become U+FFFD; a namespace
directory whose name is not a number (ASCII digits) is left out, and a trsvcid
that is not a port number (0-65535, ASCII digits) is None. For example, a port
whose addr_trsvcid holds "٤٤٢٠" (Arabic-Indic digits, which int() would take):

    >>> [p.trsvcid for p in NvmetSensor(tree).ports()]
    [None]
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DEBUGFS = "/sys/kernel/debug"
_PORT_MAX = 65535
_NSID_DIGITS_MAX = 10  # an NSID is a 32-bit number
_NQN_CHARS_MAX = 223  # NVMF_NQN_SIZE


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


def _number(text: str, digits_max: int) -> int | None:
    """ASCII digits as an int (int() also takes "+1", "1_0", "٣"), None otherwise."""
    ok = text.isascii() and text.isdigit() and len(text) <= digits_max
    return int(text) if ok else None


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
            for name in _ls(base / "namespaces"):
                nsid = _number(name, _NSID_DIGITS_MAX)
                if nsid is None:
                    continue
                ns = base / "namespaces" / name
                nss.append(
                    NvmetNamespace(nsid, _read(ns / "device_path"), _read(ns / "enable") == "1")
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
            svc = _number(_read(base / "addr_trsvcid"), len(str(_PORT_MAX)))
            out.append(
                NvmetPort(
                    pid,
                    _read(base / "addr_trtype"),
                    _read(base / "addr_traddr"),
                    svc if svc is not None and svc <= _PORT_MAX else None,
                    tuple(_ls(base / "subsystems")),
                )
            )
        return out


def host_address(text: str) -> str | None:
    """A host_traddr as canonical address text ("10.0.0.31", "fd00::1"; an IPv4-mapped
    IPv6 address as IPv4, as conns.py gives peers), None if it is not an address. A
    port ("10.0.0.31:4420", "[fd00::1]:4420") is dropped."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def debugfs_controllers(debugfs_root: str | Path = DEFAULT_DEBUGFS) -> list[Path]:
    """Every <debugfs>/nvmet/<subsystem>/ctrl<N> directory (none without the tree)."""
    root = Path(debugfs_root) / "nvmet"
    return [
        root / sub / name
        for sub in _ls(root)
        for name in _ls(root / sub)
        if name.startswith("ctrl") and name[4:].isascii() and name[4:].isdigit()
    ]


def debugfs_hosts(controllers: list[Path]) -> dict[str, tuple[str, ...]]:
    """Host address -> the host NQNs its controllers connected with (sorted)."""
    out: dict[str, set[str]] = {}
    for ctrl in controllers:
        nqn = _read(ctrl / "hostnqn")
        addr = host_address(_read(ctrl / "host_traddr"))
        ok = nqn.isprintable() and " " not in nqn and len(nqn) <= _NQN_CHARS_MAX
        if addr is not None and nqn and ok:
            out.setdefault(addr, set()).add(nqn)
    return {a: tuple(sorted(n)) for a, n in out.items()}
