"""The lab topology's names, addresses and state, and the shell it runs commands with.

What it owns
    The namespaces, links, VG, IQN and NQN bases and ports every part of the topology
    uses; each initiator's and portal's address by its index, IPv4 (10.0.0.0/24) or
    IPv6 (fd00:5374::/64, the same last numbers); the state file that says what is up
    (status(), store()); sh(), the one way the topology runs a command (its time limit
    an idle host's, stretched by the guest's speed: labkit.speed).

Worked example
    initiator_ip(1) -> "10.0.0.3"; portal_ip6(1) -> "fd00:5374::12";
    hostport("fd00:5374::12", 3260) -> "[fd00:5374::12]:3260"
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
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

LVM_ENV = {"DM_DISABLE_UDEV": "1", "LVM_SUPPRESS_FD_WARNINGS": "1"}
# bridge mode's br_netfilter switches, off in the bridge's namespace (network.py)
BR_NF_SWITCHES = ("iptables", "ip6tables", "arptables")


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


def status() -> dict | None:
    if not STATE_FILE.exists():
        return None
    return json.loads(STATE_FILE.read_text())


def store(kind: str, key: str, entries: list[dict]) -> None:
    """Merge updated entries (devices, session ids) into the stored state."""
    t = status()
    if t is None:
        return
    by_key = {e[key]: e for e in entries}
    t[kind] = [by_key.get(e[key], e) for e in t[kind]]
    STATE_FILE.write_text(json.dumps(t, indent=1))
