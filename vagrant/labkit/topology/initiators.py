"""The lab topology's initiator hosts: iscsid, the iSCSI logins, the NVMe/TCP connects.

What it owns
    The kernel iSCSI initiator works only in the initial namespace (NETLINK_ISCSI), so
    every initiator lives there, told apart by its source address: one open-iscsi iface
    per initiator (its IQN), one node record per target portal, the logins and each
    session's block device; the NVMe/TCP hosts (nvme connect with their own host NQN,
    host id and source address) and their block devices.  Each stores what it found in
    the topology's state (names.store).

Worked example
    iscsi_login(t["iscsi"]) -> each entry gains "sid", "device" ("/dev/sdb") and
    "session_initiator"; iscsi_sessions() -> [{"sid": 1, "targetname": ..., "state":
    "LOGGED_IN", "devices": ["/dev/sdb"], ...}, ...]
"""

from __future__ import annotations

import glob
import os
import subprocess
import time
from pathlib import Path

from labkit import speed
from labkit.topology.names import (
    DEVICE_WAIT_S,
    IQN_BASE,
    ISCSI_PORT,
    NVME_PORT,
    TopologyError,
    _read,
    _running,
    hostport,
    sh,
    store,
)


# --------------------------------------------------------- initiator side
def start_iscsid() -> None:
    name = f"{IQN_BASE}:host"
    Path("/etc/iscsi").mkdir(parents=True, exist_ok=True)
    Path("/etc/iscsi/initiatorname.iscsi").write_text(f"InitiatorName={name}\n")
    Path("/run/lock/iscsi").mkdir(parents=True, exist_ok=True)
    if _running("iscsid"):
        return
    # iscsid daemonizes; its output must not hold the caller's pipes open
    subprocess.run(
        ["iscsid"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    deadline = time.monotonic() + speed.budget(10)
    while True:
        p = subprocess.run(["iscsiadm", "-m", "session"], capture_output=True, text=True)
        # 0: sessions listed; 21: "No active sessions" -- either way iscsid answered
        if p.returncode in (0, 21):
            return
        if time.monotonic() > deadline:
            raise TopologyError(f"iscsid does not answer: {p.stdout}{p.stderr}")
        time.sleep(0.1)


def stop_iscsid() -> None:
    if _running("iscsid"):
        sh(["iscsiadm", "-k", "0"], check=False)


def iscsi_add_nodes(luns: list[dict]) -> None:
    for t in luns:
        iface = t["iface"]
        sh(["iscsiadm", "-m", "iface", "-I", iface, "-o", "new"])
        sh(
            [
                "iscsiadm",
                "-m",
                "iface",
                "-I",
                iface,
                "-o",
                "update",
                "-n",
                "iface.initiatorname",
                "-v",
                t["initiator_iqn"],
            ]
        )
        sh(
            [
                "iscsiadm",
                "-m",
                "node",
                "-o",
                "new",
                "-T",
                t["iqn"],
                "-p",
                hostport(t["portal"], ISCSI_PORT),
                "-I",
                iface,
            ]
        )


def iscsi_sessions() -> list[dict]:
    """Kernel iSCSI sessions: sid, target, iface, initiator name, block device."""
    out = []
    for s in sorted(glob.glob("/sys/class/iscsi_session/session*")):
        sid = int(os.path.basename(s)[len("session") :])
        devs = sorted(os.path.basename(b) for b in glob.glob(f"{s}/device/target*/*:*:*:*/block/*"))
        out.append(
            {
                "sid": sid,
                "targetname": _read(f"{s}/targetname"),
                "iface": _read(f"{s}/ifacename"),
                "initiatorname": _read(f"{s}/initiatorname"),
                "state": _read(f"{s}/state"),
                "devices": [f"/dev/{d}" for d in devs],
            }
        )
    return out


def iscsi_login(luns: list[dict]) -> None:
    sh(["iscsiadm", "-m", "node", "-L", "all"])
    want = {t["iqn"]: t for t in luns}
    deadline = time.monotonic() + speed.budget(DEVICE_WAIT_S)
    while True:
        found = {s["targetname"]: s for s in iscsi_sessions() if s["devices"]}
        if all(i in found for i in want):
            break
        if time.monotonic() > deadline:
            missing = sorted(set(want) - set(found))
            raise TopologyError(f"no block device after login for {missing}: {iscsi_sessions()}")
        time.sleep(0.1)
    for iqn, t in want.items():
        s = found[iqn]
        t["sid"] = s["sid"]
        t["device"] = s["devices"][0]
        t["session_initiator"] = s["initiatorname"]
    store("iscsi", "iqn", luns)


def iscsi_logout_all() -> None:
    if _running("iscsid"):
        sh(["iscsiadm", "-m", "node", "-U", "all"], check=False)
        sh(["iscsiadm", "-m", "node", "-o", "delete"], check=False)
        for line in sh(["iscsiadm", "-m", "iface"], check=False).splitlines():
            name = line.split(" ", 1)[0]
            if name.startswith("ini"):
                sh(["iscsiadm", "-m", "iface", "-I", name, "-o", "delete"], check=False)


def nvme_block_device(nqn: str) -> str | None:
    # the subsystem's namespaces first (multipath), then a controller's
    for parent in ("/sys/class/nvme-subsystem/nvme-subsys*", "/sys/class/nvme/nvme*"):
        for sub in glob.glob(parent):
            if _read(f"{sub}/subsysnqn") == nqn:
                for b in sorted(glob.glob(f"{sub}/nvme*n*")):
                    name = os.path.basename(b)
                    if os.path.exists(f"/sys/block/{name}"):
                        return f"/dev/{name}"
    return None


def nvme_connect(nvme: list[dict]) -> None:
    for n in nvme:
        sh(
            [
                "nvme",
                "connect",
                "-t",
                "tcp",
                "-a",
                n["traddr"],
                "-s",
                str(NVME_PORT),
                "-n",
                n["nqn"],
                "--hostnqn",
                n["hostnqn"],
                "--hostid",
                n["hostid"],
                "--host-traddr",
                n["host_traddr"],
            ]
        )
    deadline = time.monotonic() + speed.budget(DEVICE_WAIT_S)
    for n in nvme:
        while True:
            dev = nvme_block_device(n["nqn"])
            if dev:
                n["device"] = dev
                break
            if time.monotonic() > deadline:
                raise TopologyError(f"no NVMe block device for {n['nqn']}")
            time.sleep(0.1)
    store("nvme", "nqn", nvme)


def nvme_disconnect(nvme: list[dict]) -> None:
    for n in nvme:
        sh(["nvme", "disconnect", "-n", n["nqn"]], check=False)
