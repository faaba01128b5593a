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

Usable three ways:
  * CLI in the guest:  python3 -m labkit.topology up [--luns 4] [--nvme 1] [--no-login] ...
                       python3 -m labkit.topology status | down
  * Python in the guest:  from labkit import topology; t = topology.up(luns=4); topology.down()
  * from the host: .venv/bin/python vagrant/qemu/lab.py sh 'python3 -m labkit.topology up'

Only the standard library and Debian's python3-rtslib-fb (the guest venv sees it).
State (what was built, device names) is kept in /run/santhrottle-lab/topology.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from labkit import speed

NETNS = "tgt"
NETNS_PATH = f"/run/netns/{NETNS}"
# --bridge: a third namespace between the two, its bridge joining the initiators'
# veth to the target's ("any array" behind a transparent bridge; docs/bridge.md)
BRIDGE_NETNS = "labbr"
BRIDGE = {
    "netns": BRIDGE_NETNS,
    "name": "lab-br",
    "initiator_port": "lab-bi",
    "array_port": "lab-ba",
}
VETH_INI = "lab-ini"
VETH_TGT = "lab-tgt"
VG = "labvg"
IQN_BASE = "iqn.2003-01.org.santhrottle.lab"
NQN_BASE = "nqn.2003-01.org.santhrottle.lab"
ISCSI_PORT = 3260
NVME_PORT = 4420
MAX_INITIATORS = 8
STATE_DIR = Path("/run/santhrottle-lab")
STATE_FILE = STATE_DIR / "topology.json"
NETDEV_MAX_BACKLOG = 30000  # with RPS, 0 target retransmits (docs/lab.md)
DEVICE_WAIT_S = 30.0
NVMET = Path("/sys/kernel/config/nvmet")

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
BR_NF_SWITCHES = ("iptables", "ip6tables", "arptables")

LVM_ENV = {"DM_DISABLE_UDEV": "1", "LVM_SUPPRESS_FD_WARNINGS": "1"}


def initiator_ip(k: int) -> str:
    return f"10.0.0.{2 + k}"


def portal_ip(k: int) -> str:
    return f"10.0.0.{11 + k}"


def nvme_port_ip(k: int) -> str:
    return f"10.0.0.{21 + k}"


def nvme_host_ip(k: int) -> str:
    return f"10.0.0.{31 + k}"


# --ipv6: the same plan in a unique local /64 (RFC 4193), the same last numbers (as hex
# digits: fd00:5374::2 is initiator 0, ::11 its portal, ::21 an NVMe port, ::31 its host)
ULA_PREFIX = "fd00:5374::"
ULA_PREFIXLEN = 64


def initiator_ip6(k: int) -> str:
    return f"{ULA_PREFIX}{2 + k}"


def portal_ip6(k: int) -> str:
    return f"{ULA_PREFIX}{11 + k}"


def nvme_port_ip6(k: int) -> str:
    return f"{ULA_PREFIX}{21 + k}"


def nvme_host_ip6(k: int) -> str:
    return f"{ULA_PREFIX}{31 + k}"


def hostport(addr: str, port: int) -> str:
    """'10.0.0.11:3260', '[fd00:5374::11]:3260': an address and port as iscsiadm, LIO's
    configfs and URLs write them."""
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _prefix(addr: str, v4: int) -> str:
    return f"{addr}/{ULA_PREFIXLEN if ':' in addr else v4}"


def _nodad(addr: str) -> str:
    """IPv6 addresses without duplicate address detection: usable at once (a tentative
    address cannot be a route's source, and nothing else is on the link)."""
    return " nodad" if ":" in addr else ""


class TopologyError(RuntimeError):
    pass


def sh(cmd, env=None, input=None, check=True, timeout: float = 120) -> str:
    """Run a command (stdout and stderr together); check: a TopologyError naming it.
    timeout: what it needs on an idle host (labkit.speed stretches it)."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(
        cmd,
        input=input,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=e,
        timeout=speed.budget(timeout),
    )
    if check and p.returncode != 0:
        raise TopologyError(f"{' '.join(cmd)} exited {p.returncode}: {p.stdout.strip()}")
    return p.stdout


def _log(msg: str) -> None:
    print(f"topology: {msg}", file=sys.stderr, flush=True)


def _read(path) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _running(comm: str) -> bool:
    """Is a process named `comm` alive (not a zombie)?  No pidof dependency."""
    for d in glob.glob("/proc/[0-9]*"):
        stat = _read(f"{d}/stat")  # "pid (comm) state ..."
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        state = stat[stat.rfind(")") + 2 :][:1]
        if stat and name == comm and state != "Z":
            return True
    return False


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


# ------------------------------------------------------ target side (netns)
def _in_netns(args: list[str], payload: dict) -> dict:
    """Run this file's hidden subcommand inside netns tgt: sockets LIO and
    nvmet create when a portal/port is enabled live in the caller's netns."""
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


def _target_up(spec: dict) -> dict:
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


def _target_down() -> dict:
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
    _store("iscsi", "iqn", luns)


def _store(kind: str, key: str, entries: list[dict]) -> None:
    """Merge updated entries (devices, session ids) into the stored state."""
    t = status()
    if t is None:
        return
    by_key = {e[key]: e for e in entries}
    t[kind] = [by_key.get(e[key], e) for e in t[kind]]
    STATE_FILE.write_text(json.dumps(t, indent=1))


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
    _store("nvme", "nqn", nvme)


def nvme_disconnect(nvme: list[dict]) -> None:
    for n in nvme:
        sh(["nvme", "disconnect", "-n", n["nqn"]], check=False)


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
    _in_netns(["_target-up"], t)
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


def status() -> dict | None:
    if not STATE_FILE.exists():
        return None
    return json.loads(STATE_FILE.read_text())


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
        _in_netns(["_target-down"], {})
    elif Path("/sys/kernel/config/target").is_dir() or NVMET.is_dir():
        _target_down()
    teardown_network()
    teardown_lvm()
    teardown_nullb()
    STATE_FILE.unlink(missing_ok=True)


def _indices(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(int(x) for x in text.split(",") if x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="bring the topology up")
    u.add_argument("--luns", type=int, default=4, help="iSCSI LVs/targets/initiators (0-8)")
    u.add_argument("--nvme", type=int, default=1, help="NVMe/TCP LVs/subsystems (0-8)")
    u.add_argument("--lv-size-mib", type=int, default=256)
    u.add_argument(
        "--disk",
        choices=("slow", "fast", "nullb", "array"),
        default="slow",
        help="the QEMU-throttled disk (slow), the unthrottled one, a null_blk array, or "
        "the known plant (array: lab.py --array nbd; docs/lab.md)",
    )
    u.add_argument("--nullb-mbps", type=int, default=20, help="null_blk bandwidth cap, MB/s")
    u.add_argument("--nullb-queue-depth", type=int, default=4, help="null_blk hw queue depth")
    u.add_argument("--no-login", action="store_true", help="create node records, do not log in")
    u.add_argument("--no-rps", action="store_true", help="leave RPS off (shows the retransmits)")
    u.add_argument(
        "--bridge",
        action="store_true",
        help="a transparent bridge between the two (netns labbr)",
    )
    u.add_argument(
        "--links",
        type=int,
        default=1,
        help="veth pairs; iSCSI initiator k uses link k %% links",
    )
    u.add_argument(
        "--ipv6",
        action="store_true",
        help=f"the last iSCSI initiator and NVMe/TCP host 0 over IPv6 ({ULA_PREFIX}/64)",
    )
    u.add_argument("--ipv6-iscsi", help="which iSCSI initiators use IPv6 (indices: 0,3)")
    u.add_argument("--ipv6-nvme", help="which NVMe/TCP hosts use IPv6 (indices: 0)")
    sub.add_parser("down", help="tear it down")
    sub.add_parser("status", help="print the stored description (JSON)")
    sub.add_parser("_target-up")
    sub.add_parser("_target-down")
    a = ap.parse_args(argv)
    if a.cmd == "up":
        t = up(
            a.luns,
            a.nvme,
            a.lv_size_mib,
            a.disk,
            login=not a.no_login,
            rps=not a.no_rps,
            nullb_mbps=a.nullb_mbps,
            nullb_queue_depth=a.nullb_queue_depth,
            links=a.links,
            bridge=a.bridge,
            ipv6=a.ipv6,
            ipv6_iscsi=_indices(a.ipv6_iscsi),
            ipv6_nvme=_indices(a.ipv6_nvme),
        )
        print(json.dumps(t, indent=1))
    elif a.cmd == "down":
        down()
    elif a.cmd == "status":
        print(json.dumps(status(), indent=1))
    elif a.cmd == "_target-up":
        print(json.dumps(_target_up(json.loads(sys.stdin.read()))))
    elif a.cmd == "_target-down":
        print(json.dumps(_target_down()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
