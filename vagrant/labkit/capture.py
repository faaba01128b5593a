"""The order the target's packets to the writers left santhrottle's qdisc: a header capture.

What it owns
    closed_loop.py --capture: tcpdump on the target's veth (in its namespace), headers of
    the packets between the storage port and the writer hosts, both ways, for one phase;
    and what that capture says.  A tap on a device sees a packet the target sends when
    the device transmits it, after the qdisc (HTB, its netem classes and glide leaves),
    so the capture's order is the order packets left santhrottle's delays; it sees a
    writer's packet when the target's stack takes it in, just before its TCP.

    order      Linux numbers the IP ID of a TCP socket's packets from one counter, in
               the order the socket sends them (ip_select_ident_segs: data, pure ACKs and
               retransmissions alike; a GSO packet takes one ID per segment; a SYN-ACK,
               sent for a request before the socket, has 0 and is left out).  Per
               connection, a packet whose ID is older than one captured before it was
               sent earlier and left later: overtaken at the qdisc.  IDs wrap at 2^16;
               "older" is within half the space.
    sent twice a data segment whose bytes had left already: a retransmission (the target's
               nstat says which kind).  Each says when: `orig_ms`, from the original
               leaving the qdisc to the copy leaving it; `ts_gap_ms`, from the target's
               TCP sending the original to sending the copy (the TCP timestamps' own
               clock, ms: a tail-loss probe's timer, 2 x srtt + 2 jiffies with more than
               one segment out, 2 x srtt + 200 ms with one, counts from the last send or
               ACK); `ack_ms`, from the original leaving the qdisc to the writer's first
               ACK of it reaching the target (None: none captured); `dsack`, whether a
               writer's D-SACK reported the bytes twice (spurious).

    A retransmission the initiator D-SACKed (spurious) whose original left in order
    was reordered after the target's veth, in the guest's own path; one whose original
    was overtaken here, by santhrottle's qdisc.  A spurious tail-loss probe whose
    original left in order: the writer's ACK took longer than the probe's timer after
    the delay (ack_ms large: the writer or the guest was late), or the timer was short
    for the delay (ts_gap_ms under twice the class's delay: srtt had not followed a
    rise).  IPv4 only (an IPv6 header has no ID).

Worked example
    lines of `tcpdump -tt -nn -v -S -r` with IDs 10, 12, 11 on one connection ->
    {"10.0.0.5": {"packets": 3, "overtaken": 1, "sent_twice": 0, "events": [{"t": ...,
    "what": "overtaken", "id": 11, "behind": 1, ...}]}}; with port=3260, the writers'
    packets to port 3260 are read for their ACKs and not counted in "packets".
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
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
ACK = re.compile(r", ack (\d+)")
TSVAL = re.compile(r"\bTS val (\d+)")
SACK = re.compile(r"\bsack \d+ ((?:\{\d+:\d+\})+)")
BLOCK = re.compile(r"\{(\d+):(\d+)\}")
ACKS_KEPT = 512  # per connection, the writer's latest cumulative ACK advances


def start(netns: str, device: str, port: int, hosts: list[str], pcap: Path) -> subprocess.Popen:
    """tcpdump on `device` in `netns`: the packets from `port` to `hosts` and theirs to
    `port`, headers only."""
    dst = " or ".join(f"dst host {h}" for h in hosts)
    src = " or ".join(f"src host {h}" for h in hosts)
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
        [
            *("ip", "netns", "exec", netns, *tcpdump),
            f"tcp and ((src port {port} and ({dst})) or (dst port {port} and ({src})))",
        ],
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


Sent = tuple[int, int, float, int | None]  # first byte, end, when it left, its TCP timestamp


@dataclass
class _Conn:
    """One connection as the capture saw it: the newest IP ID of the target's packets, its
    data ranges (from its first byte seen) with when and at which TCP timestamp each left
    first, the writer's cumulative ACK advances (t, offset), and its retransmissions'
    events (event, first byte, end, when the original left)."""

    newest: int | None = None
    base: int | None = None
    sent: list[Sent] = field(default_factory=list)
    acks: list[tuple[float, int]] = field(default_factory=list)
    twice: list[tuple[dict, int, int, float]] = field(default_factory=list)

    def rel(self, seq: int) -> int | None:
        """seq as an offset from the first byte seen; None before it (or no byte yet)."""
        if self.base is None:
            return None
        off = (seq - self.base) % 2**32
        return off if off < 2**31 else None


def _ms(s: float) -> float:
    return round(s * 1e3, 1)


def _writer_packet(c: _Conn, t: float, line: str) -> None:
    """A writer's packet to the target: its cumulative ACK (the retransmissions whose
    original it covers get ack_ms) and its D-SACK blocks (below the ACK: dsack)."""
    m = ACK.search(line)
    ack = c.rel(int(m[1])) if m else None
    if ack is None:
        return
    if not c.acks or ack > c.acks[-1][1]:
        c.acks.append((t, ack))
        del c.acks[:-ACKS_KEPT]
        for e, _, end, t_orig in c.twice:
            if e["ack_ms"] is None and ack >= end:
                e["ack_ms"] = _ms(t - t_orig)
    sack = SACK.search(line)
    for a, z in BLOCK.findall(sack[1]) if sack else ():
        lo, hi = c.rel(int(a)), c.rel(int(z))
        if lo is None or hi is None or hi > ack:  # a D-SACK block lies below the ACK
            continue
        for e, first, end, _ in c.twice:
            if first < hi and lo < end:
                e["dsack"] = True


def _sent_twice(c: _Conn, orig: Sent, t: float, ts: int | None) -> dict:
    """The timing of a copy of `orig` that left at t with TCP timestamp ts (module header)."""
    _, end, t_orig, ts_orig = orig
    ack = next((ta for ta, a in c.acks if a >= end and ta >= t_orig), None)
    return {
        "orig_ms": _ms(t - t_orig),
        "ts_gap_ms": None if ts is None or ts_orig is None else (ts - ts_orig) % 2**32,
        "ack_ms": None if ack is None else _ms(ack - t_orig),
        "dsack": False,
    }


def order(lines: Iterable[str], t0: float = 0.0, port: int | None = None) -> dict[str, dict]:
    """Per destination IP: packets captured, how many left after a packet its connection
    sent later (overtaken), how many data segments repeated bytes already sent (sent
    twice), and the first EVENTS_KEPT of both ({t, what, port, id, behind, seq}, a
    retransmission also {orig_ms, ts_gap_ms, ack_ms, dsack}; t in seconds from t0, the
    epoch time of the phase's start).  port: the target's storage port; the packets to it
    (the writers') are read for their ACKs (without it every packet is the target's)."""
    out: dict[str, dict] = {}
    conns: dict[tuple[str, int], _Conn] = {}
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
        if port is not None and int(b["dport"]) == port:
            back = conns.get((b["src"], int(b["sport"])))
            if back is not None:
                _writer_packet(back, t, line)
            continue
        conn = (b["dst"], int(b["dport"]))
        c = conns.setdefault(conn, _Conn())
        ip = out.setdefault(b["dst"], {"packets": 0, "overtaken": 0, "sent_twice": 0, "events": []})
        ip["packets"] += 1
        events = ip["events"]
        if "S" in b["flags"] or "R" in b["flags"]:  # a SYN-ACK's ID is 0, not the socket's
            continue
        if c.newest is not None and _older(ident, c.newest):
            ip["overtaken"] += 1
            if len(events) < EVENTS_KEPT:
                behind = (c.newest - ident) % ID_SPACE
                events.append(_event(t, "overtaken", conn[1], ident, behind, b["seq"]))
        else:
            c.newest = ident
        if b["seq"] is None:  # no data (a pure ACK; a SYN shows no range)
            continue
        if c.base is None:
            c.base = int(b["seq"])
        lo, hi = (int(b["seq"]) - c.base) % 2**32, (int(b["end"]) - c.base) % 2**32
        if hi <= lo:
            continue
        m = TSVAL.search(line)
        ts = int(m[1]) if m else None
        orig = next((x for x in c.sent if x[0] < hi and lo < x[1]), None)
        if orig is not None:
            ip["sent_twice"] += 1
            if len(events) < EVENTS_KEPT:
                e = _event(t, "sent twice", conn[1], ident, None, b["seq"])
                e.update(_sent_twice(c, orig, t, ts))
                events.append(e)
                c.twice.append((e, orig[0], orig[1], orig[2]))
        c.sent.append((lo, hi, t, ts))
        if len(c.sent) > 256:  # only recent bytes are sent again
            del c.sent[:128]
    return out


def timing(e: dict) -> str:
    """A retransmission's timing as the report prints it ("" for an event without one:
    an overtaken packet, a capture read before the timing was kept)."""
    if "orig_ms" not in e:
        return ""
    ack = "no ACK of it captured" if e["ack_ms"] is None else f"its ACK {e['ack_ms']:g} ms"
    tcp = "" if e["ts_gap_ms"] is None else f", {e['ts_gap_ms']} ms after it in the target's TCP"
    spurious = ", D-SACKed (spurious)" if e["dsack"] else ""
    return f"; the original left {e['orig_ms']:g} ms before{tcp}; {ack} after it left{spurious}"
