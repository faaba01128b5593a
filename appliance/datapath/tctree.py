"""The tc tree of one egress device, as wanted and as observed (pure: render and parse).

What it owns
    The shape of our qdisc tree, its sizing, the `tc -batch` lines that
    turn an observed tree into the wanted one, and the reading of pyroute2
    records back into a tree.  datapath/tc.py sends and reads; this module
    only computes.

Layout (datapath/names.py for the numbers)::

    qdisc htb 5374: root default 0
    class htb 5374:K   + qdisc netem K: delay D(K) limit L(K)     K = 1..max_class
    class htb 5374:60II prio 7 + qdisc netem 60II: delay D rate R limit L(max)   glide leaves

    Unthrottled packets take HTB's direct queue (`default 0`): a plain
    FIFO that HTB serves first, with no class lookup, token bucket or event
    queue.  Every class has rate = ceil = the link rate: HTB only
    classifies, it never shapes (no parent class, nothing is borrowed).

Sizing
    netem limit L(K) = max(NETEM_LIMIT_FLOOR_PKTS,
                           ceil(link_bytes_s * D(K) / MIN_FRAME_BYTES))
    (D(K): class K's delay on the ladder, controller/ladder.py)
    (the most packets that can sit in the class if the whole link fed it
    minimum-size frames for the class's delay: no drops; a cap, not an
    allocation).  HTB burst = cburst = max(link_bytes_s * HTB_BURST_S,
    HTB_MIN_BURST_BYTES); quantum = HTB_QUANTUM_BYTES (explicit, so HTB
    neither warns nor clamps).  A glide leaf is sized for the largest delay
    and has a netem rate (NETEM_RATE_MAX_BYTES_S) that only keeps its queue
    in order (datapath/glide.py); its delay is run-time state.

Reconciliation (render_tc_plan)
    No tree of ours: one fresh build.  Ours: add what is missing, change
    classes whose parameters differ, replace leaves in place (packets
    queued in a netem leaf stay), delete extra classes last.  HTB cannot
    change its default class, nor move an active class between prio rows:
    either difference means a rebuild.

Worked example
    the default ladder, 10 Gbit/s: 88 classes 5374:1 .. 5374:88 with delays
    500us .. 250ms; class 20 (10 ms) gets limit ceil(1.25e9 * 0.010 / 64)
    = 195313 packets; HTB burst 1.25 MB, quantum 200000; a fresh build is one
    `tc -batch` of 1 + 2 x 88 lines (+ 2 per glide leaf).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from santhrottle.appliance.datapath.names import (
    DIRECT_MINOR,
    GLIDE_PRIO,
    ROOT_MAJOR,
    ROOT_PARENT,
    class_minor,
    class_prio,
    glide_minor,
    is_glide_minor,
    minor_class,
    minor_classid,
)

# Kernel packet scheduler tick: PSCHED_SHIFT = 6 -> 64 ns (HTB buffers and
# netem's legacy latency field are in these ticks).
PSCHED_TICK_NS = 64
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
# HTB quantum (bytes per DRR round among the classes of one prio that have a
# packet due); explicit so HTB neither computes rate/r2q (125 MB at 10 Gbit,
# clamped with a kernel warning per class) nor warns.  200000 is the
# kernel's own upper clamp and covers 64 KiB GSO and BIG TCP.
HTB_QUANTUM_BYTES = 200_000
# A glide leaf's netem `rate` only keeps its queue in order (a packet leaves
# after the one before it); it also spaces a burst by each packet's time at
# that rate, so it is the fastest TCA_NETEM_RATE takes whatever the link:
# a u32 of bytes/s (34 Gbit/s: a 64 KiB GSO packet in 15 us).
NETEM_RATE_MAX_BYTES_S = 2**32 - 1


@dataclass(frozen=True, slots=True)
class HtbParams:
    """One HTB class, in the kernel's units (bytes, bytes/s)."""

    rate_bytes_s: int
    ceil_bytes_s: int
    burst_bytes: int
    cburst_bytes: int
    quantum_bytes: int
    prio: int = 0  # HTB serves a ready packet of a lower prio first (names.class_prio)

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


def netem_limit(link_bits_s: int, delay_us: int) -> int:
    """Packets a netem leaf must hold so that link rate x delay never overflows it."""
    pkts = math.ceil(link_bits_s / 8 * delay_us * 1e-6 / MIN_FRAME_BYTES)
    return max(NETEM_LIMIT_FLOOR_PKTS, pkts)


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


def glide_leaf(kind: str, minor: int, link_bits_s: int, max_delay_us: int) -> Leaf:
    """A glide leaf as wanted: sized for the largest delay, its delay run-time state."""
    rate = NETEM_RATE_MAX_BYTES_S if kind == "netem" else 0
    return Leaf(kind, minor, netem_limit(link_bits_s, max_delay_us), None, rate)


def desired_tree(
    delays_us: Sequence[int], link_bits_s: int, leaf: str = "netem", glides: int = 0
) -> TcTree:
    """delays_us[k] = the delay of class k (the ladder's; delays_us[0] = 0, no class)."""
    t = TcTree("htb", ROOT_MAJOR, DIRECT_MINOR)
    netem = leaf == "netem"
    for k in range(1, len(delays_us)):
        minor = class_minor(k)
        t.classes[minor] = htb_params(link_bits_s, class_prio(k))
        delay = delays_us[k]
        t.leaves[minor] = Leaf(
            leaf, minor, netem_limit(link_bits_s, delay), delay if netem else None
        )
    for i in range(glides):
        minor = glide_minor(i)
        t.classes[minor] = htb_params(link_bits_s, GLIDE_PRIO)
        t.leaves[minor] = glide_leaf(leaf, minor, link_bits_s, delays_us[-1])
    return t


def render_tc_plan(device: str, want: TcTree, have: TcTree | None) -> list[str]:
    """`tc -batch` lines that turn `have` into `want` (both ours, or have not ours)."""
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


# ------------------------------------------------------- reading records
# A record is what datapath/tc.py makes of a pyroute2 tc message:
# {"handle": int, "parent": int, "kind": str, "options": <TCA_OPTIONS as
# dict>, "stats": <TCA_STATS2 as dict>}.


def nla(options: Any) -> dict[str, Any]:
    """pyroute2 nested attrs ({'attrs': [(name, value), ...]}) -> dict."""
    if not isinstance(options, dict):
        return {}
    out = {k: v for k, v in options.items() if k != "attrs"}
    for item in options.get("attrs", []):
        out[item[0]] = item[1]
    return out


def basic_stats(rec: Mapping[str, Any]) -> tuple[int, int]:
    """(packets, bytes) of a tc record's basic stats."""
    b = nla(rec.get("stats")).get("TCA_STATS_BASIC") or {}
    return int(b.get("packets", 0)), int(b.get("bytes", 0))


def queued(rec: Mapping[str, Any]) -> int:
    """Packets queued in a tc record's class (an HTB class: its leaf's qlen)."""
    q = nla(rec.get("stats")).get("TCA_STATS_QUEUE") or {}
    return int(q.get("qlen", 0))


def observe_tree(
    qdiscs: Sequence[Mapping[str, Any]], classes: Sequence[Mapping[str, Any]]
) -> TcTree:
    """Our view of a device's tree from records of its qdiscs and classes.
    Only the root and, when the root is ours, its classes and leaves count."""
    root = next((q for q in qdiscs if q["parent"] == ROOT_PARENT), None)
    if root is None:
        return TcTree(None, 0)
    t = TcTree(root["kind"], root["handle"] >> 16)
    if not t.ours:
        return t
    t.default_minor = (nla(root.get("options")).get("TCA_HTB_INIT") or {}).get("defcls")
    for c in classes:
        h = c["handle"]
        if h >> 16 != ROOT_MAJOR or c.get("kind") != "htb":
            continue
        o = nla(c.get("options"))
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
        if parent == ROOT_PARENT or parent >> 16 != ROOT_MAJOR:
            continue
        o = nla(q.get("options"))
        minor = parent & 0xFFFF
        if q["kind"] == "netem":
            delay_us = round(o.get("delay", 0) * PSCHED_TICK_NS / 1000)
            rate = int((o.get("TCA_NETEM_RATE") or {}).get("rate", 0))
            t.leaves[minor] = Leaf("netem", q["handle"] >> 16, o.get("limit", 0), delay_us, rate)
        else:
            t.leaves[minor] = Leaf(q["kind"], q["handle"] >> 16, o.get("limit", 0))
    return t


def tree_summary(tree: TcTree) -> dict[str, Any]:
    """Class count, delays and leaf kind of one of our trees (for show / discover).

    delays_us: every class's delay (index k; [0] = 0) when every class has a
    netem leaf with one, else None (pfifo leaves, a partial tree)."""
    ks = sorted(k for k in (minor_class(m) for m in tree.classes) if k)
    leaves = [tree.leaves[class_minor(k)] for k in ks if class_minor(k) in tree.leaves]
    kinds = sorted({lf.kind for lf in leaves})
    delays: list[int] | None = None
    if (
        ks == list(range(1, len(ks) + 1))
        and len(leaves) == len(ks)
        and all(lf.kind == "netem" and lf.delay_us for lf in leaves)
    ):
        delays = [0] + [lf.delay_us or 0 for lf in leaves]
    step_us = delays[1] if delays else None
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
        "delays_us": delays,
        "link_bits_s": hp.rate_bytes_s * 8 if hp else None,
    }
