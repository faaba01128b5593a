"""The lab topology's target host: LIO and nvmet, configured inside its namespace.

What it owns
    What the target exports, built and torn down inside netns tgt (the sockets LIO and
    nvmet open when a portal or port is enabled live in the namespace of the process
    that configures them): per iSCSI LV a LIO target through rtslib-fb (TPG 1, generated
    ACLs, a portal, LUN 0), per NVMe/TCP LV an nvmet subsystem with one namespace and a
    port of its own.  up() and down() call it through `python3 -m labkit.topology
    _target-up | _target-down` under nsenter (in_netns).

Worked example
    in_netns(["_target-up"], plan) -> {"ok": True}: iqn.2003-01.org.santhrottle.lab:lun0
    on 10.0.0.11:3260, nqn.2003-01.org.santhrottle.lab:nvme0 on 10.0.0.21:4420
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from labkit.topology.names import ISCSI_PORT, NETNS_PATH, NVME_PORT, NVMET, sh


# ------------------------------------------------------ target side (netns)
def in_netns(args: list[str], payload: dict) -> dict:
    """One of `python3 -m labkit.topology`'s hidden subcommands (_target-up, _target-down)
    inside netns tgt, `payload` on its stdin: sockets LIO and nvmet create when a
    portal or port is enabled live in the caller's netns."""
    out = sh(
        [
            "nsenter",
            f"--net={NETNS_PATH}",
            sys.executable,
            "-m",
            "labkit.topology",
            *args,
        ],
        input=json.dumps(payload),
    )
    return json.loads(out.strip().splitlines()[-1]) if out.strip() else {}


def target_up(spec: dict) -> dict:
    from rtslib_fb import (  # Debian's python3-rtslib-fb
        LUN,
        TPG,
        BlockStorageObject,
        FabricModule,
        NetworkPortal,
        RTSRoot,
        Target,
    )

    RTSRoot()  # mounts configfs / loads target_core_mod if needed
    iscsi = FabricModule("iscsi")
    for t in spec["iscsi"]:
        so = BlockStorageObject(t["lv"], dev=t["lv_path"])
        target = Target(iscsi, t["iqn"])
        tpg = TPG(target, 1)
        for attr, val in (
            ("authentication", "0"),
            ("generate_node_acls", "1"),
            ("demo_mode_write_protect", "0"),
            ("cache_dynamic_acls", "1"),
        ):
            tpg.set_attribute(attr, val)
        # rtslib-fb takes an IPv6 portal in brackets (its configfs name "[addr]:3260")
        NetworkPortal(tpg, f"[{t['portal']}]" if ":" in t["portal"] else t["portal"], ISCSI_PORT)
        LUN(tpg, 0, so)
        tpg.enable = True
    for k, n in enumerate(spec["nvme"]):
        sub = NVMET / "subsystems" / n["nqn"]
        sub.mkdir()
        (sub / "attr_allow_any_host").write_text("1")
        ns = sub / "namespaces" / "1"
        ns.mkdir()
        (ns / "device_path").write_text(n["lv_path"])
        (ns / "enable").write_text("1")
        port = NVMET / "ports" / str(k + 1)
        port.mkdir()
        for attr, val in (
            ("addr_trtype", "tcp"),
            ("addr_adrfam", "ipv6" if ":" in n["traddr"] else "ipv4"),
            ("addr_traddr", n["traddr"]),
            ("addr_trsvcid", str(NVME_PORT)),
        ):
            (port / attr).write_text(val)
        (port / "subsystems" / n["nqn"]).symlink_to(sub)
    return {"ok": True}


def target_down() -> dict:
    if NVMET.is_dir():
        for port in (NVMET / "ports").iterdir():
            for link in (port / "subsystems").iterdir():
                link.unlink()
            port.rmdir()
        for sub in (NVMET / "subsystems").iterdir():
            for ns in (sub / "namespaces").iterdir():
                (ns / "enable").write_text("0")
                ns.rmdir()
            sub.rmdir()
    if Path("/sys/kernel/config/target").is_dir():
        from rtslib_fb import RTSRoot

        RTSRoot().clear_existing(confirm=True)
    return {"ok": True}
