"""The order the target's packets to the writers left santhrottle's qdisc: a header capture.

What it owns
    closed_loop.py --capture: tcpdump on the target's veth (in its namespace), headers of
    the packets from the storage port to the writer hosts, for one phase; and what that
    capture says about their order.  A tap on a device sees a packet when the device
    transmits it, after the qdisc (HTB, its netem classes and glide leaves), so the
    capture's order is the order packets left santhrottle's delays.

    order      Linux numbers the IP ID of a TCP socket's packets from one counter, in
               the order the socket sends them (ip_select_ident_segs: data, pure ACKs and
               retransmissions alike; a GSO packet takes one ID per segment; a SYN-ACK,
               sent for a request before the socket, has 0 and is left out).  Per
               connection, a packet whose ID is older than one captured before it was
               sent earlier and left later: overtaken at the qdisc.  IDs wrap at 2^16;
               "older" is within half the space.
    sent twice a data segment whose bytes had left already: a retransmission (the target's
               nstat says which kind).

    A retransmission the initiator D-SACKed (spurious) whose original left in order
    was reordered after the target's veth, in the guest's own path; one whose original
    was overtaken here, by santhrottle's qdisc.  IPv4 only (an IPv6 header has no ID).

Worked example
    lines of `tcpdump -tt -nn -v -S -r` with IDs 10, 12, 11 on one connection ->
    {"10.0.0.5": {"packets": 3, "overtaken": 1, "sent_twice": 0, "events": [{"t": ...,
    "what": "overtaken", "id": 11, "behind": 1, ...}]}}
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from labkit import topology

SNAPLEN = 128  # IP and TCP headers with options
EVENTS_KEPT = 20  # per initiator, the first ones
ID_SPACE = 1 << 16

# tcpdump -v: "<t> IP (tos 0x0, ttl 64, id 565, offset 0, flags [DF], proto TCP (6), length 100)"
HEAD = re.compile(r"^(?P<t>\d+\.\d+) IP \(.*?\bid (?P<id>\d+),")
# then "    <src>.<sport> > <dst>.<dport>: Flags [P.], cksum ..., seq a:b, ack c, ..."
BODY = re.compile(
    r"^\s+(?P<src>[\d.]+)\.(?P<sport>\d+) > (?P<dst>[\d.]+)\.(?P<dport>\d+): "
    r"Flags \[(?P<flags>[^\]]*)\](?:.*?, seq (?P<seq>\d+):(?P<end>\d+))?"
)


def start(netns: str, device: str, port: int, hosts: list[str], pcap: Path) -> subprocess.Popen:
    """tcpdump on `device` in `netns`: the packets from `port` to `hosts`, headers only."""
    dst = " or ".join(f"dst host {h}" for h in hosts)
    tcpdump = [
        "tcpdump",
        "-i",
        device,
        "-nn",
        "-U",
        "--immediate-mode",
        "-s",
        str(SNAPLEN),
        "-w",
        str(pcap),
    ]
    p = subprocess.Popen(
        ["ip", "netns", "exec", netns, *tcpdump, f"tcp src port {port} and ({dst})"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stderr is not None
    line = p.stderr.readline()  # "listening on ..." once the filter is attached
    if "listening" not in line:
        p.kill()
        raise RuntimeError(f"tcpdump: {line.strip()}")
    return p


def stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def read(pcap: Path) -> list[str]:
    """The capture as `tcpdump -tt -nn -v -S -r` prints it (two lines a packet)."""
    cmd = ["tcpdump", "-tt", "-nn", "-v", "-S", "-r", str(pcap)]
    return topology.sh(cmd, check=False, timeout=300).splitlines()


def _older(a: int, b: int) -> bool:
    """IP ID a was given before b (within half the ID space)."""
    return a != b and (b - a) % ID_SPACE < ID_SPACE // 2


def _event(t: float, what: str, port: int, ident: int, behind: int | None, seq: str) -> dict:
    return {"t": t, "what": what, "port": port, "id": ident, "behind": behind, "seq": seq}


def order(lines: Iterable[str], t0: float = 0.0) -> dict[str, dict]:
    """Per destination IP: packets captured, how many left after a packet its connection
    sent later (overtaken), how many data segments repeated bytes already sent (sent
    twice), and the first EVENTS_KEPT of both ({t, what, port, id, behind, seq}; t in
    seconds from t0, the epoch time of the phase's start)."""
    out: dict[str, dict] = {}
    newest: dict[tuple[str, int], int] = {}  # connection -> the newest ID captured
    sent: dict[tuple[str, int], list[tuple[int, int]]] = {}  # its data ranges (from its first)
    base: dict[tuple[str, int], int] = {}
    head = None
    for line in lines:
        h = HEAD.match(line)
        if h:
            head = h
            continue
        b = BODY.match(line)
        if b is None or head is None:
            continue
        t, ident, head = round(float(head["t"]) - t0, 3), int(head["id"]), None
        conn = (b["dst"], int(b["dport"]))
        ip = out.setdefault(b["dst"], {"packets": 0, "overtaken": 0, "sent_twice": 0, "events": []})
        ip["packets"] += 1
        events = ip["events"]
        if "S" in b["flags"] or "R" in b["flags"]:  # a SYN-ACK's ID is 0, not the socket's
            continue
        last = newest.get(conn)
        if last is not None and _older(ident, last):
            ip["overtaken"] += 1
            if len(events) < EVENTS_KEPT:
                behind = (last - ident) % ID_SPACE
                events.append(_event(t, "overtaken", conn[1], ident, behind, b["seq"]))
        else:
            newest[conn] = ident
        if b["seq"] is None:  # no data (a pure ACK; a SYN shows no range)
            continue
        first = base.setdefault(conn, int(b["seq"]))
        lo, hi = (int(b["seq"]) - first) % 2**32, (int(b["end"]) - first) % 2**32
        if hi <= lo:
            continue
        ranges = sent.setdefault(conn, [])
        if any(a < hi and lo < z for a, z in ranges):
            ip["sent_twice"] += 1
            if len(events) < EVENTS_KEPT:
                events.append(_event(t, "sent twice", conn[1], ident, None, b["seq"]))
        ranges.append((lo, hi))
        if len(ranges) > 256:  # only recent bytes are sent again
            del ranges[:128]
    return out
