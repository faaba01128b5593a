"""The lab's storage topology, inside the guest (vagrant/qemu).

Mirrors a real deployment on one (virtual) machine::

    initial netns (initiators)                 netns "tgt" (the target host)
    ---------------------------                -----------------------------
    iscsid + kernel iSCSI initiator            LIO (rtslib-fb): one iSCSI target,
      iface iniK, IQN ...lab:iniK                TPG 1 and LUN 0 per LV, portal
      source 10.0.0.(2+K) chosen by a            10.0.0.(11+K):3260
      /32 route to its portal                  nvmet (configfs): one subsystem
    kernel NVMe/TCP host (nvme-cli)              per LV, port 10.0.0.(21+K):4420
      source 10.0.0.(31+K)                     VG "labvg" on the QEMU-throttled
    lab-ini  <------------- veth ------------>  disk (serial lab-slow): LVs
                                                 lun0..lunN-1, nvme0..nvmeM-1
                                               lab-tgt

With --ipv6 (up(ipv6=True)) the last iSCSI initiator and NVMe/TCP host 0, with
their portal and port, use IPv6 instead: the same last numbers in fd00:5374::/64
(ULA; initiator 0 fd00:5374::2, its portal ::11, NVMe port ::21, its host ::31),
added with nodad, /128 routes to pick the source; the LIO portal is
"[addr]:3260", the nvmet port's adrfam ipv6.

The kernel iSCSI initiator only works in the initial namespace (NETLINK_ISCSI),
so the initiators are told apart by source address, one per "host", each
selected by a /32 route to the portal it uses.  RPS is set on both veth ends
and netdev_max_backlog raised: without it veth + 2 vCPUs reorders packets and
the target sees spurious retransmits (docs/lab.md).

The parts, each a module of this package: names (the names, addresses, state and
shell), storage (disks, null_blk, LVM), network (veths, bridge, routes, RPS), target
(LIO and nvmet in the target's namespace), initiators (iscsid, logins, NVMe/TCP
connects); this module plans the whole, brings it up and down.

Usable three ways:
  * CLI in the guest:  python3 -m labkit.topology up [--luns 4] [--nvme 1] [--no-login] ...
                       python3 -m labkit.topology status | down
  * Python in the guest:  from labkit import topology; t = topology.up(luns=4); topology.down()
  * from the host: .venv/bin/python vagrant/qemu/lab.py sh 'python3 -m labkit.topology up'

Only the standard library and Debian's python3-rtslib-fb (the guest venv sees it).
State (what was built, device names) is kept in /run/santhrottle-lab/topology.json.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from labkit.topology.initiators import (
    iscsi_add_nodes,
    iscsi_login,
    iscsi_logout_all,
    iscsi_sessions,
    nvme_block_device,
    nvme_connect,
    nvme_disconnect,
    start_iscsid,
    stop_iscsid,
)
from labkit.topology.names import (
    BR_NF_SWITCHES,
    BRIDGE,
    BRIDGE_NETNS,
    DEVICE_WAIT_S,
    IQN_BASE,
    ISCSI_PORT,
    LVM_ENV,
    MAX_INITIATORS,
    NETNS,
    NETNS_PATH,
    NQN_BASE,
    NVME_PORT,
    NVMET,
    STATE_DIR,
    STATE_FILE,
    ULA_PREFIX,
    VETH_INI,
    VETH_TGT,
    VG,
    TopologyError,
    hostport,
    initiator_ip,
    initiator_ip6,
    nvme_host_ip,
    nvme_host_ip6,
    nvme_port_ip,
    nvme_port_ip6,
    portal_ip,
    portal_ip6,
    sh,
    status,
)
from labkit.topology.network import setup_network, teardown_network, veth_pair
from labkit.topology.storage import (
    dm_name,
    find_disk,
    load_modules,
    setup_lvm,
    setup_nullb,
    teardown_lvm,
    teardown_nullb,
)
from labkit.topology.target import in_netns, target_down

__all__ = [
    "BRIDGE",
    "BRIDGE_NETNS",
    "BR_NF_SWITCHES",
    "DEVICE_WAIT_S",
    "ISCSI_PORT",
    "LVM_ENV",
    "NETNS",
    "NETNS_PATH",
    "NVME_PORT",
    "ULA_PREFIX",
    "VETH_INI",
    "VETH_TGT",
    "VG",
    "TopologyError",
    "dm_name",
    "down",
    "find_disk",
    "hostport",
    "iscsi_login",
    "iscsi_sessions",
    "load_modules",
    "nvme_block_device",
    "nvme_connect",
    "nvme_disconnect",
    "plan",
    "setup_network",
    "sh",
    "status",
    "up",
]

MODULES = [
    "virtio_blk",
    "dm_mod",
    "veth",
    "target_core_mod",
    "target_core_iblock",
    "iscsi_target_mod",
    "iscsi_tcp",
    "sd_mod",
]
NVME_MODULES = ["nvmet", "nvmet_tcp", "nvme_tcp", "nvme_fabrics"]
# br_netfilter only for bridge_lab.py's comparison of gates: its switches are turned off
# in the bridge's namespace (setup_network), as on a bridge host without the module
BRIDGE_MODULES = ["bridge", "br_netfilter", "nf_tables"]


# --------------------------------------------------------------- top level
def plan(
    luns: int = 4,
    nvme: int = 1,
    lv_size_mib: int = 256,
    disk: str = "slow",
    links: int = 1,
    bridge: bool = False,
    ipv6_iscsi: tuple[int, ...] = (),
    ipv6_nvme: tuple[int, ...] = (),
) -> dict:
    """ipv6_iscsi / ipv6_nvme: the iSCSI initiators (with their portals) and NVMe/TCP
    hosts (with their ports) that use IPv6 (ULA_PREFIX) instead of IPv4."""
    if not 0 <= luns <= MAX_INITIATORS or not 0 <= nvme <= MAX_INITIATORS:
        raise TopologyError(f"luns and nvme must be within 0..{MAX_INITIATORS}")
    if not 1 <= links <= max(1, luns):
        raise TopologyError(f"links must be within 1..{max(1, luns)} (one per iSCSI LUN at most)")
    if bridge and links != 1:
        raise TopologyError("a bridge joins one link: --bridge takes --links 1")
    if (ipv6_iscsi or ipv6_nvme) and links != 1:
        raise TopologyError("IPv6 initiators take --links 1")
    if not set(ipv6_iscsi) <= set(range(luns)) or not set(ipv6_nvme) <= set(range(nvme)):
        raise TopologyError(f"IPv6 initiators {ipv6_iscsi} / hosts {ipv6_nvme}: not in the plan")
    out = {
        "netns": NETNS,
        "vg": VG,
        "disk_serial": f"lab-{disk}",
        "lv_size_mib": lv_size_mib,
        "veth": {"initiator": VETH_INI, "target": VETH_TGT},
        "links": [{"initiator": a, "target": b} for a, b in map(veth_pair, range(links))],
        "iscsi": [],
        "nvme": [],
        "bridge": dict(BRIDGE) if bridge else None,
    }
    for k in range(luns):
        v6 = k in ipv6_iscsi
        out["iscsi"].append(
            {
                "index": k,
                "lv": f"lun{k}",
                "iqn": f"{IQN_BASE}:lun{k}",
                "family": 6 if v6 else 4,
                "portal": portal_ip6(k) if v6 else portal_ip(k),
                "port": ISCSI_PORT,
                "iface": f"ini{k}",
                "initiator_ip": initiator_ip6(k) if v6 else initiator_ip(k),
                "initiator_iqn": f"{IQN_BASE}:ini{k}",
                "target_device": veth_pair(k % links)[1],
                "device": None,
            }
        )
    for k in range(nvme):
        hostid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"nvme-host{k}.lab.santhrottle.org"))
        v6 = k in ipv6_nvme
        out["nvme"].append(
            {
                "index": k,
                "lv": f"nvme{k}",
                "nqn": f"{NQN_BASE}:nvme{k}",
                "family": 6 if v6 else 4,
                "traddr": nvme_port_ip6(k) if v6 else nvme_port_ip(k),
                "port": NVME_PORT,
                "host_traddr": nvme_host_ip6(k) if v6 else nvme_host_ip(k),
                "hostnqn": f"nqn.2014-08.org.nvmexpress:uuid:{hostid}",
                "hostid": hostid,
                "device": None,
            }
        )
    return out


def up(
    luns: int = 4,
    nvme: int = 1,
    lv_size_mib: int = 256,
    disk: str = "slow",
    login: bool = True,
    rps: bool = True,
    nullb_mbps: int = 20,
    nullb_queue_depth: int = 4,
    links: int = 1,
    bridge: bool = False,
    ipv6: bool = False,
    ipv6_iscsi: tuple[int, ...] | None = None,
    ipv6_nvme: tuple[int, ...] | None = None,
    nvme_quickack: bool = False,
) -> dict:
    """Bring the topology up; returns (and stores) its description.  ipv6: one iSCSI
    initiator (the last) and NVMe/TCP host 0 over IPv6 (ULA_PREFIX), unless
    ipv6_iscsi / ipv6_nvme name which (indices).  nvme_quickack: the NVMe/TCP hosts'
    routes to their ports with quickack 1 (each ACK at once, not when the host's I/O
    worker reads: docs/lab.md, "Tail-loss probes with NVMe/TCP hosts")."""
    if STATE_FILE.exists():
        raise TopologyError(f"topology already up ({STATE_FILE}); run down first")
    if ipv6_iscsi is None:
        ipv6_iscsi = (luns - 1,) if ipv6 and luns else ()
    if ipv6_nvme is None:
        ipv6_nvme = (0,) if ipv6 and nvme else ()
    t = plan(
        luns,
        nvme,
        lv_size_mib,
        disk,
        links,
        bridge,
        tuple(ipv6_iscsi),
        tuple(ipv6_nvme),
    )
    t["nvme_quickack"] = nvme_quickack
    timings = {}
    t0 = time.monotonic()

    def mark(step):
        nonlocal t0
        now = time.monotonic()
        timings[step] = round(now - t0, 2)
        t0 = now

    load_modules(MODULES + (NVME_MODULES if nvme else []) + (BRIDGE_MODULES if bridge else []))
    mark("modules")
    if disk == "nullb":
        size = (len(t["iscsi"]) + len(t["nvme"])) * lv_size_mib + 64
        t["disk"] = setup_nullb(size, nullb_mbps, nullb_queue_depth)
        t["nullb"] = {"mbps": nullb_mbps, "queue_depth": nullb_queue_depth}
    else:
        t["disk"] = find_disk(t["disk_serial"])
    paths = setup_lvm(t["disk"], [x["lv"] for x in t["iscsi"] + t["nvme"]], lv_size_mib)
    for x in t["iscsi"] + t["nvme"]:
        x["lv_path"] = paths[x["lv"]]
        x["dm"] = dm_name(x["lv_path"])
    mark("lvm")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps(t, indent=1))  # from here on, down() cleans up
    setup_network(luns, nvme, rps=rps, links=links, bridge=bridge, plan_=t)
    mark("network")
    in_netns(["_target-up"], t)
    mark("target")
    if luns:
        start_iscsid()
        iscsi_add_nodes(t["iscsi"])
        mark("iscsid")
        if login:
            iscsi_login(t["iscsi"])
            mark("iscsi_login")
    if nvme and login:
        nvme_connect(t["nvme"])
        mark("nvme_connect")
    t["logged_in"] = login
    t["timings_s"] = timings
    STATE_FILE.write_text(json.dumps(t, indent=1))
    return t


def down() -> None:
    """Tear everything down (best effort, idempotent)."""
    t = status()
    if t is not None:
        nvme_disconnect(t["nvme"])
    elif os.path.exists("/dev/nvme-fabrics"):
        sh(["nvme", "disconnect-all"], check=False)
    iscsi_logout_all()
    stop_iscsid()
    if os.path.exists(NETNS_PATH):
        in_netns(["_target-down"], {})
    elif Path("/sys/kernel/config/target").is_dir() or NVMET.is_dir():
        target_down()
    teardown_network()
    teardown_lvm()
    teardown_nullb()
    STATE_FILE.unlink(missing_ok=True)
