"""The lab topology's network: the veths (or the bridge) between the initiators and the target.

What it owns
    setup_network(): the target's namespace, one veth pair per link (or, with a bridge,
    lab-ini -- lab-bi [lab-br in netns labbr, STP off, forward delay 0] lab-ba --
    lab-tgt), the initiators' and portals' addresses (IPv6 with nodad), a /32 (/128)
    route per portal that picks each initiator's source, quickack on the NVMe/TCP hosts'
    routes when asked, and RPS on every receiving end with netdev_max_backlog raised
    (without it veth and 2 vCPUs reorder packets: docs/lab.md); teardown_network().
    Everything goes in `ip -batch` calls.

Worked example
    setup_network(2, 1, plan_=plan(luns=2, nvme=1)) -> `ip -batch` lines such as
    "addr add 10.0.0.2/24 dev lab-ini", "route add 10.0.0.11/32 dev lab-ini src 10.0.0.2"
"""

from __future__ import annotations

import os
from pathlib import Path

from labkit.topology.names import (
    BR_NF_SWITCHES,
    BRIDGE,
    BRIDGE_NETNS,
    MAX_INITIATORS,
    NETDEV_MAX_BACKLOG,
    NETNS,
    NETNS_PATH,
    VETH_INI,
    VETH_TGT,
    _nodad,
    _prefix,
    initiator_ip,
    nvme_host_ip,
    nvme_port_ip,
    portal_ip,
    sh,
)


# ------------------------------------------------------------------ network
def veth_pair(j: int) -> tuple[str, str]:
    """(initiator end, target end) of link j: lab-ini/lab-tgt, then lab-iniJ/lab-tgtJ."""
    return (VETH_INI, VETH_TGT) if j == 0 else (f"{VETH_INI}{j}", f"{VETH_TGT}{j}")


def setup_network(
    n_iscsi: int,
    n_nvme: int,
    rps: bool = True,
    links: int = 1,
    bridge: bool = False,
    plan_: dict | None = None,
) -> None:
    """links > 1: iSCSI initiator k uses link k % links (/32 addresses and routes
    on the extra links), e.g. to measure two paths at the same time. bridge: the
    one link goes through BRIDGE's namespace (lab-ini -- lab-bi [lab-br] lab-ba --
    lab-tgt), the bridge made with STP off and a forward delay of 0. plan_: the
    addresses of plan() (IPv6 ones among them: /64, nodad, /128 routes); without
    it, IPv4's."""
    iscsi = (
        plan_["iscsi"]
        if plan_
        else [{"initiator_ip": initiator_ip(k), "portal": portal_ip(k)} for k in range(n_iscsi)]
    )
    nvme = (
        plan_["nvme"]
        if plan_
        else [{"host_traddr": nvme_host_ip(k), "traddr": nvme_port_ip(k)} for k in range(n_nvme)]
    )
    make = [f"netns add {NETNS}"]  # the namespaces and the initiators' veths, first
    if bridge:
        b = BRIDGE
        make += [
            f"netns add {b['netns']}",
            f"link add {VETH_INI} type veth peer name {b['initiator_port']} netns {b['netns']}",
        ]
        mid = [
            "link set lo up",
            f"link add {b['array_port']} type veth peer name {VETH_TGT} netns {NETNS}",
            f"link add {b['name']} type bridge stp_state 0 forward_delay 0",
            f"link set {b['initiator_port']} master {b['name']} up",
            f"link set {b['array_port']} master {b['name']} up",
            f"link set {b['name']} up",
        ]
    else:
        make += [
            f"link add {a} type veth peer name {b} netns {NETNS}"
            for a, b in map(veth_pair, range(links))
        ]
    ini: list[str] = []
    tgt = ["link set lo up"]
    extra_routes = []
    for k, x in enumerate(iscsi):
        a, b = veth_pair(k % links)
        ip, portal = x["initiator_ip"], x["portal"]
        if a == VETH_INI:
            ini.append(f"addr add {_prefix(ip, 24)} dev {VETH_INI}{_nodad(ip)}")
            tgt.append(f"addr add {_prefix(portal, 24)} dev {VETH_TGT}{_nodad(portal)}")
        else:
            ini.append(f"addr add {ip}/32 dev {a}")
            tgt.append(f"addr add {portal}/32 dev {b}")
            extra_routes.append(f"route add {ip}/32 dev {b} src {portal}")
    for x in nvme:
        host, port = x["host_traddr"], x["traddr"]
        ini.append(f"addr add {_prefix(host, 24)} dev {VETH_INI}{_nodad(host)}")
        tgt.append(f"addr add {_prefix(port, 24)} dev {VETH_TGT}{_nodad(port)}")
    for a, b in map(veth_pair, range(links)):
        ini.append(f"link set {a} up")
        tgt.append(f"link set {b} up")
    tgt += extra_routes
    for k, x in enumerate(iscsi):
        a, _ = veth_pair(k % links)
        bits = 128 if ":" in x["portal"] else 32
        ini.append(f"route add {x['portal']}/{bits} dev {a} src {x['initiator_ip']}")
    quick = " quickack 1" if plan_ and plan_.get("nvme_quickack") else ""
    for x in nvme:
        bits = 128 if ":" in x["traddr"] else 32
        ini.append(f"route add {x['traddr']}/{bits} dev {VETH_INI} src {x['host_traddr']}{quick}")
    sh(["ip", "-batch", "-"], input="\n".join(make) + "\n")
    if bridge:
        sh(["ip", "-n", BRIDGE_NETNS, "-batch", "-"], input="\n".join(mid) + "\n")
        for sw in BR_NF_SWITCHES:
            sh(
                [
                    "ip",
                    "netns",
                    "exec",
                    BRIDGE_NETNS,
                    "sysctl",
                    "-qw",
                    f"net.bridge.bridge-nf-call-{sw}=0",
                ],
                check=False,
            )
    sh(["ip", "-batch", "-"], input="\n".join(ini) + "\n")
    sh(["ip", "-n", NETNS, "-batch", "-"], input="\n".join(tgt) + "\n")
    if rps:
        mask = format((1 << (os.cpu_count() or 1)) - 1, "x")
        for a, b in map(veth_pair, range(links)):
            Path(f"/sys/class/net/{a}/queues/rx-0/rps_cpus").write_text(mask)
            # sysfs shows the devices of the reader's netns: ip netns exec remounts it
            sh(
                [
                    "ip",
                    "netns",
                    "exec",
                    NETNS,
                    "sh",
                    "-c",
                    f"echo {mask} > /sys/class/net/{b}/queues/rx-0/rps_cpus",
                ]
            )
        if bridge:  # the bridge's ports receive too
            ports = f"{BRIDGE['initiator_port']} {BRIDGE['array_port']}"
            sh(
                [
                    "ip",
                    "netns",
                    "exec",
                    BRIDGE_NETNS,
                    "sh",
                    "-c",
                    f"for d in {ports}; do echo {mask} > /sys/class/net/$d/queues/rx-0/rps_cpus; "
                    "done",
                ]
            )
        Path("/proc/sys/net/core/netdev_max_backlog").write_text(str(NETDEV_MAX_BACKLOG))


def teardown_network() -> None:
    if os.path.exists(NETNS_PATH):
        sh(["ip", "netns", "del", NETNS], check=False)  # takes the veth pairs with it
    if os.path.exists(f"/run/netns/{BRIDGE_NETNS}"):
        sh(["ip", "netns", "del", BRIDGE_NETNS], check=False)
    for j in range(MAX_INITIATORS):
        a, _ = veth_pair(j)
        if os.path.exists(f"/sys/class/net/{a}"):
            sh(["ip", "link", "del", a], check=False)
