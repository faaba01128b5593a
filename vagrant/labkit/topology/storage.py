"""The lab topology's storage: the disks, the null_blk array, the VG and its LVs.

What it owns
    find_disk(serial): a virtio disk by the serial lab.py gave it (lab-slow, lab-fast,
    lab-array); the null_blk "array" (memory-backed, a bandwidth cap and a small
    hardware queue shared by reads and writes); the VG `labvg` and one LV per initiator
    (LVM without udev: DM_DISABLE_UDEV, lvcreate -W n -Z n); an LV's dm-N, the name
    diskstats knows it by; load_modules().

Worked example
    setup_lvm("/dev/vdc", ["lun0", "lun1"], 1536) -> {"lun0": "/dev/labvg/lun0", ...};
    dm_name("/dev/labvg/lun0") -> "dm-0"
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from labkit.topology.names import LVM_ENV, VG, TopologyError, _read, sh

# The null_blk "array": memory-backed, a bandwidth cap (mbps) and a small
# hardware queue shared by reads and writes, so a small reader waits behind the
# writers' queue as it would on a saturated array (QEMU's throttle serves reads
# and writes from separate queues and shields the reader; docs/lab.md).
NULLB = Path("/sys/kernel/config/nullb/nullb0")
LVM_NULLB = [
    "--config",
    'devices { types = [ "nullb", 16 ] }',
]  # LVM ignores nullb otherwise


def setup_nullb(size_mib: int, mbps: int, queue_depth: int) -> str:
    sh(["modprobe", "null_blk", "nr_devices=0"])
    NULLB.mkdir()
    for key, val in (
        ("size", size_mib),
        ("memory_backed", 1),
        ("blocksize", 4096),
        ("queue_mode", 2),  # blk-mq
        ("hw_queue_depth", queue_depth),
        ("mbps", mbps),
        ("irqmode", 0),
        ("power", 1),
    ):
        (NULLB / key).write_text(str(val))
    return "/dev/nullb0"


def teardown_nullb() -> None:
    if NULLB.is_dir():
        (NULLB / "power").write_text("0")
        NULLB.rmdir()


def find_disk(serial: str) -> str:
    for d in sorted(glob.glob("/sys/block/vd*")):
        if _read(f"{d}/serial") == serial:
            return f"/dev/{os.path.basename(d)}"
    raise TopologyError(f"no virtio disk with serial {serial}")


def load_modules(names) -> None:
    sh(["modprobe", "-a", *names])


# ---------------------------------------------------------------------- LVM
def setup_lvm(disk: str, names: list[str], size_mib: int) -> dict[str, str]:
    sh(["vgcreate", "-qq", "-y", *LVM_NULLB, VG, disk], env=LVM_ENV)
    out = {}
    for name in names:
        sh(
            [
                "lvcreate",
                "-qq",
                *LVM_NULLB,
                "-W",
                "n",
                "-Z",
                "n",
                "-y",
                "-L",
                f"{size_mib}m",
                "-n",
                name,
                VG,
            ],
            env=LVM_ENV,
        )
        out[name] = f"/dev/{VG}/{name}"
    return out


def teardown_lvm() -> None:
    if sh(["vgs", *LVM_NULLB, VG], env=LVM_ENV, check=False).find(VG) < 0:
        return
    sh(["vgremove", "-qq", "-f", "-y", *LVM_NULLB, VG], env=LVM_ENV, check=False)
    pvs = sh(["pvs", *LVM_NULLB, "--noheadings", "-o", "pv_name"], env=LVM_ENV, check=False)
    for pv in pvs.split():
        sh(["pvremove", "-qq", "-y", *LVM_NULLB, pv], env=LVM_ENV, check=False)


def dm_name(lv_path: str) -> str:
    """dm-N of an LV: the name diskstats knows it by."""
    rdev = os.stat(lv_path).st_rdev
    return os.path.basename(os.path.realpath(f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}"))
