"""Block devices -> LVM volume groups, from sysfs only (no subprocess, no udev).

For every /sys/block/dm-N: `dm/uuid` starts with "LVM-" for a logical
volume, `dm/name` is "<vg>-<lv>" with every "-" inside a name doubled
(device-mapper's escaping), `slaves/` lists the devices below it (the PVs),
`dev` is "major:minor". A VG's member devices are its LVs' dm devices: the
paper measures the consumers (the LVs), and only those that had reads.

A resource can also be declared in config as any set of block devices
(appliance config); this module only discovers the LVM ones.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_DM_NAME = re.compile(r"^((?:[^-]|--)+)-((?:[^-]|--)+)$")


def split_dm_name(dm_name: str) -> tuple[str, str] | None:
    """ "vg--a-lv--1" -> ("vg-a", "lv-1"); None if it is not "<vg>-<lv>"."""
    m = _DM_NAME.match(dm_name)
    if m is None:
        return None
    return m.group(1).replace("--", "-"), m.group(2).replace("--", "-")


@dataclass(frozen=True, slots=True)
class LogicalVolume:
    device: str  # kernel name, e.g. "dm-3" (the name in /proc/diskstats)
    vg: str
    lv: str
    major_minor: str
    slaves: tuple[str, ...]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None  # gone between listdir and read: a device removed mid-scan


def scan_lvm(sys_root: str | Path = "/sys") -> dict[str, LogicalVolume]:
    """Kernel device name -> LogicalVolume for every LVM LV the kernel has."""
    block = Path(sys_root) / "block"
    out: dict[str, LogicalVolume] = {}
    try:
        names = sorted(os.listdir(block))
    except OSError:
        return out
    for dev in names:
        if not dev.startswith("dm-"):
            continue
        base = block / dev
        uuid = _read(base / "dm" / "uuid")
        name = _read(base / "dm" / "name")
        if not uuid or not name or not uuid.startswith("LVM-"):
            continue
        parts = split_dm_name(name)
        if parts is None:
            continue
        try:
            slaves = tuple(sorted(os.listdir(base / "slaves")))
        except OSError:
            slaves = ()
        out[dev] = LogicalVolume(dev, parts[0], parts[1], _read(base / "dev") or "", slaves)
    return out


def volume_groups(lvs: dict[str, LogicalVolume]) -> dict[str, list[str]]:
    """VG -> its LVs' kernel device names (the resource's members)."""
    vgs: dict[str, list[str]] = {}
    for lv in lvs.values():
        vgs.setdefault(lv.vg, []).append(lv.device)
    return {vg: sorted(devs) for vg, devs in sorted(vgs.items())}


def resolve_device_path(
    path: str, lvs: dict[str, LogicalVolume], dev_root: str | Path = "/dev"
) -> str | None:
    """A backstore's udev_path -> kernel device name ("dm-3", "sdb"), or None.

    Understands /dev/<vg>/<lv>, /dev/mapper/<vg>-<lv> and /dev/dm-N by name
    (so captured trees resolve without their /dev), then falls back to
    following the symlink under dev_root.
    """
    by_vg_lv = {(lv.vg, lv.lv): lv.device for lv in lvs.values()}
    p = Path(path)
    parts = p.parts
    if len(parts) == 4 and parts[:2] == ("/", "dev") and parts[2] != "mapper":
        dev = by_vg_lv.get((parts[2], parts[3]))
        if dev:
            return dev
    if len(parts) == 4 and parts[:3] == ("/", "dev", "mapper"):
        vg_lv = split_dm_name(parts[3])
        if vg_lv and vg_lv in by_vg_lv:
            return by_vg_lv[vg_lv]
    if len(parts) == 3 and parts[:2] == ("/", "dev"):
        return parts[2]
    root = Path(dev_root)
    try:
        rel = p.relative_to("/dev")
    except ValueError:
        return None
    try:
        real = os.path.realpath(root / rel)
    except OSError:
        return None
    name = os.path.basename(real)
    return name if os.path.dirname(real) == os.path.realpath(root) else None
