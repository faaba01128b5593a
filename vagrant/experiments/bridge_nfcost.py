"""Bridge mode in the lab: what the gate costs a bridged packet (bridge_lab.py --only nf-cost).

What it owns
    The per-packet cost of the two ways a bridged packet can reach the delay
    classes, side by side in alternating rounds: a 256 MiB TCP stream from the
    target's namespace to an initiator address through the bridge, its
    segments unaggregated (TSO, GSO and GRO off on every veth: one packet one
    frame), the CPU time of the whole guest per packet forwarded, for
      none      br_netfilter off, no rule: the bridge and the port's HTB;
      brnf-idle br_netfilter on, nobody delayed (so no jump: the data path's
                idle gate), what every bridged packet pays for the switch;
      iptables  br_netfilter on, the target host's gate made by hand for
                the receiver (the physdev jump matching an skbinfo ipset, a
                chain with the ports, SET --map-prio);
      nft       br_netfilter off, santhrottled's own gate with the receiver
                pinned (nftables' bridge family: the hook chain's jump, the
                ports, the map lookup, the counting set; what bridge mode
                runs, datapath/nftrules.py).
    Both gates put the packets into the same HTB class (pfifo leaf: classified,
    not delayed); its counters prove each did.

Worked example
    nf_cost(a, t, d)["summary"]["iptables"] -> {"median": 104.6, "min": 87.5, "max": 112.3,
    "over_none_median": 22.3, "over_none_range": [14.2, 34.3]} (us of the guest's CPU per
    frame; docs/bridge.md, "Measured in the lab", 2026-11-26)
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time

from labkit import probes, topology
from labkit.daemon import Daemon, not_answering

STREAM_BYTES = 256 << 20
# The stream's source port: one of the data path's ports (its rules match it) that the
# wire sensor does not read (its capture filter takes 3260 and 4420 only).
STREAM_PORT = 5001
START_S = 120.0  # the bridge's set-up comes first in bridge mode


def _ns(ns: str, *cmd: str, check: bool = True, input: str | None = None) -> str:
    return topology.sh(["ip", "netns", "exec", ns, *cmd], check=check, input=input)


def cpu_busy_s() -> float:
    """The guest's busy CPU seconds so far (/proc/stat: all but idle and iowait)."""
    v = probes.guest_cpu()
    return (sum(v.values()) - v["idle"] - v["iowait"]) / os.sysconf("SC_CLK_TCK")


def tx_packets(ns: str, dev: str) -> int:
    return int(_ns(ns, "cat", f"/sys/class/net/{dev}/statistics/tx_packets"))


IPT_SET, IPT_CHAIN = "nfcost", "NFCOST"
GATES = ("none", "brnf-idle", "iptables", "nft")


def set_gate(d: Daemon, t: dict, gate: str, member: str, minor: int) -> None:
    b = t["bridge"]
    ns = b["netns"]
    _ns(ns, "iptables", "-t", "mangle", "-F", IPT_CHAIN, check=False)
    _ns(ns, "iptables", "-t", "mangle", "-D", "POSTROUTING", *ipt_jump(b), check=False)
    _ns(ns, "iptables", "-t", "mangle", "-X", IPT_CHAIN, check=False)
    _ns(ns, "ipset", "destroy", IPT_SET, check=False)
    on = "1" if gate in ("iptables", "brnf-idle") else "0"
    _ns(ns, "sysctl", "-qw", f"net.bridge.bridge-nf-call-iptables={on}")
    if gate == "nft":
        pin_class(d, member, minor)  # santhrottled's own gate
    else:
        unpin(d, member)
    if gate == "iptables":  # the target host's gate, behind br_netfilter
        _ns(ns, "ipset", "create", IPT_SET, "hash:ip", "skbinfo")
        _ns(ns, "ipset", "add", IPT_SET, member, "skbprio", f"5374:{minor:x}")
        _ns(
            ns,
            "iptables-restore",
            "--noflush",
            input=(
                f"*mangle\n:{IPT_CHAIN} - [0:0]\n-I POSTROUTING {' '.join(ipt_jump(b))}\n"
                f"-A {IPT_CHAIN} -p tcp -m multiport ! --sports 3260,4420,{STREAM_PORT} -j RETURN\n"
                f"-A {IPT_CHAIN} -j SET --map-set {IPT_SET} dst --map-prio\nCOMMIT\n"
            ),
        )


def ipt_jump(b: dict) -> list[str]:
    """The by-hand gate's jump: packets leaving the bridge by its initiator-side port."""
    port = ["-m", "physdev", "--physdev-out", b["initiator_port"], "--physdev-is-bridged"]
    return ["-p", "tcp", *port, "-m", "set", "--match-set", IPT_SET, "dst", "-j", IPT_CHAIN]


def pin_class(d: Daemon, ip: str, minor: int) -> None:
    d.request("pin", initiator=ip, **{"class": minor, "mode": "all"})
    time.sleep(0.5)  # the next tick applies it


def unpin(d: Daemon, ip: str) -> None:
    with contextlib.suppress(*not_answering()):  # not pinned
        d.request("unpin", initiator=ip)
    time.sleep(0.5)


RECEIVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0
while d := c.recv(1 << 20):
    n += len(d)
print(n, flush=True)
"""


def stream(t: dict, src_ns: str, member: str) -> tuple[float, int, float]:
    """STREAM_BYTES from the target's namespace (port 3260) to member: (CPU s, packets, s)."""
    b = t["bridge"]
    rcv = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, member, "40960"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert rcv.stdout is not None and rcv.stdout.readline().strip() == "ready"
        sender = (
            "import socket,sys\n"
            "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('{t['iscsi'][0]['portal']}', {STREAM_PORT})); "
            f"s.connect(('{member}', 40960))\n"
            f"buf=b'x'*(1<<20)\nfor _ in range({STREAM_BYTES >> 20}): s.sendall(buf)\n"
            "s.close()\n"
        )
        p0, c0, t0 = tx_packets(b["netns"], b["initiator_port"]), cpu_busy_s(), time.monotonic()
        _ns(src_ns, sys.executable, "-c", sender)
        got = int(rcv.stdout.readline())
        p1, c1, t1 = tx_packets(b["netns"], b["initiator_port"]), cpu_busy_s(), time.monotonic()
        assert got == STREAM_BYTES, got
        return c1 - c0, p1 - p0, t1 - t0
    finally:
        if rcv.poll() is None:
            rcv.kill()  # our own child, by PID
        rcv.wait()


def class_bytes(t: dict, minor: int) -> int:
    b = t["bridge"]
    out = _ns(
        b["netns"],
        "tc",
        "-s",
        "class",
        "show",
        "dev",
        b["initiator_port"],
        "classid",
        f"5374:{minor:x}",
    )
    words = out.split()
    return int(words[words.index("Sent") + 1]) if "Sent" in words else 0


def nf_cost(a, t: dict, d: Daemon) -> dict:
    """The rounds (module header) with `d`, santhrottled in bridge mode (pfifo leaves, the
    stream's port among its ports), started here and stopped at the end."""
    b = t["bridge"]
    for ns, devs in (
        (b["netns"], (b["initiator_port"], b["array_port"])),
        (topology.NETNS, (topology.VETH_TGT,)),
    ):
        for dev in devs:
            _ns(ns, "ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off", check=False)
    subprocess.run(
        ["ethtool", "-K", topology.VETH_INI, "gro", "off", "tso", "off", "gso", "off"],
        capture_output=True,
    )
    d.start(START_S)
    member, minor = t["iscsi"][0]["initiator_ip"], 5
    rows: list[dict] = []
    try:
        for rnd in range(a.nf_rounds):
            k = rnd % len(GATES)
            order = GATES[k:] + GATES[:k]  # rotate: no gate always first
            for gate in order:
                set_gate(d, t, gate, member, minor)
                before = class_bytes(t, minor)
                cpu, pkts, secs = stream(t, topology.NETNS, member)
                classified = class_bytes(t, minor) - before
                rows.append(
                    {
                        "round": rnd,
                        "gate": gate,
                        "cpu_s": cpu,
                        "packets": pkts,
                        "seconds": secs,
                        "us_per_packet": cpu / pkts * 1e6,
                        "classified_bytes": classified,
                    }
                )
                print(
                    f"nf-cost round {rnd} {gate:<9} {pkts:>8} packets  "
                    f"{cpu / pkts * 1e6:7.2f} us/packet  {secs:6.1f} s  "
                    f"class 5374:{minor} +{classified} B",
                    flush=True,
                )
        set_gate(d, t, "none", member, minor)
    finally:
        d.stop()
    per = {g: [r["us_per_packet"] for r in rows if r["gate"] == g] for g in GATES}
    summary = {
        g: {"median": statistics.median(v), "min": min(v), "max": max(v)} for g, v in per.items()
    }
    # the extra cost of each gate over no gate, per round (the rounds' own noise cancels)
    for g in GATES[1:]:
        d = [x - y for x, y in zip(per[g], per["none"], strict=True)]
        summary[g]["over_none_median"] = statistics.median(d)
        summary[g]["over_none_range"] = [min(d), max(d)]
    return {"rows": rows, "summary": summary}
