"""The lab's second fabric, dm-multipath over both, and a fleet's etcd cluster. In the guest.

On top of topology.up(bridge=True) (fabric A: lab-ini -- lab-bi [lab-br in netns
labbr] lab-ba -- lab-tgt, 10.0.0.0/24)::

    fabric B   lab-inib -- lab-bi2 [lab-br2 in netns labbr2] lab-ba2 -- lab-tgtb
               10.0.1.0/24, the same last numbers as fabric A: initiator k
               10.0.1.(2+k), its portal 10.0.1.(11+k) (a second network portal
               of the LUN's TPG in netns tgt)
    multipath  each iSCSI initiator logs in over both portals (two sessions per
               LUN, the same iface and initiator name, two ISIDs); per LUN a
               dm-multipath device /dev/mapper/mpathK made with dmsetup (the
               kernel's multipath target, service-time, both paths in one
               priority group, no queue_if_no_path: a failed I/O is an error)
    management 198.51.100.0/24: a bridge in netns labhub, veths to labbr
               (198.51.100.1), labbr2 (198.51.100.2) and labetcd3 (198.51.100.3);
               an etcd member in each (--heartbeat-interval 50
               --election-timeout 500), its data on tmpfs

Everything started here is ended by its PID; teardown() removes it all (before
topology.down()).  Standard library and Debian's python3-rtslib-fb only.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labkit import speed, topology
from labkit.topology.names import TopologyError, _read, sh

BRIDGE_B = {
    "netns": "labbr2",
    "name": "lab-br2",
    "initiator_port": "lab-bi2",
    "array_port": "lab-ba2",
}
VETH_INI_B, VETH_TGT_B = "lab-inib", "lab-tgtb"
MULTIPATH_MODULES = ["dm_multipath", "dm_service_time", "dm_round_robin"]
SELECTOR = "service-time"
HUB = "labhub"
MGMT_NET = "198.51.100"
MGMT_DEV = "fl0"
# etcd member i+1 runs in MEMBER_NS[i]: the two bridges' namespaces and one of its own
MEMBER_NS = [topology.BRIDGE_NETNS, BRIDGE_B["netns"], "labetcd3"]
HEARTBEAT_MS, ELECTION_MS = 50, 500
ENV = topology.LVM_ENV  # libdevmapper without udev: dmsetup makes /dev/mapper nodes itself


def initiator_ip_b(k: int) -> str:
    return f"10.0.1.{2 + k}"


def portal_ip_b(k: int) -> str:
    return f"10.0.1.{11 + k}"


def member_ip(i: int) -> str:
    return f"{MGMT_NET}.{i + 1}"


def endpoints(first: int) -> list[str]:
    """The cluster's client endpoints, member `first` (the appliance's own) first."""
    return [f"{member_ip(i)}:2379" for i in [first, *(i for i in range(3) if i != first)]]


def _batch(ns: str | None, lines: list[str]) -> None:
    sh(["ip", *(["-n", ns] if ns else []), "-batch", "-"], input="\n".join(lines) + "\n")


def _rps(ns: str, devs: list[str]) -> None:
    mask = format((1 << (os.cpu_count() or 1)) - 1, "x")
    script = "".join(f"echo {mask} > /sys/class/net/{d}/queues/rx-0/rps_cpus; " for d in devs)
    sh(["ip", "netns", "exec", ns, "sh", "-c", script])


# ------------------------------------------------------------------ fabric B
def setup_fabric_b(t: dict) -> None:
    """Fabric B's namespace, bridge and veths; its addresses and /32 routes (as fabric A's);
    a second LIO network portal per TPG on it."""
    b = BRIDGE_B
    sh(["ip", "netns", "add", b["netns"]])
    _batch(
        None,
        [f"link add {VETH_INI_B} type veth peer name {b['initiator_port']} netns {b['netns']}"],
    )
    _batch(
        b["netns"],
        [
            "link set lo up",
            f"link add {b['array_port']} type veth peer name {VETH_TGT_B} netns {topology.NETNS}",
            f"link add {b['name']} type bridge stp_state 0 forward_delay 0",
            f"link set {b['initiator_port']} master {b['name']} up",
            f"link set {b['array_port']} master {b['name']} up",
            f"link set {b['name']} up",
        ],
    )
    for sw in topology.BR_NF_SWITCHES:
        sh(
            [
                "ip",
                "netns",
                "exec",
                b["netns"],
                "sysctl",
                "-qw",
                f"net.bridge.bridge-nf-call-{sw}=0",
            ],
            check=False,
        )
    ini, tgt = [], []
    for x in t["iscsi"]:
        k = x["index"]
        x["initiator_ip_b"], x["portal_b"] = initiator_ip_b(k), portal_ip_b(k)
        ini.append(f"addr add {x['initiator_ip_b']}/24 dev {VETH_INI_B}")
        tgt.append(f"addr add {x['portal_b']}/24 dev {VETH_TGT_B}")
    ini.append(f"link set {VETH_INI_B} up")
    tgt.append(f"link set {VETH_TGT_B} up")
    ini += [
        f"route add {x['portal_b']}/32 dev {VETH_INI_B} src {x['initiator_ip_b']}"
        for x in t["iscsi"]
    ]
    _batch(None, ini)
    _batch(topology.NETNS, tgt)
    mask = format((1 << (os.cpu_count() or 1)) - 1, "x")
    Path(f"/sys/class/net/{VETH_INI_B}/queues/rx-0/rps_cpus").write_text(mask)
    _rps(topology.NETNS, [VETH_TGT_B])
    _rps(b["netns"], [b["initiator_port"], b["array_port"]])
    t["bridge_b"] = dict(b)
    out = sh(
        [
            "nsenter",
            f"--net={topology.NETNS_PATH}",
            sys.executable,
            "-m",
            "labkit.fabrics",
            "_portals",
        ],
        input=json.dumps(t["iscsi"]),
    )
    if '"ok": true' not in out:
        raise TopologyError(f"second portals: {out}")


def _add_portals(luns: list[dict]) -> dict:
    """In netns tgt: a network portal on fabric B in each LUN's TPG 1."""
    from rtslib_fb import TPG, FabricModule, NetworkPortal, Target

    iscsi = FabricModule("iscsi")
    for x in luns:
        tpg = TPG(Target(iscsi, x["iqn"], mode="lookup"), 1, mode="lookup")
        NetworkPortal(tpg, x["portal_b"], topology.ISCSI_PORT)
    return {"ok": True}


def session_address(sid: int) -> str:
    return _read(f"/sys/class/iscsi_connection/connection{sid}:0/persistent_address")


def login_b(t: dict) -> None:
    """Each initiator's second session, over fabric B (its iface, its initiator name)."""
    for x in t["iscsi"]:
        p = topology.hostport(x["portal_b"], topology.ISCSI_PORT)
        sh(["iscsiadm", "-m", "node", "-o", "new", "-T", x["iqn"], "-p", p, "-I", x["iface"]])
        sh(["iscsiadm", "-m", "node", "-T", x["iqn"], "-p", p, "-I", x["iface"], "--login"])
    deadline = time.monotonic() + speed.budget(topology.DEVICE_WAIT_S)
    while True:
        got = {}
        for s in topology.iscsi_sessions():
            if s["devices"] and session_address(s["sid"]).startswith("10.0.1."):
                got[s["targetname"]] = s
        if all(x["iqn"] in got for x in t["iscsi"]):
            break
        if time.monotonic() > deadline:
            raise TopologyError(f"no fabric B device for some LUN: {topology.iscsi_sessions()}")
        time.sleep(0.2)
    for x in t["iscsi"]:
        x["sid_b"], x["device_b"] = got[x["iqn"]]["sid"], got[x["iqn"]]["devices"][0]
        x["device_a"] = x["device"]


# ---------------------------------------------------------------- multipath
def _sectors(dev: str) -> int:
    return int(sh(["blockdev", "--getsz", dev]).strip())


def mpath_table(x: dict, paths: list[str]) -> str:
    """service-time: per path repeat_count 1, relative_throughput 1."""
    args = " ".join(f"{p} 1 1" for p in paths)
    return f"0 {_sectors(paths[0])} multipath 0 0 1 1 {SELECTOR} 0 {len(paths)} 2 {args}"


def setup_multipath(t: dict) -> None:
    """/dev/mapper/mpathK over the LUN's two sessions; fio's device becomes it."""
    topology.load_modules(MULTIPATH_MODULES)
    for x in t["iscsi"]:
        name = f"mpath{x['index']}"
        a, b = x["device_a"], x["device_b"]
        if _sectors(a) != _sectors(b):
            raise TopologyError(f"{name}: {a} and {b} differ in size")
        sh(["dmsetup", "create", name, "--table", mpath_table(x, [a, b])], env=ENV)
        x["mpath"] = name
        x["device"] = f"/dev/mapper/{name}"
        x["mpath_dm"] = topology.dm_name(x["device"])


def path_status(x: dict) -> str:
    return sh(["dmsetup", "status", x["mpath"]], env=ENV, check=False).strip()


def fail_path(x: dict, dev: str) -> None:
    sh(["dmsetup", "message", x["mpath"], "0", f"fail_path {dev}"], env=ENV)


def reinstate_path(x: dict, dev: str) -> None:
    sh(["dmsetup", "message", x["mpath"], "0", f"reinstate_path {dev}"], env=ENV)


def multipath_log_lines() -> list[str]:
    """The kernel's multipath messages so far (path failures, reinstatements)."""
    text = sh(["dmesg"], check=False)
    return [ln for ln in text.splitlines() if "multipath" in ln]


# --------------------------------------------------------------- management
def setup_mgmt() -> None:
    """The management network: a bridge in HUB, one veth per member namespace."""
    for ns in (HUB, MEMBER_NS[2]):
        sh(["ip", "netns", "add", ns])
        sh(["ip", "-n", ns, "link", "set", "lo", "up"])
    _batch(HUB, ["link add br0 type bridge stp_state 0 forward_delay 0", "link set br0 up"])
    for i, ns in enumerate(MEMBER_NS):
        port = f"fl-m{i + 1}"
        _batch(
            HUB,
            [
                f"link add {port} type veth peer name {MGMT_DEV} netns {ns}",
                f"link set {port} master br0 up",
            ],
        )
        _batch(ns, [f"addr add {member_ip(i)}/24 dev {MGMT_DEV}", f"link set {MGMT_DEV} up"])


def mgmt_link(ns: str, up: bool) -> None:
    sh(["ip", "-n", ns, "link", "set", MGMT_DEV, "up" if up else "down"])


class Etcd:
    """The 3-member cluster (tests/privileged/etcd_cluster.py's, in the lab's namespaces)."""

    def __init__(self, log_dir: Path, nice: int = 0) -> None:
        base = "/dev/shm" if Path("/dev/shm").is_dir() else None
        self.data = Path(tempfile.mkdtemp(prefix="santhrottle-etcd-", dir=base))
        self.log_dir, self.nice = log_dir, nice
        self.procs: list[subprocess.Popen] = []
        self.fs = sh(["stat", "-f", "-c", "%T", str(self.data)], check=False).strip()

    def start(self) -> None:
        names = [f"m{i + 1}" for i in range(3)]
        peers = ",".join(f"{n}=http://{member_ip(i)}:2380" for i, n in enumerate(names))
        for i, ns in enumerate(MEMBER_NS):
            ip = member_ip(i)
            log = open(self.log_dir / f"etcd-{names[i]}.log", "ab")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        ns,
                        "etcd",
                        "--name",
                        names[i],
                        "--data-dir",
                        str(self.data / names[i]),
                        "--listen-peer-urls",
                        f"http://{ip}:2380",
                        "--initial-advertise-peer-urls",
                        f"http://{ip}:2380",
                        "--listen-client-urls",
                        f"http://{ip}:2379",
                        "--advertise-client-urls",
                        f"http://{ip}:2379",
                        "--initial-cluster",
                        peers,
                        "--initial-cluster-token",
                        "santhrottle-lab",
                        "--initial-cluster-state",
                        "new",
                        "--heartbeat-interval",
                        str(HEARTBEAT_MS),
                        "--election-timeout",
                        str(ELECTION_MS),
                        "--logger",
                        "zap",
                        "--log-level",
                        "warn",
                    ],
                    stdout=log,
                    stderr=log,
                    preexec_fn=lambda: os.nice(self.nice),
                )
            )
            log.close()

    def ctl(self, *args: str, ns: str = MEMBER_NS[2], timeout: float = 30.0) -> str:
        """etcdctl from `ns` (the third member's namespace reaches every member), at the
        etcd members' nice; its output, or "" when it did not finish within `timeout`."""
        eps = ",".join(f"http://{member_ip(i)}:2379" for i in range(3))
        try:
            return sh(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "nice",
                    "-n",
                    str(self.nice),
                    "etcdctl",
                    f"--endpoints={eps}",
                    "--command-timeout=5s",
                    *args,
                ],
                check=False,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return ""

    def wait_ready(self, within_s: float = 60.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < within_s:
            if self.ctl("endpoint", "health").count("is healthy") == 3:
                return time.monotonic() - t0
            time.sleep(0.5)
        raise TopologyError(f"etcd not healthy in {within_s} s: {self.ctl('endpoint', 'health')}")

    def keys(self, prefix: str) -> list[str] | None:
        """The keys under prefix; None when etcdctl did not answer."""
        out = self.ctl("get", "--prefix", "--keys-only", prefix)
        if not out.strip() or "Error" in out:
            return None if "Error" in out or not out else []
        return [k for k in out.split() if k.startswith(prefix)]

    def stop(self) -> None:
        for p in self.procs:  # ours, by PID (`ip netns exec` execs etcd)
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        self.procs.clear()
        shutil.rmtree(self.data, ignore_errors=True)


# ----------------------------------------------------------------- teardown
def teardown(t: dict | None) -> None:
    """The multipath devices, fabric B's sessions and namespaces, the management network
    (best effort; topology.down() does the rest)."""
    for name in sorted(os.path.basename(p) for p in glob.glob("/dev/mapper/mpath*")):
        sh(["dmsetup", "remove", "--retry", name], env=ENV, check=False)
    for x in (t or {}).get("iscsi", []):
        if "portal_b" in x:
            p = topology.hostport(x["portal_b"], topology.ISCSI_PORT)
            sh(
                ["iscsiadm", "-m", "node", "-T", x["iqn"], "-p", p, "-I", x["iface"], "--logout"],
                check=False,
            )
    for ns in (BRIDGE_B["netns"], HUB, MEMBER_NS[2]):
        if os.path.exists(f"/run/netns/{ns}"):
            sh(["ip", "netns", "del", ns], check=False)
    if os.path.exists(f"/sys/class/net/{VETH_INI_B}"):
        sh(["ip", "link", "del", VETH_INI_B], check=False)


if __name__ == "__main__" and sys.argv[1:] == ["_portals"]:
    print(json.dumps(_add_portals(json.loads(sys.stdin.read()))))
