"""LIO targets through rtslib-fb: TPGs, portals, LUNs -> backstores, ACL sessions.

rtslib-fb's RTSRoot() mounts configfs and modprobes target_core_mod in its
constructor, so the one RTSRoot of the process is created lazily, here, on
the first scan. For tests and captured trees, `configfs_root` points
rtslib at another directory (rtslib reads everything below
CFSNode.configfs_dir); then nothing is mounted or loaded.

Initiator addresses: with explicit ACLs, from NodeACL.session (the
connections' addresses in the ACL's `info`). With generate_node_acls=1 (no
ACLs, the common lab/demo setup) LIO keeps no addresses: the caller takes
the peers of established connections on the portal ports (conns.py).

Per-initiator write counters: with explicit ACLs, LIO counts per mapped
LUN in acls/<initiator>/lun_<n>/statistics/scsi_auth_intr/write_mbytes
(MiB, so a 1 s rate has a 1 MiB/s resolution). Without ACLs there are
none: discovery.py then uses the LUN's block device when one initiator has
that LUN (docs/sensing.md, "Write-rate sources").
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_CONFIGFS = "/sys/kernel/config"
MIB = 1024 * 1024


class LioUnavailable(RuntimeError):
    """LIO cannot be read (no configfs/target_core_mod, no rtslib-fb)."""


@dataclass(frozen=True, slots=True)
class LioLun:
    lun: int
    backstore: str  # "block/lun0"
    udev_path: str  # "/dev/labvg/lun0"


@dataclass(frozen=True, slots=True)
class LioAcl:
    initiator: str  # node WWN (IQN)
    addresses: tuple[str, ...]  # from the active session, if any
    mapped_luns: tuple[int, ...]  # TPG LUN numbers this ACL sees
    # tpg lun -> bytes (MiB res.): a counter, not part of the ACL's identity (equal
    # ACLs with other counts are the same configuration: discovery's change test)
    write_bytes: dict[int, int] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class LioTpg:
    fabric: str
    wwn: str
    tag: int
    enabled: bool
    generate_node_acls: bool
    portals: tuple[tuple[str, int], ...]
    luns: tuple[LioLun, ...]
    acls: tuple[LioAcl, ...]


@contextlib.contextmanager
def _rtslib_at(configfs_root: str) -> Iterator[Any]:
    try:
        import rtslib_fb
        from rtslib_fb import node as rts_node
    except ImportError as e:  # pragma: no cover - a packaging error
        raise LioUnavailable(f"rtslib-fb is not installed: {e}") from None
    if configfs_root == DEFAULT_CONFIGFS:
        yield rtslib_fb
        return
    saved = rts_node.CFSNode.configfs_dir
    rts_node.CFSNode.configfs_dir = f"{configfs_root}/target"
    try:
        yield rtslib_fb
    finally:
        rts_node.CFSNode.configfs_dir = saved


def _int_file(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class LioSensor:
    """Reads the LIO configuration; every path a parameter."""

    def __init__(self, configfs_root: str | Path = DEFAULT_CONFIGFS) -> None:
        # absolute: rtslib resolves configfs symlinks and compares real paths
        self.configfs_root = os.path.abspath(configfs_root)
        self._root: Any = None
        self._warned = False

    def _rts_root(self, rtslib: Any) -> Any:
        if self._root is None:
            if self.configfs_root == DEFAULT_CONFIGFS:
                try:
                    self._root = rtslib.RTSRoot()  # mounts configfs, modprobes
                except Exception as e:  # rtslib raises RTSLibError and OSErrors
                    raise LioUnavailable(f"LIO is not available: {e}") from None
            else:
                root = object.__new__(rtslib.RTSRoot)  # a captured tree: no mount
                rtslib.node.CFSNode.__init__(root)
                self._root = root
        return self._root

    def scan(self) -> list[LioTpg]:
        if not Path(self.configfs_root, "target").is_dir():
            if not self._warned and not Path(self.configfs_root).is_dir():
                self._warned = True
                log.warning(
                    "%s is not mounted: LIO and nvmet are invisible (`ip netns exec` remounts "
                    "/sys without configfs: use daemon.netns instead)",
                    self.configfs_root,
                )
            return []  # no LIO on this host (or module not loaded): nothing to see
        with _rtslib_at(self.configfs_root) as rtslib:
            root = self._rts_root(rtslib)
            try:
                return [self._tpg(t) for tgt in root.targets for t in tgt.tpgs]
            except (OSError, rtslib.utils.RTSLibError) as e:  # changed while we walked it
                raise LioUnavailable(f"LIO tree changed during the scan: {e}") from None

    @staticmethod
    def _tpg(tpg: Any) -> LioTpg:
        tgt = tpg.parent_target
        luns = []
        for lun in tpg.luns:
            so = lun.storage_object
            luns.append(LioLun(lun.lun, f"{so.plugin}/{so.name}", so.udev_path or ""))
        acls = []
        for acl in tpg.node_acls:
            sess = acl.session or {}
            addrs = tuple(
                c["address"].rsplit(":", 1)[0] if c["address"].count(":") == 1 else c["address"]
                for c in sess.get("connections", [])
                if c.get("address")
            )
            mapped = []
            wbytes: dict[int, int] = {}
            for m in acl.mapped_luns:
                tpg_lun = m.tpg_lun.lun
                mapped.append(tpg_lun)
                mib = _int_file(Path(m.path, "statistics", "scsi_auth_intr", "write_mbytes"))
                if mib is not None:
                    wbytes[tpg_lun] = mib * MIB
            acls.append(LioAcl(acl.node_wwn, addrs, tuple(mapped), wbytes))
        try:
            gen = tpg.get_attribute("generate_node_acls") == "1"
        except Exception:  # attribute missing in an older kernel or a partial tree
            gen = False
        return LioTpg(
            fabric=tgt.fabric_module.name,
            wwn=tgt.wwn,
            tag=tpg.tag,
            enabled=bool(tpg.enable),
            generate_node_acls=gen,
            portals=tuple((p.ip_address, p.port) for p in tpg.network_portals),
            luns=tuple(luns),
            acls=tuple(acls),
        )
