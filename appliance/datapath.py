"""The throttle data path: netem delay classes, skbinfo ipsets, static mangle rules.

Problem
    Per initiator, delay the packets the target (or bridge) sends to it by a
    chosen delay class: class k delays by k * step (0.5 ms by default), up to
    max_class (100 = 50 ms by default; the lab needs delays far past 10 ms
    against deep-queue writers).  Class 0 = unthrottled.  Changing an
    initiator's class happens every 100 ms for thousands of initiators, so it
    must be one netlink message (or one `ipset restore`), never a tc filter or
    an iptables change.

Layout in the kernel (every name identifies santhrottle; docs/datapath.md)
    tc, on the egress device facing the initiators::

        qdisc htb 5374: root default 0           ROOT_MAJOR, "St"
        class htb 5374:K   + qdisc netem K: delay K*step limit L(K)   K = 1..max_class

    Unthrottled packets take HTB's direct queue (`default 0`): a plain FIFO
    that HTB serves first, with no class lookup, token bucket or event
    queue.  In the lab (64k qd1 reads under TCG, docs/datapath.md) a tree
    with a default class (5374:ffff + pfifo) cost 5.9 / 6.1 % in two runs,
    the direct-queue tree 0.6 / 3.8 %.
    K is written in decimal and read by tc and ipset as hex, so the class
    *reads* as its number: delay class 20 is 5374:20 (= 0x20) with leaf
    qdisc 20:.  Every class has rate = ceil = the link rate: HTB only
    classifies, it never shapes (no parent class, nothing is borrowed).

    ipset: santhrottle-all, santhrottle-ack, santhrottle-read (one per
    mode; an initiator is in at most one), `hash:ip family inet counters
    skbinfo`; a member is `IP skbprio 5374:K`.  santhrottle-members, a
    `list:set` of those of the three that have members, lets the jump test
    membership with one match (the gate, below).

    iptables, table mangle (installed once with `iptables-restore --noflush`,
    so it works with the nf_tables and the legacy backend alike)::

        -A POSTROUTING -o DEV -p tcp -m multiport --sports 3260,4420
           -m set --match-set santhrottle-members dst ! --update-counters -j SANTHROTTLE
        -A SANTHROTTLE -j SET --map-set santhrottle-all dst --map-prio
        -A SANTHROTTLE -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK ACK
           -m set --match-set santhrottle-ack dst ! --update-counters
           -m bpf --bytecode "<payload == 0>" -j SET --map-set santhrottle-ack dst --map-prio
        -A SANTHROTTLE -m set --match-set santhrottle-read dst ! --update-counters
           -m bpf --bytecode "<payload == 0>" -j RETURN
        -A SANTHROTTLE -j SET --map-set santhrottle-read dst --map-prio

    A storage packet to a non-member (everyone, when nobody is throttled)
    stops at the jump; only members walk the chain.  The gate: the list:set
    holds a mode set only while it has members (listed before its first
    member goes in, unlisted after its last has left, so no member's
    packets skip the chain), because the match costs per storage packet,
    and an empty list least (lab, one vCPU, idle: the list of three cost
    reads -7.6 %, an empty list -4.3 %; docs/datapath.md).  SET
    --map-prio writes the member's skbprio into skb->priority; HTB puts a
    packet whose priority is 5374:K straight into class 5374:K (no
    filters), anything else into its direct queue.

Modes (what is delayed for a member)
    all   every packet from a storage port: throttles writes (and reads) on
          a modern kernel.  The default write mode.
    ack   pure ACKs only (TCP payload == 0, xt_bpf): the paper's method; it
          slows writes only when the initiator is window-limited (lab-notes:
          with default autotuning the cumulative ACK rides on the undelayed
          R2T / SCSI Response PDUs).
    read  payload packets only: throttles reads.

Sizing
    netem limit L(K) = max(NETEM_LIMIT_FLOOR_PKTS,
                           ceil(link_bytes_s * K * step_s / MIN_FRAME_BYTES))
    (the most packets that can sit in the class if the whole link fed it
    minimum-size frames for the class's delay: no drops; it is a cap, not an
    allocation).  HTB rate = ceil = link rate; burst = cburst =
    max(link_bytes_s * HTB_BURST_S, HTB_MIN_BURST_BYTES); quantum =
    HTB_QUANTUM_BYTES (explicit, so HTB neither warns nor clamps).

Run time
    set_classes({ip: class}) diffs against the membership it knows
    (read back from the kernel once) and sends single netlink ops for small
    change sets, one `ipset -exist restore` for large ones
    (bulk_threshold, measured by `make bench`).

Ordered descent (glide leaves)
    Moving an initiator to a *lower* class reorders its packets: those sent
    after the move overtake those still queued at the old delay.  The
    target's RACK window is min_rtt/4 (5-10 us on a LAN) while a step is
    500 us, so the overtaken segments are retransmitted (lab: 41-399 target
    retransmissions for 4 x (20 -> 10 -> 0 ms) under a 64k qd4 read).  More delay
    does not reorder by itself (but see: the order HTB serves).  So a
    descent goes through a glide leaf instead:

        class htb 5374:60II prio 7 + qdisc netem 60II: delay D rate R limit L(max)

    netem with a rate is a FIFO: a packet leaves at
    max(previous packet's departure, now + D) + its transmission time, and
    `tc qdisc change` (one RTM_NEWQDISC) keeps the queue.  An initiator
    going from class c to k < c moves into a free glide leaf first set to
    c (same delay: nothing overtakes), then the leaf's delay goes to k in
    place -- but not before c * step after the move: until then the
    packets the initiator sent before it still wait in the shared class c,
    and nothing in the leaf's FIFO holds the new ones behind them (a packet
    that enters the leaf at delay c would; one is not always there).  So
    set_classes() leaves that lowering to settle() when it is due (the
    daemon: the next tick).  Initiators going from c to k together share
    the leaf; a leaf its members fill glides again in place on the next
    step (at once when its guard time has passed), and goes up in place
    too.  settle() (every tick) hands a leaf's members to the shared class
    of its delay (or out of the set at 0) once the packets queued at the
    older, higher delay have left (c * step after the change) *and* their
    traffic has paused: the leaf, read from the kernel, has nothing queued
    and has sent nothing since settle()'s look one tick before.  (Nothing
    queued at one look is not enough: under a steady stream a packet enters
    the leaf between that look and the ipset change, and the class it is
    handed to -- HTB's direct queue at 0 -- sends the next one first.)  A
    member that never pauses rides in its leaf, which is as good as a class
    of its own; at delay 0 its packets only pass netem's rate.  The
    leaf is reused once it is empty and drained.  R = 34 Gbit/s (netem's
    u32 bytes/s) only orders the queue: the fastest it takes, so that it
    spaces a burst as little as it can (a 64 KiB packet: 15 us).  With
    every leaf busy a descent moves unordered (counted in unordered_moves).
    Same lab run through a glide leaf: 0 retransmissions.

The order HTB serves (prio)
    A move's packets stay in order only if, whenever packets of the class
    it left and of the class it entered are both due, HTB sends the old
    class's first.  HTB does not look at departure times: it serves the
    lowest prio with a packet due and round-robins within a prio, up to a
    quantum (200 kB) per class.  Both due at once is what happens when a
    dequeue runs late (softirq or timer latency: the lab's loaded guest).
    So: shared class k has prio class_prio(k), one more per doubling of
    its delay (0 for class 1, at most 6): a rise to another prio's class
    leaves the lower delay first.  A rise within one prio (12 -> 14, the
    controller's x1.25 ramp makes most of them) takes a free glide leaf
    at the new delay instead, with ordered=True.  Glide leaves have prio 7,
    after every shared class: moving into one leaves the shared class
    first.  HTB's direct queue (unthrottled) goes before everything, which
    is why nothing leaves a class for it, nor a leaf for a shared class,
    while the leaf's traffic flows (settle's look above).  What is left:
    with every leaf busy a rise within a prio takes the shared class, and
    a rise that splits a leaf's group leaves it for the shared class; both
    reorder only if a dequeue runs later than the delay they add.

Lifecycle
    apply() reconciles: it builds what is missing, changes what differs,
    adopts what a previous run left and refuses to touch a root qdisc it did
    not create.  cleanup() removes every qdisc, class, set and rule it
    created, and nothing else.

Worked example
    step 0.5 ms, max_class 100, 10 Gbit/s: 100 netem classes 5374:1 ..
    5374:100 with delays 500us .. 50ms; class 20 (10 ms) gets limit
    ceil(1.25e9 * 0.010 / 64) = 195313 packets; HTB burst 1.25 MB, quantum
    200000.  set_classes({"10.0.0.3": 20}) adds 10.0.0.3 to santhrottle-all
    with skbprio 5374:20: its iSCSI traffic is now delayed 10 ms.

Kernel access only through pyroute2 (reading tc and ipset, single ipset
ops) and the system's own tools (tc -batch, ipset restore, iptables-restore);
every binary and path is a constructor parameter.  The sync pyroute2 API
cannot run inside a running asyncio loop: call this from a thread there.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import re
import shlex
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from santhrottle.controller.domain import DELAY_STEP_S, MAX_CLASS

# ------------------------------------------------------------------ names
# The HTB root handle major, "St" in ASCII.  The skbprio major of every set
# member must equal it (HTB looks skb->priority up as a classid of its own).
ROOT_MAJOR = 0x5374
# HTB's default "class" 0: unclassified packets take HTB's direct queue
# (unthrottled, and the cheapest path through HTB: see the header).
DIRECT_MINOR = 0
CHAIN = "SANTHROTTLE"
MODES = ("all", "ack", "read")
SET_PREFIX = "santhrottle-"
SET_NAMES = {m: f"{SET_PREFIX}{m}" for m in MODES}
# list:set of the mode sets with members: "is the destination a member of
# any?" in one match (the gate: header).
MEMBERS_SET = f"{SET_PREFIX}members"
TMP_SUFFIX = "-tmp"
# Every set name we may ever create (cleanup destroys exactly these, the
# list:set first: it holds references to the others).
OWNED_SETS = (
    MEMBERS_SET,
    *SET_NAMES.values(),
    *(s + TMP_SUFFIX for s in SET_NAMES.values()),
)
DEFAULT_PORTS = (3260, 4420)  # iSCSI, NVMe/TCP
DEFAULT_WRITE_MODE = "all"  # the mode that throttles writes on a modern kernel (lab-notes)
DEFAULT_LINK_BITS_S = 10_000_000_000
DEFAULT_MAXELEM = 65536  # ipset members per set

# ------------------------------------------------------------------ limits
# Class minors are the class number's decimal digits read as hex and the
# leaf qdisc takes the same number as its handle major: it must stay below
# the root's 5374.  5000 classes of 0.5 ms are 2.5 s of delay.
MAX_CLASS_LIMIT = 5000
# iptables multiport takes at most 15 ports.
MAX_PORTS = 15
# Delays are microseconds: netem's resolution that matters here.
MIN_STEP_US = 1
# Kernel packet scheduler tick: PSCHED_SHIFT = 6 -> 64 ns (HTB buffers and
# netem's legacy latency field are in these ticks).
PSCHED_TICK_NS = 64

# ------------------------------------------------------------------ sizing
# netem limit: packets that fit in the class's delay at link rate if every
# frame were minimum-size (64 B Ethernet): no drops whatever the traffic mix.
MIN_FRAME_BYTES = 64
# ... and never below the usual 1000 packets of a txqueue.
NETEM_LIMIT_FLOOR_PKTS = 1000
# HTB burst: 1 ms at link rate absorbs softirq/timer latency up to 1 ms
# without HTB holding traffic below the link rate; at least two 64 KiB GSO
# packets.  10 Gbit -> 1.25 MB, 25 Gbit -> 3.125 MB, 100 Gbit -> 12.5 MB.
HTB_BURST_S = 0.001
HTB_MIN_BURST_BYTES = 2 * 65536
# Glide leaves (ordered descent, see the header): HTB minors 0x6000 + i,
# above every class minor (<= 0x5000) and the root's 0x5374; the leaf
# qdisc takes the same number as its handle major.
GLIDE_MINOR_BASE = 0x6000
DEFAULT_GLIDE_LEAVES = 8
MAX_GLIDE_LEAVES = 256
# A glide leaf's netem `rate` only keeps its queue in order (a packet leaves
# after the one before it); it also spaces a burst by each packet's time at
# that rate, so it is the fastest TCA_NETEM_RATE takes whatever the link:
# a u32 of bytes/s (34 Gbit/s: a 64 KiB GSO packet in 15 us).
NETEM_RATE_MAX_BYTES_S = 2**32 - 1
# HTB prio of the glide leaves: served after every shared class (header:
# the order HTB serves).  HTB has prios 0-7.
GLIDE_PRIO = 7
# HTB quantum (bytes per DRR round among the classes of one prio that have a
# packet due: header, the order HTB serves); explicit so HTB neither computes rate/r2q
# (125 MB at 10 Gbit, clamped with a kernel warning per class) nor warns.
# 200000 is the kernel's own upper clamp and covers 64 KiB GSO and BIG TCP.
HTB_QUANTUM_BYTES = 200_000

# ---------------------------------------------------------------- matchers
# Exact pure-ACK test (TCP payload == 0) as xt_bpf bytecode (lab-notes.md):
#   ldb [9]; jne #6 -> 0; ldxb 4*([0]&0xf); ldh [2]; sub x; st M0;
#   ldb [x+12]; and #0xf0; rsh #2; tax; ld M0; sub x; jeq #0 -> 1 else 0
# i.e. ip.tot_len - ihl*4 - tcp.doff*4 == 0.  xt_bpf cannot be negated: the
# read rule follows a RETURN for these packets.
PURE_ACK_BPF = (
    "15,48 0 0 9,21 0 12 6,177 0 0 0,40 0 0 2,28 0 0 0,2 0 0 0,80 0 0 12,84 0 0 240,"
    "116 0 0 2,7 0 0 0,96 0 0 0,28 0 0 0,21 0 1 0,6 0 0 1,6 0 0 0"
)
# The flags iptables -S prints for "pure ACK": ACK set, FIN/SYN/RST clear.
PURE_ACK_FLAGS = "--tcp-flags FIN,SYN,RST,ACK ACK"

# ------------------------------------------------------------- run time
# Change sets up to this size go as single netlink ops (~0.17-0.2 ms each,
# no process start); larger ones as one `ipset -exist restore` (one process:
# ~2-3 ms + a few us per line).  `make bench` measured the restore winning
# from 16 changes on (tests/bench/bench_datapath.py, docs/datapath.md).
BULK_THRESHOLD = 16
# Above it, two ways: `ipset -exist restore` into the live set sends one
# netlink round trip per line (strace: 10,081 sendto for 10,000 lines,
# ~5 us each here), while filling a temporary set created in the same
# restore is batched (85 messages for 10,000 members, ~2.5 us each) and then
# swapped in.  So the affected sets are rebuilt + swapped when that rewrites
# at most this many members per changed one, else changed in place.
SWAP_LINES_PER_INPLACE_LINE = 2.0

NETNS_DIR = "/run/netns"
# ipset netlink: list headers only (`ipset list -t`); create flags.
IPSET_FLAG_LIST_HEADER = 1 << 2
IPSET_FLAG_WITH_COUNTERS = 1 << 3
IPSET_FLAG_WITH_SKBINFO = 1 << 6


class DatapathError(Exception):
    """One line for the admin (the CLI prints it and exits 2)."""


class NetemMissing(DatapathError):
    """The kernel has no sch_netem."""


class ForeignQdisc(DatapathError):
    """The device's root qdisc belongs to someone else."""


class NotApplied(DatapathError):
    """The data path is not installed (nothing to pin into)."""


# =================================================================== units
_DELAY_RE = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_UNIT_US = {"us": 1, "ms": 1000, "s": 1_000_000}
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$", re.IGNORECASE)
_RATE_MULT = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def parse_delay_us(text: str) -> int:
    """'5ms' -> 5000, '500us' -> 500, '1.5ms' -> 1500, '0' -> 0; strict.

    A unit is required (except for a bare 0); the value must be a whole
    number of microseconds."""
    t = text.strip()
    if t == "0":
        return 0
    m = _DELAY_RE.match(t)
    if not m:
        raise DatapathError(
            f"bad delay {text!r}: expected a number with a unit us, ms or s (e.g. 5ms, 500us)"
        )
    num, unit = m.groups()
    # exact decimal arithmetic: '0.0005s' must not become 499.99999 us
    whole, _, frac = num.partition(".")
    scale = _UNIT_US[unit]
    digits = len(frac)
    value = int(whole + frac) * scale
    if value % (10**digits):
        raise DatapathError(f"bad delay {text!r}: finer than 1us")
    return value // (10**digits)


def fmt_us(us: int) -> str:
    """500 -> '500us', 5000 -> '5ms', 1500 -> '1.5ms', 2_000_000 -> '2s', 0 -> '0'."""
    if us == 0:
        return "0"
    if us % 1_000_000 == 0:
        return f"{us // 1_000_000}s"
    if us >= 1000 and us % 100 == 0:
        return f"{us / 1000:g}ms"
    return f"{us}us"


def parse_rate_bits(text: str) -> int:
    """'10gbit' -> 10_000_000_000 (bits per second, tc's units); strict."""
    m = _RATE_RE.match(text.strip())
    if not m:
        raise DatapathError(f"bad link speed {text!r}: expected e.g. 10gbit, 25gbit, 100gbit")
    num, unit = m.groups()
    bits = round(float(num) * _RATE_MULT[unit.lower()])
    if bits < 1_000_000:
        raise DatapathError(f"bad link speed {text!r}: below 1mbit")
    return bits


def parse_ports(text: str) -> tuple[int, ...]:
    """'3260,4420' -> (3260, 4420); strict, at most MAX_PORTS, no duplicates."""
    out: list[int] = []
    for part in text.split(","):
        p = part.strip()
        if not p.isdigit() or not 1 <= int(p) <= 65535:
            raise DatapathError(f"bad port {part!r} in {text!r}: expected 1-65535")
        if int(p) in out:
            raise DatapathError(f"port {p} given twice in {text!r}")
        out.append(int(p))
    return check_ports(out)


def check_ports(ports: Iterable[int]) -> tuple[int, ...]:
    ps = tuple(int(p) for p in ports)
    if not ps:
        raise DatapathError("no storage ports given")
    if len(ps) > MAX_PORTS:
        raise DatapathError(f"{len(ps)} storage ports: iptables multiport takes at most 15")
    for p in ps:
        if not 1 <= p <= 65535:
            raise DatapathError(f"bad port {p}: expected 1-65535")
    if len(set(ps)) != len(ps):
        raise DatapathError(f"duplicate storage ports in {ps}")
    return ps


def check_ip(ip: str) -> str:
    """The canonical form of an IPv4 address, or a one-line error."""
    try:
        return str(ipaddress.IPv4Address(ip))
    except ValueError:
        raise DatapathError(f"bad initiator address {ip!r}: expected an IPv4 address") from None


def _is_canonical_ipv4(ip: str) -> bool:
    """Fast path of check_ip for the 10,000-member convergence (~0.3 us vs
    ~2 us for ipaddress): dotted quad exactly as the kernel prints it."""
    try:
        return socket.inet_ntop(socket.AF_INET, socket.inet_pton(socket.AF_INET, ip)) == ip
    except (OSError, TypeError):
        return False


def delay_to_class(delay_us: int, step_us: int, max_class: int) -> int:
    """The class whose delay is exactly delay_us; anything else is an error
    naming the neighbours (no silent rounding: the admin asked for a delay)."""
    if delay_us < 0:
        raise DatapathError(f"bad delay {fmt_us(delay_us)}: negative")
    k, rem = divmod(delay_us, step_us)
    if rem:
        lo, hi = k * step_us, (k + 1) * step_us
        raise DatapathError(
            f"delay {fmt_us(delay_us)} is not a multiple of the step {fmt_us(step_us)}: "
            f"use {fmt_us(lo)} or {fmt_us(hi)}"
        )
    if k > max_class:
        raise DatapathError(
            f"delay {fmt_us(delay_us)} is above the maximum {fmt_us(max_class * step_us)} "
            f"(class {max_class} of {fmt_us(step_us)})"
        )
    return k


# ============================================================ class naming
def class_minor(k: int) -> int:
    """Delay class k -> HTB minor: k's decimal digits read as hex (20 -> 0x20)."""
    if not 1 <= k <= MAX_CLASS_LIMIT:
        raise ValueError(f"class {k} outside 1..{MAX_CLASS_LIMIT}")
    return int(str(k), 16)


def minor_class(minor: int) -> int | None:
    """HTB minor -> delay class, None for a minor that is not a class number."""
    s = f"{minor:x}"
    if not s.isdigit():
        return None
    k = int(s)
    return k if 1 <= k <= MAX_CLASS_LIMIT else None


def minor_classid(minor: int) -> str:
    return f"{ROOT_MAJOR:x}:{minor:x}"


def classid(k: int) -> str:
    """'5374:20' for class 20; '5374:0' for class 0 (HTB's direct queue, unthrottled)."""
    return minor_classid(DIRECT_MINOR if k == 0 else class_minor(k))


# ================================================================== sizing
@dataclass(frozen=True, slots=True)
class HtbParams:
    """One HTB class, in the kernel's units (bytes, bytes/s)."""

    rate_bytes_s: int
    ceil_bytes_s: int
    burst_bytes: int
    cburst_bytes: int
    quantum_bytes: int
    prio: int = 0  # HTB serves a ready packet of a lower prio first (see class_prio)

    def tc_args(self) -> str:
        return (
            f"rate {self.rate_bytes_s * 8}bit ceil {self.ceil_bytes_s * 8}bit "
            f"burst {self.burst_bytes}b cburst {self.cburst_bytes}b quantum {self.quantum_bytes} "
            f"prio {self.prio}"
        )

    def close_to(self, other: HtbParams) -> bool:
        """Equal up to the kernel's tick rounding of burst/cburst."""

        def near(a: int, b: int, rate: int) -> bool:
            tol = max(0.01 * b, rate * PSCHED_TICK_NS * 1e-9 + 2)
            return abs(a - b) <= tol

        return (
            self.rate_bytes_s == other.rate_bytes_s
            and self.ceil_bytes_s == other.ceil_bytes_s
            and self.quantum_bytes == other.quantum_bytes
            and self.prio == other.prio
            and near(self.burst_bytes, other.burst_bytes, self.rate_bytes_s)
            and near(self.cburst_bytes, other.cburst_bytes, self.ceil_bytes_s)
        )


def htb_params(link_bits_s: int, prio: int = 0) -> HtbParams:
    """HTB parameters for a link: rate = ceil = link rate, burst 1 ms of it."""
    rate = link_bits_s // 8
    burst = max(math.ceil(rate * HTB_BURST_S), HTB_MIN_BURST_BYTES)
    return HtbParams(rate, rate, burst, burst, HTB_QUANTUM_BYTES, prio)


def class_prio(k: int) -> int:
    """HTB prio of shared delay class k (header: the order HTB serves):
    0 for class 1, one more per doubling of the delay, at most
    GLIDE_PRIO - 1 -- a lower delay is served first."""
    return min(k.bit_length() - 1, GLIDE_PRIO - 1)


def netem_limit(link_bits_s: int, delay_us: int) -> int:
    """Packets a netem leaf must hold so that link rate x delay never overflows it."""
    pkts = math.ceil(link_bits_s / 8 * delay_us * 1e-6 / MIN_FRAME_BYTES)
    return max(NETEM_LIMIT_FLOOR_PKTS, pkts)


# ============================================================== the tc tree
@dataclass(frozen=True, slots=True)
class Leaf:
    """A leaf qdisc under one of our classes."""

    kind: str  # netem | pfifo (pfifo: test leaf on kernels without netem)
    handle_major: int
    limit: int
    delay_us: int | None = None  # netem only; None in a wanted glide leaf (run-time state)
    rate_bytes_s: int = 0  # netem rate: glide leaves only (0 = none)

    def tc_args(self) -> str:
        if self.kind != "netem":
            return f"{self.kind} limit {self.limit}"
        rate = f" rate {self.rate_bytes_s * 8}bit" if self.rate_bytes_s else ""
        return f"netem delay {self.delay_us or 0}us{rate} limit {self.limit}"

    def same(self, other: Leaf) -> bool:
        if (self.kind, self.handle_major, self.limit) != (
            other.kind,
            other.handle_major,
            other.limit,
        ):
            return False
        if self.kind != "netem":
            return True
        # a wanted glide leaf's delay (None) is whatever the kernel has now
        delay_ok = None in (self.delay_us, other.delay_us) or self.delay_us == other.delay_us
        return self.rate_bytes_s == other.rate_bytes_s and delay_ok


@dataclass(slots=True)
class TcTree:
    """Our part of a device's qdisc tree, as wanted or as observed."""

    root_kind: str | None  # None: no root qdisc seen (or the kernel's default)
    root_major: int  # 0: the kernel's default root (handle 0:)
    default_minor: int | None = None
    classes: dict[int, HtbParams] = field(default_factory=dict)  # minor -> params
    leaves: dict[int, Leaf] = field(default_factory=dict)  # class minor -> leaf

    @property
    def ours(self) -> bool:
        return self.root_kind == "htb" and self.root_major == ROOT_MAJOR

    @property
    def kernel_default(self) -> bool:
        return self.root_major == 0


def glide_minor(i: int) -> int:
    return GLIDE_MINOR_BASE + i


def is_glide_minor(minor: int) -> bool:
    return GLIDE_MINOR_BASE <= minor < GLIDE_MINOR_BASE + MAX_GLIDE_LEAVES


def glide_leaf(kind: str, minor: int, link_bits_s: int, max_delay_us: int) -> Leaf:
    """A glide leaf as wanted: sized for the largest delay, its delay run-time state."""
    rate = NETEM_RATE_MAX_BYTES_S if kind == "netem" else 0
    return Leaf(kind, minor, netem_limit(link_bits_s, max_delay_us), None, rate)


def desired_tree(
    step_us: int, max_class: int, link_bits_s: int, leaf: str = "netem", glides: int = 0
) -> TcTree:
    t = TcTree("htb", ROOT_MAJOR, DIRECT_MINOR)
    netem = leaf == "netem"
    for k in range(1, max_class + 1):
        minor = class_minor(k)
        t.classes[minor] = htb_params(link_bits_s, class_prio(k))
        delay = k * step_us
        limit_k = netem_limit(link_bits_s, delay)
        t.leaves[minor] = Leaf(leaf, minor, limit_k, delay if netem else None)
    for i in range(glides):
        minor = glide_minor(i)
        t.classes[minor] = htb_params(link_bits_s, GLIDE_PRIO)
        t.leaves[minor] = glide_leaf(leaf, minor, link_bits_s, max_class * step_us)
    return t


def render_tc_plan(device: str, want: TcTree, have: TcTree | None) -> list[str]:
    """`tc -batch` lines that turn `have` into `want` (both ours, or have not ours).

    A fresh build when the device has no tree of ours; otherwise only the
    differences: add what is missing, change/replace what differs (in place:
    packets queued in a netem leaf stay), delete classes that are no longer
    wanted (after everything else)."""
    dev = device
    root = f"{ROOT_MAJOR:x}:"
    fresh = have is None or not have.ours
    lines: list[str] = []
    if (
        not fresh
        and have is not None
        and (
            have.default_minor != want.default_minor
            or any(
                m in have.classes and have.classes[m].prio != hp.prio
                for m, hp in want.classes.items()
            )
        )
    ):
        # HTB cannot change its default class in place, nor an active class's
        # prio (the class stays in the round-robin row of its old prio): rebuild
        lines.append(f"qdisc del dev {dev} root")
        fresh = True
    if fresh:
        lines.append(f"qdisc add dev {dev} root handle {root} htb default {want.default_minor:x}")
    have_classes = {} if fresh or have is None else have.classes
    have_leaves = {} if fresh or have is None else have.leaves
    order = sorted(want.classes, key=lambda m: (m != want.default_minor, minor_class(m) or m))
    for minor in order:
        hp = want.classes[minor]
        cid = minor_classid(minor)
        old = have_classes.get(minor)
        if old is None:
            lines.append(f"class add dev {dev} parent {root} classid {cid} htb {hp.tc_args()}")
        elif not old.close_to(hp):
            lines.append(f"class change dev {dev} parent {root} classid {cid} htb {hp.tc_args()}")
        leaf = want.leaves.get(minor)
        if leaf is None:
            continue
        old_leaf = have_leaves.get(minor)
        if old_leaf is None:
            verb = "add"
        elif not old_leaf.same(leaf):
            verb = "replace"  # same handle + kind: changed in place
        else:
            continue
        lines.append(
            f"qdisc {verb} dev {dev} parent {cid} handle {leaf.handle_major:x}: {leaf.tc_args()}"
        )
    for minor in sorted(set(have_classes) - set(want.classes)):
        lines.append(f"class del dev {dev} classid {ROOT_MAJOR:x}:{minor:x}")
    return lines


def _attrs(options: Any) -> dict[str, Any]:
    """pyroute2 nested attrs ({'attrs': [(name, value), ...]}) -> dict."""
    if not isinstance(options, dict):
        return {}
    out = {k: v for k, v in options.items() if k != "attrs"}
    for item in options.get("attrs", []):
        out[item[0]] = item[1]
    return out


def _basic_stats(rec: Mapping[str, Any]) -> tuple[int, int]:
    """(packets, bytes) of a tc record's basic stats."""
    b = _attrs(rec.get("stats")).get("TCA_STATS_BASIC") or {}
    return int(b.get("packets", 0)), int(b.get("bytes", 0))


def _queued(rec: Mapping[str, Any]) -> int:
    """Packets queued in a tc record's class (an HTB class: its leaf's qlen)."""
    q = _attrs(rec.get("stats")).get("TCA_STATS_QUEUE") or {}
    return int(q.get("qlen", 0))


def observe_tree(
    qdiscs: Sequence[Mapping[str, Any]], classes: Sequence[Mapping[str, Any]]
) -> TcTree:
    """Our view of a device's tree from plain records of its qdiscs and classes.

    Records: {"handle": int, "parent": int, "kind": str, "options": <pyroute2
    TCA_OPTIONS as dict>} (see _tc_record).  Only the root and, when the root
    is ours, its classes and their leaves are looked at."""
    root = next((q for q in qdiscs if q["parent"] == 0xFFFFFFFF), None)
    if root is None:
        return TcTree(None, 0)
    major = root["handle"] >> 16
    t = TcTree(root["kind"], major)
    if not t.ours:
        return t
    init = _attrs(root.get("options")).get("TCA_HTB_INIT") or {}
    t.default_minor = init.get("defcls")
    for c in classes:
        h = c["handle"]
        if h >> 16 != ROOT_MAJOR or c.get("kind") != "htb":
            continue
        o = _attrs(c.get("options"))
        p = o.get("TCA_HTB_PARMS") or {}
        rate = o.get("TCA_HTB_RATE64") or p.get("rate", 0)
        ceil = o.get("TCA_HTB_CEIL64") or p.get("ceil", 0)

        def burst(ticks: int, r: int) -> int:
            return round(ticks * PSCHED_TICK_NS * 1e-9 * r)

        t.classes[h & 0xFFFF] = HtbParams(
            rate,
            ceil,
            burst(p.get("buffer", 0), rate),
            burst(p.get("cbuffer", 0), ceil),
            p.get("quantum", 0),
            p.get("prio", 0),
        )
    for q in qdiscs:
        parent = q["parent"]
        if parent == 0xFFFFFFFF or parent >> 16 != ROOT_MAJOR:
            continue
        minor = parent & 0xFFFF
        opts = q.get("options")
        if q["kind"] == "netem":
            o = _attrs(opts)
            ticks = o.get("delay", 0)
            delay_us = round(ticks * PSCHED_TICK_NS / 1000)
            rate = int((o.get("TCA_NETEM_RATE") or {}).get("rate", 0))
            t.leaves[minor] = Leaf("netem", q["handle"] >> 16, o.get("limit", 0), delay_us, rate)
        else:
            o = _attrs(opts)
            t.leaves[minor] = Leaf(q["kind"], q["handle"] >> 16, o.get("limit", 0))
    return t


# ========================================================== iptables rules
def _member_match(name: str) -> str:
    """A set match that leaves the member counters alone (only the SET
    targets count, so a member's counters are the packets it had delayed)."""
    return f"-m set --match-set {name} dst ! --update-counters"


def render_chain_rules() -> list[str]:
    """The chain's rules exactly as `iptables -t mangle -S SANTHROTTLE` prints them.

    Only storage-port packets to members reach the chain (the jump matches
    the ports and santhrottle-members).  The pure-ACK program runs only for
    members of the ack and read sets."""
    bpf = f'-m bpf --bytecode "{PURE_ACK_BPF}"'

    def mapset(mode: str) -> str:
        return f"-j SET --map-set {SET_NAMES[mode]} dst --map-prio"

    ack, read = _member_match(SET_NAMES["ack"]), _member_match(SET_NAMES["read"])
    return [
        f"-A {CHAIN} {mapset('all')}",
        f"-A {CHAIN} -p tcp -m tcp {PURE_ACK_FLAGS} {ack} {bpf} {mapset('ack')}",
        f"-A {CHAIN} {read} {bpf} -j RETURN",
        f"-A {CHAIN} {mapset('read')}",
    ]


def jump_rule(device: str, ports: Sequence[int]) -> str:
    """The one rule outside our chain, as -S prints it.  A storage packet to
    a non-member stops here: one list:set match (an empty list when nobody
    is throttled), no jump."""
    sp = ",".join(str(p) for p in ports)
    return (
        f"-A POSTROUTING -o {device} -p tcp -m multiport --sports {sp} "
        f"{_member_match(MEMBERS_SET)} -j {CHAIN}"
    )


def render_rules_restore(
    device: str, ports: Sequence[int], jumps: Sequence[str], chain_rules: Sequence[str] | None
) -> str | None:
    """iptables-restore --noflush input converging the mangle table, or None
    when it already is as wanted.  `jumps`: the POSTROUTING rules (as -S
    prints them) that jump to our chain; `chain_rules`: our chain's rules as
    -S prints them, None when the chain does not exist.

    Only this device's jump is managed: the data path may run on several
    egress devices that share the sets and the chain (cleanup removes all)."""
    want_rules = render_chain_rules()
    want_jump = jump_rule(device, ports)
    own = [j for j in jumps if parse_jump_device(j) == device]
    chain_ok = chain_rules is not None and list(chain_rules) == want_rules
    if chain_ok and own == [want_jump]:
        return None
    lines = ["*mangle"]
    if not chain_ok:
        # Declaring the chain creates it, or flushes it; then its rules.
        lines.append(f":{CHAIN} - [0:0]")
    for j in own:
        if j != want_jump or own.count(j) > 1:
            lines.append("-D" + j[2:])
    if own.count(want_jump) != 1:
        # -I: first in POSTROUTING, so no earlier ACCEPT/RETURN hides it.
        lines.append("-I" + want_jump[2:])
    if not chain_ok:
        lines += want_rules
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def render_rules_cleanup(jumps: Sequence[str], chain_exists: bool) -> str | None:
    if not jumps and not chain_exists:
        return None
    lines = ["*mangle"]
    lines += ["-D" + j[2:] for j in jumps]
    if chain_exists:
        lines += [f":{CHAIN} - [0:0]", f"-X {CHAIN}"]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def parse_mangle_rules(text: str) -> tuple[list[str], list[str] | None]:
    """From `iptables -t mangle -S`: (POSTROUTING jumps to our chain, our
    chain's rules or None when the chain does not exist)."""
    jumps: list[str] = []
    rules: list[str] = []
    exists = False
    for line in text.splitlines():
        line = line.strip()
        if line == f"-N {CHAIN}":
            exists = True
        elif line.startswith("-A POSTROUTING ") and line.endswith(f"-j {CHAIN}"):
            jumps.append(line)
        elif line.startswith(f"-A {CHAIN} "):
            rules.append(line)
    return jumps, (rules if exists else None)


def parse_backend(version_text: str) -> str:
    """'iptables v1.8.9 (nf_tables)' -> 'nf_tables'; '(legacy)' -> 'legacy'."""
    m = re.search(r"\((nf_tables|legacy)\)", version_text)
    if m:
        return m.group(1)
    if re.search(r"iptables v1\.[0-7]\.", version_text):
        return "legacy"  # before 1.8 there was only x_tables
    return "unknown"


def parse_jump_device(jump: str) -> str | None:
    m = re.search(r"(?:^| )-o (\S+)", jump)
    return m.group(1) if m else None


def parse_rule_ports(rules: Sequence[str]) -> tuple[int, ...] | None:
    """The storage ports of our jump rule (or of any rule given)."""
    for r in rules:
        m = re.search(r"--sports (\S+)", r)
        if m:
            return tuple(int(p) for p in m.group(1).split(","))
    return None


# =============================================================== ipset text
def render_ipset_changes(ops: Sequence[tuple[str, str, str, int]]) -> str:
    """`ipset -exist restore` input: ("add"|"del", set, ip, HTB minor) per line."""
    ids: dict[int, str] = {}
    out = []
    for op, name, ip, minor in ops:
        if op == "add":
            cid = ids.get(minor)
            if cid is None:
                cid = ids[minor] = minor_classid(minor)
            out.append(f"add {name} {ip} skbprio {cid}")
        else:
            out.append(f"del {name} {ip}")
    out.append("")
    return "\n".join(out)


_SET_MODE = {name: mode for mode, name in SET_NAMES.items()}


def _members_after(
    members: Mapping[str, tuple[str, int]], ops: Sequence[tuple[str, str, str, int]]
) -> dict[str, tuple[str, int]]:
    """The membership (ip -> (mode, HTB minor)) once ops are applied."""
    out = dict(members)
    set_mode = _SET_MODE
    for op, name, ip, minor in ops:
        mode = set_mode[name]
        if op == "del":
            cur = out.get(ip)
            if cur is not None and cur[0] == mode:
                del out[ip]
        else:
            out[ip] = (mode, minor)
    return out


def render_ipset_swap(mode: str, members: Mapping[str, int], maxelem: int) -> str:
    """`ipset restore` input that replaces a mode's set atomically: build a
    temporary set, swap it in, destroy the old contents.  members: ip -> HTB minor."""
    name = SET_NAMES[mode]
    tmp = name + TMP_SUFFIX
    # sized up front: no rehashing while the members go in
    hashsize = max(1024, 1 << max(0, (len(members) // 4 - 1).bit_length()))
    ids: dict[int, str] = {}
    lines = [
        f"create {tmp} hash:ip family inet hashsize {hashsize} maxelem {maxelem} counters skbinfo"
    ]
    for ip, minor in members.items():
        cid = ids.get(minor)
        if cid is None:
            cid = ids[minor] = minor_classid(minor)
        lines.append(f"add {tmp} {ip} skbprio {cid}")
    lines += [f"swap {tmp} {name}", f"destroy {tmp}", ""]
    return "\n".join(lines)


# ===================================================== kernel feature checks
def module_available(
    name: str,
    sys_module_dir: str = "/sys/module",
    modules_dir: str = "/lib/modules",
    release: str | None = None,
) -> bool | None:
    """True: loaded or built in (per /sys/module, modules.builtin) or loadable
    (modules.dep); False: the module tree says it is neither; None: cannot
    tell (no module tree for this kernel: built-ins without parameters do
    not show in /sys/module)."""
    if os.path.isdir(os.path.join(sys_module_dir, name)):
        return True
    rel = release or os.uname().release
    base = os.path.join(modules_dir, rel)
    found_tree = False
    for fname in ("modules.builtin", "modules.dep"):
        path = os.path.join(base, fname)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                found_tree = True
                for line in f:
                    mod = line.split(":", 1)[0].strip().rsplit("/", 1)[-1]
                    for ext in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
                        if mod.endswith(ext):
                            mod = mod[: -len(ext)]
                            break
                    if mod.replace("-", "_") == name:
                        return True
        except OSError:
            continue
    return False if found_tree else None


NETEM_MISSING_MSG = (
    "this kernel has no sch_netem (the netem qdisc the delay classes need): "
    "load it with `modprobe sch_netem` or use a kernel built with CONFIG_NET_SCH_NETEM"
)


# ================================================================ the adapter
@dataclass(frozen=True, slots=True)
class Member:
    ip: str
    mode: str
    klass: int
    packets: int = 0
    bytes: int = 0


@dataclass(slots=True)
class Glide:
    """A glide leaf's run-time state (see the header: ordered descent)."""

    minor: int
    klass: int = 0  # its netem delay now, in classes
    members: set[str] = field(default_factory=set)
    # monotonic s: until then it still holds packets of a higher delay it had
    # (or of members that left): not to be dissolved or reused before.
    busy_until_s: float = 0.0
    # monotonic s: until then its members' packets from before they moved in
    # may still wait in their shared class: its delay must not go down yet;
    # lower_to is the class settle() lowers it to then.
    lower_at_s: float = 0.0
    lower_to: int | None = None
    # packets the leaf had sent at settle()'s last look while it was due to
    # hand its members on: unchanged (and none queued) = their traffic paused
    sent_seen: int | None = None


@dataclass(slots=True)
class ApplyReport:
    backend: str
    tc_lines: int = 0  # tc batch commands sent (0 = the tree was adopted as is)
    tc_fresh: bool = False
    sets_created: list[str] = field(default_factory=list)
    rules_changed: bool = False
    clamped: dict[str, int] = field(default_factory=dict)  # ip -> new class
    timings_s: dict[str, float] = field(default_factory=dict)  # step -> seconds

    def summary(self) -> str:
        tc = (
            f"tc: built {self.tc_lines} objects"
            if self.tc_fresh
            else (f"tc: {self.tc_lines} changes" if self.tc_lines else "tc: adopted")
        )
        sets = (
            f"sets: created {', '.join(self.sets_created)}"
            if self.sets_created
            else "sets: adopted"
        )
        rules = "rules: installed" if self.rules_changed else "rules: adopted"
        out = f"{tc}; {sets}; {rules} (iptables {self.backend} backend)"
        if self.clamped:
            out += f"; {len(self.clamped)} members clamped to the new maximum class"
        return out


@dataclass(slots=True)
class CleanupReport:
    qdiscs: list[str] = field(default_factory=list)  # devices whose root we deleted
    sets: list[str] = field(default_factory=list)
    rules: int = 0  # jump rules removed
    chain: bool = False
    nft_table: bool = False

    def summary(self) -> str:
        if not (self.qdiscs or self.sets or self.rules or self.chain or self.nft_table):
            return "nothing of santhrottle's was installed"
        parts = []
        if self.qdiscs:
            parts.append(f"root qdisc {ROOT_MAJOR:x}: on {', '.join(self.qdiscs)}")
        if self.sets:
            parts.append(f"sets {', '.join(self.sets)}")
        if self.chain or self.rules:
            parts.append(f"chain {CHAIN} and {self.rules} jump rule(s)")
        if self.nft_table:
            parts.append("the empty nft table ip mangle iptables-nft had created")
        return "removed " + "; ".join(parts)


def _last_line(text: str) -> str:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1] if lines else "(no output)"


class Datapath:
    """The actuator's kernel adapter for one egress device (see module doc)."""

    def __init__(
        self,
        device: str | None,
        ports: Sequence[int] = DEFAULT_PORTS,
        step_s: float = DELAY_STEP_S,
        max_class: int = MAX_CLASS,
        link_bits_s: int = DEFAULT_LINK_BITS_S,
        write_mode: str = DEFAULT_WRITE_MODE,
        *,
        netns: str | None = None,
        leaf: str = "netem",
        glide_leaves: int = DEFAULT_GLIDE_LEAVES,
        maxelem: int = DEFAULT_MAXELEM,
        bulk_threshold: int = BULK_THRESHOLD,
        tc_bin: str = "tc",
        ipset_bin: str = "ipset",
        iptables_bin: str = "iptables",
        iptables_restore_bin: str = "iptables-restore",
        nsenter_bin: str = "nsenter",
        unshare_bin: str = "unshare",
        netns_dir: str = NETNS_DIR,
        sys_module_dir: str = "/sys/module",
        modules_dir: str = "/lib/modules",
        command_timeout_s: float = 60.0,
    ) -> None:
        self.device = device
        self.ports = check_ports(ports)
        step_us = round(step_s * 1e6)
        if step_us < MIN_STEP_US or abs(step_us - step_s * 1e6) > 1e-6:
            raise DatapathError(f"bad step {step_s!r} s: must be a whole number of microseconds")
        self.step_us = step_us
        if not 1 <= max_class <= MAX_CLASS_LIMIT:
            raise DatapathError(f"bad maximum class {max_class}: must be 1-{MAX_CLASS_LIMIT}")
        self.max_class = max_class
        self.link_bits_s = int(link_bits_s)
        if write_mode not in ("all", "ack"):
            raise DatapathError(f"bad write mode {write_mode!r}: expected all or ack")
        self.write_mode = write_mode
        if leaf not in ("netem", "pfifo"):
            raise DatapathError(f"bad leaf {leaf!r}: expected netem (or pfifo for tests)")
        self.leaf = leaf
        if not 0 <= glide_leaves <= MAX_GLIDE_LEAVES:
            raise DatapathError(
                f"bad glide leaf count {glide_leaves}: must be 0-{MAX_GLIDE_LEAVES}"
            )
        self.glide_leaves = glide_leaves
        # Devices whose glide leaves follow this one's (all egress devices
        # share the sets, so the same skbprio must mean the same delay on each).
        self.glide_devices: list[str] = [device] if device else []
        self.netns = netns
        self.maxelem = maxelem
        self.bulk_threshold = bulk_threshold
        self.tc_bin = tc_bin
        self.ipset_bin = ipset_bin
        self.iptables_bin = iptables_bin
        self.iptables_restore_bin = iptables_restore_bin
        self.nsenter_bin = nsenter_bin
        self.unshare_bin = unshare_bin
        self.netns_dir = netns_dir
        self.sys_module_dir = sys_module_dir
        self.modules_dir = modules_dir
        self.command_timeout_s = command_timeout_s
        self._ipr: Any = None
        self._ipset: Any = None
        self._members: dict[str, tuple[str, int]] | None = None  # ip -> (mode, HTB minor)
        self._gated: set[str] | None = None  # the mode sets the gate list:set holds now
        self._glides: dict[int, Glide] = {}  # minor -> state
        self.glided = 0  # initiators moved down through a glide leaf
        self.unordered_moves = 0  # descents made without a glide leaf (all busy)
        self.clock = time.monotonic

    # ------------------------------------------------------------ plumbing
    @property
    def step_s(self) -> float:
        return self.step_us / 1e6

    def __enter__(self) -> Datapath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for s in (self._ipr, self._ipset):
            if s is not None:
                with contextlib.suppress(Exception):
                    s.close()
        self._ipr = self._ipset = None

    def _netns_path(self) -> str | None:
        if self.netns is None:
            return None
        path = self.netns if "/" in self.netns else os.path.join(self.netns_dir, self.netns)
        if not os.path.exists(path):
            raise DatapathError(f"no network namespace {self.netns} ({path})")
        return path

    def _cmd(self, argv: Sequence[str]) -> list[str]:
        path = self._netns_path()
        if path is None:
            return list(argv)
        return [self.nsenter_bin, f"--net={path}", *argv]

    def _run(self, argv: Sequence[str], stdin: str | None = None, what: str | None = None) -> str:
        cmd = self._cmd(argv)
        try:
            p = subprocess.run(
                cmd,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.command_timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise DatapathError(f"{cmd[0]} not found (install it or pass its path)") from None
        except subprocess.TimeoutExpired:
            raise DatapathError(f"{shlex.join(cmd)} timed out") from None
        if p.returncode != 0:
            raise DatapathError(
                f"{what or shlex.join(argv[:2])} failed: {_last_line(p.stderr or p.stdout)}"
            )
        return p.stdout

    @contextlib.contextmanager
    def _in_netns(self) -> Iterator[None]:
        path = self._netns_path()
        if path is None:
            yield
            return
        from pyroute2 import netns as pnetns

        fd = os.open(path, os.O_RDONLY)
        try:
            pnetns.pushns(fd)  # an fd: never creates a namespace
            try:
                yield
            finally:
                pnetns.popns()
        finally:
            os.close(fd)

    def _iproute(self) -> Any:
        if self._ipr is None:
            from pyroute2 import IPRoute

            with self._in_netns():
                self._ipr = IPRoute()
        return self._ipr

    def _ipsets(self) -> Any:
        if self._ipset is None:
            from pyroute2 import IPSet

            try:
                with self._in_netns():
                    self._ipset = IPSet()
            except OSError as e:
                raise DatapathError(f"cannot open the ipset netlink socket: {e}") from None
        return self._ipset

    def _ifindex(self, device: str) -> int:
        idx = self._iproute().link_lookup(ifname=device)
        if not idx:
            where = f" in network namespace {self.netns}" if self.netns else ""
            raise DatapathError(f"no network device {device}{where}")
        return int(idx[0])

    # ------------------------------------------------------------ kernel reads
    def backend(self) -> str:
        """The iptables backend in use: nf_tables, legacy (or unknown)."""
        try:
            out = self._run([self.iptables_bin, "-V"], what="iptables -V")
        except DatapathError:
            return "unknown"
        return parse_backend(out)

    @staticmethod
    def _tc_record(msg: Any) -> dict[str, Any]:
        return {
            "handle": msg["handle"],
            "parent": msg["parent"],
            "kind": msg.get_attr("TCA_KIND"),
            "options": msg.get_attr("TCA_OPTIONS"),
            "stats": msg.get_attr("TCA_STATS2"),
        }

    def _tc_records(self, device: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ipr = self._iproute()
        idx = self._ifindex(device)
        qd = [self._tc_record(m) for m in ipr.get_qdiscs(index=idx)]
        cl = [self._tc_record(m) for m in ipr.get_classes(index=idx)]
        return qd, cl

    def observe(self, device: str | None = None) -> TcTree:
        qd, cl = self._tc_records(self._dev(device))
        return observe_tree(qd, cl)

    def _dev(self, device: str | None = None) -> str:
        dev = device or self.device
        if not dev:
            raise DatapathError("no device given (--device)")
        return dev

    def _mangle(self) -> tuple[list[str], list[str] | None]:
        out = self._run([self.iptables_bin, "-w", "5", "-t", "mangle", "-S"], what="iptables -S")
        return parse_mangle_rules(out)

    def _set_headers(self) -> dict[str, int]:
        """Our sets that exist -> their CADT flags (one header-only dump)."""
        out: dict[str, int] = {}
        try:
            msgs = list(self._ipsets().list(flags=IPSET_FLAG_LIST_HEADER))
        except Exception as e:
            raise DatapathError(f"cannot list ipsets: {e}") from None
        for m in msgs:
            name = m.get_attr("IPSET_ATTR_SETNAME")
            if name not in OWNED_SETS:
                continue
            data = m.get_attr("IPSET_ATTR_DATA")
            flags = data.get_attr("IPSET_ATTR_CADT_FLAGS") if data is not None else 0
            out[name] = int(flags or 0)
        return out

    def current(self) -> dict[str, Member]:
        """Members of our sets with their mode, class and counters."""
        ips = self._ipsets()
        raw: dict[str, tuple[str, int, int, int]] = {}  # ip -> (mode, minor, packets, bytes)
        existing = self._set_headers()
        for mode, name in SET_NAMES.items():
            if name not in existing:
                continue
            for msg in ips.list(name):
                adt = msg.get_attr("IPSET_ATTR_ADT")
                if adt is None:
                    continue
                for data in adt.get_attrs("IPSET_ATTR_DATA"):
                    ipf = data.get_attr("IPSET_ATTR_IP_FROM")
                    ip = ipf.get_attr("IPSET_ATTR_IPADDR_IPV4") if ipf is not None else None
                    if ip is None:
                        continue
                    prio = data.get_attr("IPSET_ATTR_SKBPRIO")
                    minor = prio[1] if prio is not None and prio[0] == ROOT_MAJOR else DIRECT_MINOR
                    raw[ip] = (
                        mode,
                        minor,
                        int(data.get_attr("IPSET_ATTR_PACKETS") or 0),
                        int(data.get_attr("IPSET_ATTR_BYTES") or 0),
                    )
        self._members = {ip: (mode, minor) for ip, (mode, minor, _, _) in raw.items()}
        self._read_glides()
        return {
            ip: Member(ip, mode, self._klass(minor), pk, by)
            for ip, (mode, minor, pk, by) in raw.items()
        }

    def _klass(self, minor: int) -> int:
        """The delay class a member's HTB minor gives it now."""
        if is_glide_minor(minor):
            g = self._glides.get(minor)
            return g.klass if g is not None else 0
        return minor_class(minor) or 0

    def _read_glides(self) -> None:
        """Glide leaves' members from the membership just read back; the
        delay of a leaf this process has not set yet from the kernel."""
        assert self._members is not None
        for g in self._glides.values():
            g.members.clear()
        unknown = []
        for ip, (_mode, minor) in self._members.items():
            if is_glide_minor(minor):
                g = self._glides.get(minor)
                if g is None:
                    g = self._glides[minor] = Glide(minor)
                    unknown.append(g)
                g.members.add(ip)
        if not unknown or self.leaf != "netem" or not self.device:
            return
        leaves = self.observe().leaves
        now = self.clock()
        for g in unknown:
            leaf = leaves.get(g.minor)
            delay_us = leaf.delay_us if leaf is not None and leaf.delay_us else 0
            g.klass = min(self.max_class, round(delay_us / self.step_us))
            g.busy_until_s = now + delay_us / 1e6  # what it holds may be that old

    def class_counters(self, device: str | None = None) -> dict[int, tuple[int, int]]:
        """Per delay class (0 = unthrottled): (packets, bytes) sent.

        HTB counts its direct queue only as packets (direct_packets_stat),
        so class 0 is the root's count minus its classes' and glide leaves'
        (HTB updates both at dequeue; a glide leaf's packets count nowhere)."""
        qd, cl = self._tc_records(self._dev(device))
        basic = _basic_stats
        root = next(
            (q for q in qd if q["parent"] == 0xFFFFFFFF and q["handle"] >> 16 == ROOT_MAJOR), None
        )
        out: dict[int, tuple[int, int]] = {}
        gp = gb = 0  # glide leaves: neither a class nor the direct queue
        for c in cl:
            h = c["handle"]
            if h >> 16 != ROOT_MAJOR:
                continue
            k = minor_class(h & 0xFFFF)
            if k is not None:
                out[k] = basic(c)
            elif is_glide_minor(h & 0xFFFF):
                p, b = basic(c)
                gp, gb = gp + p, gb + b
        if root is not None:
            rp, rb = basic(root)
            out[0] = (
                rp - gp - sum(p for p, _ in out.values()),
                rb - gb - sum(b for _, b in out.values()),
            )
        return out

    def installed_devices(self) -> list[str]:
        """Devices in this namespace whose root qdisc is ours."""
        ipr = self._iproute()
        out = []
        for q in ipr.get_qdiscs():
            root = q["parent"] == 0xFFFFFFFF and q["handle"] >> 16 == ROOT_MAJOR
            if root and q.get_attr("TCA_KIND") == "htb":
                links = ipr.get_links(q["index"])
                if links:
                    out.append(links[0].get_attr("IFLA_IFNAME"))
        return sorted(out)

    # ------------------------------------------------------------ netem check
    def check_netem(self) -> None:
        """Raise NetemMissing when the kernel cannot give us a netem qdisc.

        The module tree answers when there is one; otherwise the kernel is
        asked directly in a private, throwaway namespace (`unshare --net`)."""
        have = module_available("sch_netem", self.sys_module_dir, self.modules_dir)
        if have:
            return
        probe = [self.unshare_bin, "--net", self.tc_bin, "qdisc", "add", "dev", "lo", "root",
                 "netem", "delay", "1ms"]  # fmt: skip
        try:
            p = subprocess.run(probe, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            p = None
        if p is not None and p.returncode == 0:
            return
        err = (p.stderr if p is not None else "") or ""
        if have is False or "kind is unknown" in err or "No such file" in err:
            raise NetemMissing(NETEM_MISSING_MSG)
        # Cannot tell (no unshare permission, ...): the build will say.

    # --------------------------------------------------------------- apply
    def apply(self) -> ApplyReport:
        """Reconcile tc tree, sets and rules with the configuration (idempotent)."""
        t0 = time.monotonic()
        dev = self._dev()
        self._ifindex(dev)  # the device exists
        report = ApplyReport(backend=self.backend())
        have = self.observe(dev)
        if not have.ours and not have.kernel_default:
            raise ForeignQdisc(
                f"{dev} already has a root qdisc {have.root_kind} {have.root_major:x}: that "
                f"santhrottle did not create; remove it (tc qdisc del dev {dev} root) or "
                "choose another device"
            )
        want = desired_tree(
            self.step_us, self.max_class, self.link_bits_s, self.leaf, self.glide_leaves
        )
        lines = render_tc_plan(dev, want, have)
        if self.leaf == "netem" and any(" netem " in ln for ln in lines):
            self.check_netem()
        t1 = time.monotonic()
        if lines:
            self._tc_batch(lines, fresh=not have.ours, device=dev)
        report.tc_lines = len(lines)
        report.tc_fresh = not have.ours
        t2 = time.monotonic()
        report.sets_created = self._ensure_sets()
        t3 = time.monotonic()
        jumps, chain_rules = self._mangle()
        text = render_rules_restore(dev, self.ports, jumps, chain_rules)
        if text is not None:
            self._restore_rules(text)
            report.rules_changed = True
        t4 = time.monotonic()
        # Members whose class no longer exists would fall to the default
        # class silently: clamp them to the new maximum.
        over = {ip: self.max_class for ip, m in self.current().items() if m.klass > self.max_class}
        if over:
            modes = {ip: self._members[ip][0] for ip in over} if self._members else {}
            for mode in MODES:
                part = {ip: k for ip, k in over.items() if modes.get(ip) == mode}
                if part:
                    self.set_classes(part, mode=mode, ordered=False)  # their class is gone
            report.clamped = over
        t5 = time.monotonic()
        report.timings_s = {
            "checks": t1 - t0,
            "tc": t2 - t1,
            "sets": t3 - t2,
            "rules": t4 - t3,
            "members": t5 - t4,
        }
        return report

    def _tc_batch(self, lines: Sequence[str], fresh: bool, device: str) -> None:
        text = "\n".join(lines) + "\n"
        try:
            self._run([self.tc_bin, "-batch", "-"], stdin=text, what="tc -batch")
        except DatapathError as e:
            if fresh:  # do not leave half a tree behind
                with contextlib.suppress(DatapathError):
                    self._run([self.tc_bin, "qdisc", "del", "dev", device, "root"])
            if "kind is unknown" in str(e) and self.leaf == "netem":
                raise NetemMissing(NETEM_MISSING_MSG) from None
            raise

    def _ensure_sets(self) -> list[str]:
        from pyroute2.ipset import IPSetError

        want_flags = IPSET_FLAG_WITH_COUNTERS | IPSET_FLAG_WITH_SKBINFO
        existing = self._set_headers()
        created = []
        for name in SET_NAMES.values():
            if name in existing:
                if existing[name] & want_flags != want_flags:
                    raise DatapathError(
                        f"ipset {name} exists without counters/skbinfo; "
                        "run `santhrottle datapath cleanup` first"
                    )
                continue
            try:
                self._ipsets().create(
                    name,
                    stype="hash:ip",
                    family=socket.AF_INET,
                    exclusive=False,
                    counters=True,
                    skbinfo=True,
                    maxelem=self.maxelem,
                )
            except IPSetError as e:
                raise DatapathError(f"cannot create ipset {name}: {e}") from None
            created.append(name)
        # The list:set through the system's ipset: pyroute2 would create it
        # at the kernel's newest revision (list:set 3 on 6.18), which an older
        # ipset (7.17) then cannot list at all.
        if MEMBERS_SET not in existing:
            self._run(
                [self.ipset_bin, "-exist", "restore"], stdin=f"create {MEMBERS_SET} list:set\n",
                what="ipset restore",
            )  # fmt: skip
            created.append(MEMBERS_SET)
        # The gate lists the mode sets that have members, and no other
        # (header: the gate); a previous version listed all three.
        self._gated = None
        want = {SET_NAMES[m] for m, _ in self._membership().values()}
        self._gate("add", want)
        self._gate("del", self._gate_now() - want)
        return created

    def _gate_now(self) -> set[str]:
        if self._gated is None:
            self._gated = self._list_set_members(MEMBERS_SET) & set(SET_NAMES.values())
        return self._gated

    def _gate(self, op: str, names: Iterable[str]) -> None:
        """Add mode sets to the gate list:set (before their first member: it
        is delayed from its first packet on) or delete them from it (once
        empty: a member's packets must not leave its class for HTB's direct
        queue while older ones still wait there)."""
        from pyroute2.ipset import IPSetError

        have = self._gate_now()
        for name in sorted(set(names) - have if op == "add" else set(names) & have):
            try:
                if op == "add":
                    self._ipsets().add(MEMBERS_SET, name, etype="set", exclusive=False)
                    have.add(name)
                else:
                    self._ipsets().delete(MEMBERS_SET, name, etype="set", exclusive=False)
                    have.discard(name)
            except (IPSetError, OSError) as e:
                self._gated = None  # unknown now: read back next time
                raise DatapathError(f"ipset {op} {MEMBERS_SET} {name}: {e}") from None

    def _list_set_members(self, name: str) -> set[str]:
        """The set names a list:set holds."""
        out = set()
        for msg in self._ipsets().list(name):
            adt = msg.get_attr("IPSET_ATTR_ADT")
            for data in adt.get_attrs("IPSET_ATTR_DATA") if adt is not None else ():
                member = data.get_attr("IPSET_ATTR_NAME")
                if member:
                    out.add(member)
        return out

    def _restore_rules(self, text: str) -> None:
        self._run(
            [self.iptables_restore_bin, "-w", "5", "--noflush"], stdin=text, what="iptables-restore"
        )

    # ------------------------------------------------------------- cleanup
    def cleanup(self) -> CleanupReport:
        """Remove every qdisc, class, set and rule santhrottle created."""
        rep = CleanupReport()
        jumps, chain_rules = self._mangle()
        text = render_rules_cleanup(jumps, chain_rules is not None)
        if text is not None:
            self._restore_rules(text)
            rep.rules = len(jumps)
            rep.chain = chain_rules is not None
            if self.backend() == "nf_tables":
                rep.nft_table = self._drop_empty_nft_mangle()
        existing = self._set_headers()
        for name in OWNED_SETS:
            if name in existing:
                try:
                    self._ipsets().destroy(name)
                except Exception as e:
                    raise DatapathError(f"cannot destroy ipset {name}: {e}") from None
                rep.sets.append(name)
        self._members = None
        self._gated = None
        self._glides.clear()
        for dev in self.installed_devices():
            self._run([self.tc_bin, "qdisc", "del", "dev", dev, "root"], what="tc qdisc del")
            rep.qdiscs.append(dev)
        return rep

    def _drop_empty_nft_mangle(self) -> bool:
        """iptables-nft creates `table ip mangle` with a POSTROUTING base chain
        when our jump goes in and never deletes it.  Remove the table only
        when it holds nothing at all: no rules, no sets, no chain other than
        empty ACCEPT base chains (exactly what iptables-nft leaves behind)."""
        try:
            from pyroute2.nftables.main import NFTables

            with self._in_netns():
                nft = NFTables(nfgen_family=socket.AF_INET)
        except Exception:
            return False
        try:
            tables = [t.get_attr("NFTA_TABLE_NAME") for t in nft.get_tables()]
            if "mangle" not in tables:
                return False
            for r in nft.get_rules():
                if r.get_attr("NFTA_RULE_TABLE") == "mangle":
                    return False
            for s in nft.get_sets():
                if s.get_attr("NFTA_SET_TABLE") == "mangle":
                    return False
            for c in nft.get_chains():
                if c.get_attr("NFTA_CHAIN_TABLE") != "mangle":
                    continue
                hook = c.get_attr("NFTA_CHAIN_HOOK")
                policy = c.get_attr("NFTA_CHAIN_POLICY")
                if hook is None or policy not in (None, 1):  # NF_ACCEPT = 1
                    return False
            nft.table("del", name="mangle")
            return True
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                nft.close()

    # ------------------------------------------------------------ run time
    def _membership(self) -> dict[str, tuple[str, int]]:
        if self._members is None:
            self.current()
        assert self._members is not None
        return self._members

    def plan_changes(
        self, classes: Mapping[str, int], mode: str | None = None
    ) -> list[tuple[str, str, str, int]]:
        """The ipset ops (op, set, ip, HTB minor) that move `classes` into place."""
        mode = mode or self.write_mode
        if mode not in MODES:
            raise DatapathError(f"bad mode {mode!r}: expected all, ack or read")
        members = self._membership()
        ops: list[tuple[str, str, str, int]] = []
        max_class = self.max_class
        target = SET_NAMES[mode]
        for ip_raw, k in classes.items():
            cur = members.get(ip_raw)
            # members' keys are canonical (read back from the kernel)
            ip = ip_raw if cur is not None or _is_canonical_ipv4(ip_raw) else check_ip(ip_raw)
            if ip is not ip_raw:
                cur = members.get(ip)
            if type(k) is not int or not 0 <= k <= max_class:
                raise DatapathError(f"bad class {k!r} for {ip}: must be 0-{max_class}")
            if k == 0:
                if cur is not None:
                    ops.append(("del", SET_NAMES[cur[0]], ip, 0))
                continue
            if cur is not None and cur[0] != mode:
                ops.append(("del", SET_NAMES[cur[0]], ip, 0))
            if cur is None or cur[0] != mode or self._klass(cur[1]) != k:
                ops.append(("add", target, ip, class_minor(k)))
        return ops

    def set_classes(
        self, classes: Mapping[str, int], mode: str | None = None, *, ordered: bool = True
    ) -> int:
        """Move initiators into delay classes (0 = out of every set).

        `mode` (default: the write mode) names the set: all, ack or read.
        With `ordered`, initiators whose delay goes down glide through a
        glide leaf (header: ordered descent); call settle() every tick after
        it.  Returns the number of ipset operations sent."""
        mode = mode or self.write_mode
        ops = self.plan_changes(classes, mode)
        if not ops:
            return 0
        before = self._membership()
        pre: list[tuple[int, int]] = []
        post: list[tuple[int, int]] = []
        if ordered and self.glide_leaves:
            ops, pre, post = self._plan_glides(ops, mode, before)
        for minor, k in pre:
            self._set_glide(minor, k)
        self._send(ops, before)
        now = self.clock()
        fresh = {minor for minor, _ in pre}
        for minor, k in post:
            g = self._glides[minor]
            if minor in fresh:  # moved in at delay <= g.klass: those packets leave by then
                g.lower_at_s = now + g.klass * self.step_s
            if k == g.klass:  # a rise that entered a fresh leaf at its new delay
                g.lower_to = None
            elif k < g.klass and now < g.lower_at_s:
                g.lower_to = k  # settle() lowers it when due
            else:
                g.lower_to = None
                self._set_glide(minor, k)
        return len(ops)

    def settle(self) -> int:
        """Dissolve the glide leaves whose older packets have all left: their
        members move to the shared class of the same delay (out of the set at
        delay 0), the leaf is free again once what it holds has left.  Cheap
        when nothing is due: the daemon calls it every tick."""
        now = self.clock()
        for g in self._glides.values():
            if g.lower_to is not None and (not g.members or now >= g.lower_at_s):
                k, g.lower_to = g.lower_to, None
                if g.members:  # their older packets have left the shared class
                    self._set_glide(g.minor, k)
        due = [
            g
            for g in self._glides.values()
            if g.members and g.lower_to is None and now >= g.busy_until_s
        ]
        if due:  # ... and their traffic paused: nothing queued, nothing sent since the last look
            seen = self._glide_backlog([g.minor for g in due])
            paused = []
            for g in due:
                queued, sent = seen.get(g.minor, (0, None))
                if not queued and (sent is None or sent == g.sent_seen):
                    paused.append(g)
                g.sent_seen = sent
            due = paused
        if not due:
            return 0
        members = self._membership()
        ops = []
        for g in due:
            for ip in sorted(g.members):
                name = SET_NAMES[members[ip][0]]
                if g.klass:
                    ops.append(("add", name, ip, class_minor(g.klass)))
                else:
                    ops.append(("del", name, ip, 0))
        self._send(ops, members)
        return len(ops)

    def _plan_glides(
        self,
        ops: list[tuple[str, str, str, int]],
        mode: str,
        members: Mapping[str, tuple[str, int]],
    ) -> tuple[list[tuple[str, str, str, int]], list[tuple[int, int]], list[tuple[int, int]]]:
        """Rewrite the ops of initiators whose delay goes down (same mode):
        per (from, to) group, one glide leaf at the old delay takes them all
        (a leaf they already fill, else a free one set to the old delay
        first: `pre`), then its delay goes down in place (`post`).  A group
        that fills a leaf and goes up goes up in place too; a rise from a
        shared class to one of the same HTB prio takes a free leaf at the new
        delay (HTB would round-robin the two classes); any other rise takes
        the shared class."""
        by_ip: dict[str, list[tuple[str, str, str, int]]] = {}
        for op in ops:
            by_ip.setdefault(op[2], []).append(op)
        target = SET_NAMES[mode]
        groups: dict[tuple[int, int], list[str]] = {}
        keep: list[tuple[str, str, str, int]] = []
        for ip, ip_ops in by_ip.items():
            cur = members.get(ip)
            last = ip_ops[-1]
            k = (minor_class(last[3]) or 0) if last[0] == "add" else 0
            c = self._klass(cur[1]) if cur is not None and cur[0] == mode else 0
            in_leaf = cur is not None and cur[0] == mode and is_glide_minor(cur[1])
            same_prio = 0 < c < k and class_prio(c) == class_prio(k)
            if last[1] == target and (c > k or (c < k and (in_leaf or same_prio))):
                groups.setdefault((c, k), []).append(ip)
            else:
                keep.extend(ip_ops)
        pre: list[tuple[int, int]] = []
        post: list[tuple[int, int]] = []
        taken: set[int] = set()
        now = self.clock()
        for (c, k), ips in groups.items():
            group = set(ips)
            own = {members[ip][1] for ip in ips if is_glide_minor(members[ip][1])}
            full = sorted(m for m in own if m in self._glides and self._glides[m].members <= group)
            rise = c < k
            if rise and not full and own:  # a rise that splits a leaf: the shared class
                keep.extend(op for ip in ips for op in by_ip[ip])
                continue
            minor = full[0] if full else self._free_glide(now, taken)
            if minor is None:  # all busy: the shared class (a descent is counted)
                self.unordered_moves += 0 if rise else len(ips)
                keep.extend(op for ip in ips for op in by_ip[ip])
                continue
            taken.add(minor)
            self.glided += 0 if rise else len(ips)
            if not full:  # a descent enters at the old delay, a rise at the new one
                pre.append((minor, k if rise else c))
            keep.extend(("add", target, ip, minor) for ip in ips if members[ip][1] != minor)
            post.append((minor, k))
        return keep, pre, post

    def _glide_backlog(self, minors: Sequence[int]) -> dict[int, tuple[int, int]]:
        """(packets queued now, packets sent) of each of these glide leaves
        (summed over the devices): one RTM_GETTCLASS per leaf, in one batch
        -- a dump of every class costs 25 ms for 500 classes on the host,
        far more in the lab."""
        from pyroute2.netlink import NLM_F_ACK, NLM_F_ECHO, NLM_F_REQUEST
        from pyroute2.netlink.rtnl import RTM_GETTCLASS
        from pyroute2.netlink.rtnl.tcmsg import tcmsg

        msgs = []
        for dev in self.glide_devices:
            idx = self._ifindex(dev)
            for minor in minors:
                msg = tcmsg()
                msg["index"] = idx
                msg["handle"] = (ROOT_MAJOR << 16) | minor
                msg["header"]["type"] = RTM_GETTCLASS
                # the class comes back only to a request that asks for its echo
                msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_ECHO
                msgs.append(msg)
        out: dict[int, tuple[int, int]] = {}
        try:
            replies = self._iproute().nlm_request_batch(msgs)
        except Exception as e:
            raise DatapathError(f"cannot read the glide leaves' queues: {e}") from None
        for m in replies:
            if m.get("event") == "RTM_NEWTCLASS":
                minor = m["handle"] & 0xFFFF
                rec = self._tc_record(m)
                queued, sent = out.get(minor, (0, 0))
                out[minor] = (queued + _queued(rec), sent + _basic_stats(rec)[0])
        return out

    def _free_glide(self, now: float, taken: set[int]) -> int | None:
        for i in range(self.glide_leaves):
            minor = glide_minor(i)
            g = self._glides.setdefault(minor, Glide(minor))
            if minor not in taken and not g.members and now >= g.busy_until_s:
                return minor
        return None

    def _set_glide(self, minor: int, k: int) -> None:
        """Set a glide leaf's delay in place (netem keeps its queue and, with
        a rate, its order), on every device that has it."""
        g = self._glides.setdefault(minor, Glide(minor))
        if self.leaf == "netem":
            for dev in self.glide_devices:
                self._netem_change(dev, minor, k * self.step_us)
        if k < g.klass:  # its packets at the old delay leave by then
            g.busy_until_s = max(g.busy_until_s, self.clock() + g.klass * self.step_s)
        g.klass = k

    def _netem_change(self, device: str, minor: int, delay_us: int) -> None:
        """One RTM_NEWQDISC (what `tc qdisc change` sends): the leaf's new delay."""
        from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
        from pyroute2.netlink.rtnl import RTM_NEWQDISC
        from pyroute2.netlink.rtnl.tcmsg import tcmsg

        msg = tcmsg()
        msg["index"] = self._ifindex(device)
        msg["handle"] = minor << 16
        msg["parent"] = (ROOT_MAJOR << 16) | minor
        want = glide_leaf("netem", minor, self.link_bits_s, self.max_class * self.step_us)
        msg["attrs"] = [
            ["TCA_KIND", "netem"],
            [
                "TCA_OPTIONS",
                {
                    "delay": round(delay_us * 1000 / PSCHED_TICK_NS),
                    "limit": want.limit,
                    "loss": 0,
                    "gap": 0,
                    "duplicate": 0,
                    "jitter": 0,
                    "attrs": [
                        [
                            "TCA_NETEM_RATE",
                            {"rate": want.rate_bytes_s, "packet_overhead": 0, "cell_size": 0,
                             "cell_overhead": 0},
                        ]
                    ],
                },
            ],
        ]  # fmt: skip
        msg["header"]["type"] = RTM_NEWQDISC
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
        try:
            # the batch call: pyroute2 0.9's sync nlm_request looks for a
            # status key only its async core has
            self._iproute().nlm_request_batch([msg])
        except Exception as e:
            raise DatapathError(
                f"cannot change the delay of glide leaf {minor_classid(minor)} on {device}: {e}"
            ) from None

    def _send(
        self, ops: Sequence[tuple[str, str, str, int]], before: Mapping[str, tuple[str, int]]
    ) -> None:
        """Send ipset ops (single netlink ops, restore or swap, whichever is
        cheaper) and keep the membership and the glide leaves' members."""
        after = _members_after(before, ops)
        # a set gains members only by adds, loses them only by dels: the gate
        # follows from the ops (no pass over every member on the tick path)
        self._gate("add", {op[1] for op in ops if op[0] == "add"})
        if len(ops) <= self.bulk_threshold:
            self._apply_netlink(ops)
        else:
            affected = {_SET_MODE[name] for name in {op[1] for op in ops}}
            rebuilt = sum(1 for m, _ in after.values() if m in affected)
            if rebuilt <= SWAP_LINES_PER_INPLACE_LINE * len(ops):
                self._apply_swap({m: {ip: k for ip, (mm, k) in after.items() if mm == m}
                                  for m in sorted(affected)})  # fmt: skip
            else:
                self._apply_restore(ops)
        self._members = after
        left = {op[1] for op in ops if op[0] == "del"} & self._gate_now()
        if left:
            self._gate("del", left - {SET_NAMES[m] for m, _ in after.values()})
        now = self.clock()
        for ip in {op[2] for op in ops}:
            old, new = before.get(ip), after.get(ip)
            if old is not None and old != new and old[1] in self._glides:
                g = self._glides[old[1]]
                g.members.discard(ip)  # what it sent there leaves at the leaf's delay
                g.busy_until_s = max(g.busy_until_s, now + g.klass * self.step_s)
            if new is not None and is_glide_minor(new[1]):
                self._glides.setdefault(new[1], Glide(new[1])).members.add(ip)

    def _apply_netlink(self, ops: Sequence[tuple[str, str, str, int]]) -> None:
        from pyroute2.ipset import IPSetError

        ips = self._ipsets()
        for op, name, ip, minor in ops:
            try:
                if op == "add":
                    ips.add(name, ip, exclusive=False, skbprio=(ROOT_MAJOR, minor))
                else:
                    ips.delete(name, ip, exclusive=False)
            except IPSetError as e:
                self._members = None  # unknown now: read back next time
                if "not added" in str(e) and op == "del":
                    continue
                raise DatapathError(f"ipset {op} {name} {ip}: {e}") from None
            except OSError as e:
                self._members = None
                raise DatapathError(f"ipset {op} {name} {ip}: {e}") from None

    def _apply_restore(self, ops: Sequence[tuple[str, str, str, int]]) -> None:
        try:
            self._run(
                [self.ipset_bin, "-exist", "restore"],
                stdin=render_ipset_changes(ops),
                what="ipset restore",
            )
        except DatapathError:
            self._members = None
            raise

    def _apply_swap(self, sets: Mapping[str, Mapping[str, int]]) -> None:
        """Rebuild whole sets: one `ipset restore` that fills a temporary set
        per mode and swaps it in (atomic per set; members' counters restart)."""
        heads = self._set_headers()
        for mode in sets:  # a temporary set left by a crash would make create fail
            tmp = SET_NAMES[mode] + TMP_SUFFIX
            if tmp in heads:
                with contextlib.suppress(Exception):
                    self._ipsets().destroy(tmp)
        text = "".join(render_ipset_swap(m, members, self.maxelem) for m, members in sets.items())
        try:
            self._run([self.ipset_bin, "restore"], stdin=text, what="ipset restore")
        except DatapathError:
            self._members = None
            with contextlib.suppress(Exception):
                heads = self._set_headers()
                for mode in sets:
                    if SET_NAMES[mode] + TMP_SUFFIX in heads:
                        self._ipsets().destroy(SET_NAMES[mode] + TMP_SUFFIX)
            raise

    def replace_members(self, mode: str, members: Mapping[str, int]) -> None:
        """Replace a whole set atomically (temporary set + swap)."""
        if mode not in MODES:
            raise DatapathError(f"bad mode {mode!r}: expected all, ack or read")
        clean = {check_ip(ip): k for ip, k in members.items()}
        for ip, k in clean.items():
            if type(k) is not int or not 1 <= k <= self.max_class:
                raise DatapathError(f"bad class {k!r} for {ip}: must be 1-{self.max_class}")
        if clean:
            self._gate("add", [SET_NAMES[mode]])
        self._apply_swap({mode: {ip: class_minor(k) for ip, k in clean.items()}})
        self._members = None  # other sets may hold some of these: read back next time
        if not clean:
            self._gate("del", [SET_NAMES[mode]])

    # -------------------------------------------------------------- status
    def glide_status(self, device: str | None = None) -> list[dict[str, Any]]:
        """The device's glide leaves: delay now, members, packets and bytes sent."""
        qd, cl = self._tc_records(self._dev(device))
        tree = observe_tree(qd, cl)
        out = []
        for c in cl:
            minor = c["handle"] & 0xFFFF
            if c["handle"] >> 16 != ROOT_MAJOR or not is_glide_minor(minor):
                continue
            packets, nbytes = _basic_stats(c)
            g = self._glides.get(minor)
            leaf = tree.leaves.get(minor)
            delay_us = leaf.delay_us if leaf is not None and leaf.kind == "netem" else None
            if delay_us is None and g is not None:
                delay_us = g.klass * self.step_us
            out.append(
                {
                    "leaf": minor_classid(minor),
                    "delay_us": delay_us,
                    "members": sorted(g.members) if g is not None else [],
                    # a lowering that waits for the members' older packets (settle)
                    "lowering_to_us": None
                    if g is None or g.lower_to is None
                    else g.lower_to * self.step_us,
                    "packets": packets,
                    "bytes": nbytes,
                    "queued": _queued(c),
                }
            )
        return sorted(out, key=lambda x: x["leaf"])

    def status(self) -> dict[str, Any]:
        """Everything `santhrottle datapath show` prints, as plain data."""
        jumps, chain_rules = self._mangle()
        devices = self.installed_devices()
        dev = (
            self.device
            or (parse_jump_device(jumps[0]) if jumps else None)
            or (devices[0] if devices else None)
        )
        out: dict[str, Any] = {
            "netns": self.netns,
            "backend": self.backend(),
            "device": dev,
            "installed_devices": devices,
            "chain": {
                "exists": chain_rules is not None,
                "jumps": jumps,
                "rules": chain_rules or [],
                "ports": list(parse_rule_ports(jumps) or []),
            },
            "sets": {},
            "classes": None,
            "members": [],
        }
        heads = self._set_headers()
        members = self.current() if heads else {}
        for name in SET_NAMES.values():
            out["sets"][name] = (
                None
                if name not in heads
                else sum(1 for m in members.values() if SET_NAMES[m.mode] == name)
            )
        if dev:
            with contextlib.suppress(DatapathError):
                tree = self.observe(dev)
                if tree.ours:
                    out["classes"] = tree_summary(tree)
                    counters = self.class_counters(dev)
                    out["classes"]["counters"] = {
                        str(k): {"packets": p, "bytes": b} for k, (p, b) in sorted(counters.items())
                    }
                    out["classes"]["glides"] = self.glide_status(dev)
        step_us = (out["classes"] or {}).get("step_us")
        for ip in sorted(members, key=lambda s: ipaddress.IPv4Address(s)):
            m = members[ip]
            out["members"].append(
                {
                    "ip": ip,
                    "mode": m.mode,
                    "class": m.klass,
                    "delay_us": m.klass * step_us if step_us else None,
                    "packets": m.packets,
                    "bytes": m.bytes,
                }
            )
        return out


def tree_summary(tree: TcTree) -> dict[str, Any]:
    """Class count, step and leaf kind of one of our trees (for show / discover)."""
    ks = sorted(k for k in (minor_class(m) for m in tree.classes) if k)
    leaves = [tree.leaves[class_minor(k)] for k in ks if class_minor(k) in tree.leaves]
    kinds = sorted({lf.kind for lf in leaves})
    step_us = None
    if ks and leaves and all(lf.kind == "netem" for lf in leaves):
        first = tree.leaves.get(class_minor(ks[0]))
        if first is not None and first.delay_us:
            step_us = first.delay_us // ks[0]
    hp = next(iter(tree.classes.values()), None)
    return {
        "glide_leaves": sum(1 for m in tree.classes if is_glide_minor(m)),
        "root": f"{ROOT_MAJOR:x}:",
        "default": (
            "direct"
            if tree.default_minor == DIRECT_MINOR
            else minor_classid(tree.default_minor or 0)
        ),
        "max_class": ks[-1] if ks else 0,
        "classes": len(ks),
        "leaf": kinds[0] if len(kinds) == 1 else kinds,
        "step_us": step_us,
        "link_bits_s": hp.rate_bytes_s * 8 if hp else None,
    }


def discover(netns: str | None = None, **kw: Any) -> Datapath:
    """A Datapath configured from what is installed (device from the jump
    rule, ports from the chain, step and maximum from the netem leaves).
    Raises NotApplied when nothing is installed."""
    probe = Datapath(None, netns=netns, **kw)
    try:
        jumps, rules = probe._mangle()
        if rules is None or not jumps:
            raise NotApplied(
                "the data path is not applied: run `santhrottle datapath apply --device IF`"
            )
        dev = parse_jump_device(jumps[0])
        if dev is None:
            raise NotApplied(f"cannot tell the device from the rule {jumps[0]!r}")
        tree = probe.observe(dev)
        if not tree.ours:
            raise NotApplied(
                f"{dev} has no santhrottle qdisc tree: "
                f"run `santhrottle datapath apply --device {dev}`"
            )
        s = tree_summary(tree)
    finally:
        probe.close()
    args: dict[str, Any] = {}
    if s["step_us"]:
        args["step_s"] = s["step_us"] / 1e6
    if s["max_class"]:
        args["max_class"] = s["max_class"]
    if s["link_bits_s"]:
        args["link_bits_s"] = s["link_bits_s"]
    if s["leaf"] == "pfifo":
        args["leaf"] = "pfifo"
    args["glide_leaves"] = s["glide_leaves"]
    ports = parse_rule_ports(jumps)
    if ports:
        args["ports"] = ports
    args.update({k: v for k, v in kw.items() if k not in args})
    return Datapath(dev, netns=netns, **args)
