"""The lab's kernel has what the data path needs (and the dev kernel lacks)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from labkit import speed

pytestmark = pytest.mark.lab

# Actuator (tc/ipset/iptables), target side (LIO, nvmet), initiator side.
MODULES = [
    "sch_netem",
    "sch_htb",
    "ip_set",
    "ip_set_hash_ip",
    "xt_set",
    "xt_bpf",
    "xt_u32",
    "iptable_mangle",
    "target_core_mod",
    "target_core_iblock",
    "iscsi_target_mod",
    "iscsi_tcp",
    "nvmet",
    "nvmet_tcp",
    "nvme_tcp",
]

# The exact pure-ACK match (TCP payload == 0) as xt_bpf bytecode (datapath/rules.py).
PURE_ACK_BPF = (
    "15,48 0 0 9,21 0 12 6,177 0 0 0,40 0 0 2,28 0 0 0,2 0 0 0,80 0 0 12,84 0 0 240,"
    "116 0 0 2,7 0 0 0,96 0 0 0,28 0 0 0,21 0 1 0,6 0 0 1,6 0 0 0"
)


@pytest.fixture
def scratch_netns(guest):
    name = f"scratch{os.getpid()}"
    guest.run(["ip", "netns", "add", name])
    guest.run(["ip", "-n", name, "link", "set", "lo", "up"])
    yield name
    guest.run(["ip", "netns", "del", name], check=False)


def test_debian_kernel():
    release = os.uname().release
    assert release.endswith("-amd64"), release
    assert Path(f"/lib/modules/{release}/modules.dep").is_file()


@pytest.mark.parametrize("module", MODULES)
def test_module_loads(guest, module):
    guest.run(["modprobe", module])
    assert Path(f"/sys/module/{module}").is_dir()


def test_netem_delays_packets(guest, scratch_netns):
    """sch_netem really delays: a TCP connect over lo pays the delay twice."""
    guest.run(
        ["tc", "-n", scratch_netns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "100ms"]
    )
    code = (
        "import socket, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "t = time.monotonic(); c = socket.create_connection(s.getsockname())\n"
        "print(time.monotonic() - t)\n"
    )
    out = guest.run(["ip", "netns", "exec", scratch_netns, "python3", "-c", code]).stdout
    assert float(out.split()[-1]) >= 0.19


def test_actuator_pieces_load(guest, scratch_netns):
    """The actuator's kernel objects from design.md build on this kernel:
    HTB root + netem leaf, an skbinfo ipset, a SET --map-prio rule and the
    xt_bpf pure-ACK match, all in one netns."""
    ns = ["ip", "netns", "exec", scratch_netns]
    batch = "\n".join(
        [
            "qdisc add dev lo root handle 1: htb default 1",
            "class add dev lo parent 1: classid 1:1 htb rate 10gbit",
            "class add dev lo parent 1: classid 1:2 htb rate 10gbit",
            "qdisc add dev lo parent 1:2 handle 2: netem delay 500us limit 100000",
        ]
    )
    guest.run([*ns, "tc", "-batch", "-"], input=batch + "\n")
    guest.run([*ns, "ipset", "create", "lab-delay", "hash:ip", "skbinfo"])
    guest.run([*ns, "ipset", "add", "lab-delay", "127.0.0.2", "skbprio", "1:2"])
    rules = "\n".join(
        [
            "*mangle",
            ":LAB - [0:0]",
            "-A POSTROUTING -j LAB",
            "-A LAB -p tcp --sport 3260 -m bpf --bytecode "
            f'"{PURE_ACK_BPF}" -j SET --map-set lab-delay dst --map-prio',
            "COMMIT",
        ]
    )
    guest.run([*ns, "iptables-restore", "--noflush"], input=rules + "\n")
    out = guest.run([*ns, "iptables", "-t", "mangle", "-S", "LAB"]).stdout
    assert "--map-prio" in out and "--bytecode" in out, out
    t0 = time.monotonic()
    guest.run([*ns, "ipset", "add", "lab-delay", "127.0.0.3", "skbprio", "1:1"])
    assert time.monotonic() - t0 < speed.budget(5)
