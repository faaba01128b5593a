"""Drift: what changed in the kernel under the data path's feet, found without changing anything.

Problem
    The kernel objects santhrottle owns (each device's tc tree, the member
    sets and their gate, the chain and its jumps in iptables and ip6tables, or
    the bridge's nftables table) can be removed or changed by someone else: a
    `santhrottle cleanup` while the daemon runs, an `ipset flush`, `tc qdisc
    del`, a firewall reload.  Before, the daemon went on reporting `running`,
    its pins and 0 actuator errors while nothing was delayed.

What it owns
    Expected: what the data path left (the sets' membership as it last wrote
    it, whether the jumps are in, the fingerprint of the chain and its jumps
    in nftables: datapath/mangle.py), taken from the tick's thread.
    find_missing(): the presence read, at every convergence, through raw
    netlink requests (datapath/presence.py): each device's root qdisc and, at
    every TREE_DIGEST_EVERY-th read, its tree's digest (every class's and
    leaf's configuration) against the one the last full comparison found as
    wanted, the sets' headers and member
    counts (one header-only dump), nftables' generation and, only when it
    moved since the chain was written, the chain's fingerprints
    (libnftables, in-process); on a bridge, instead of the sets and the
    chain, the table's presence (one NFT_MSG_GETTABLE) and nftables'
    generation against the one after the table's last transaction
    (datapath/nftgate.py) or the one find_drift() last found it as left at:
    one that moved names the table; no process, no pyroute2, no listing.
    What it names sends the daemon to find_drift() at once.  Watch: its
    sockets and a Host, kept by the convergence worker from one check to
    the next.
    find_drift(): the full comparison (the daemon's every CHECK_EVERY_S):
    reads the kernel with netlink sockets of its own (Host: it
    runs in the convergence worker, never on the tick's sockets) and names each
    object that is missing or not as left, one line each.  A device's tree is
    compared object by object (pyroute2) only when it is not known as wanted
    for this spec (never found so, or the presence read found its root or its
    digest not as it was), and otherwise at every TREE_RECHECK_EVERY-th full
    comparison (a glide leaf's options, which the digest leaves out, are then
    compared too):
        tc: DEV: the root qdisc is not santhrottle's (KIND), or DEV is gone
        tc: DEV: N class(es) or leaf qdisc(s) missing or changed
        ipset: NAME is missing, or has no counters/skbinfo
        ipset: NAME holds N members, santhrottle left M there
        ipset: N member(s) not in the set or class santhrottle left
        ipset: santhrottle-members lists A, santhrottle left B
        iptables: the chain SANTHROTTLE or its jumps are missing or changed
        nft: table bridge santhrottle: ... (bridge mode: its maps, chains, members)
    The repair is the data path's apply() (reconcile: build what is missing,
    change what differs, read the members back), run by the daemon on the
    tick's thread at its next tick (core/loop.py), each line logged and counted.

Cost
    find_missing(), every convergence: 0.09 ms of CPU on the development host
    (a root 7 us, the sets' header dump 73 us, the generation 6 us); the
    fingerprints (0.1-0.2 ms a family) only after nftables changed; on a
    bridge the roots, the table (6 us) and the generation, the table listed
    (find_drift) only after nftables changed; each device's tree digest about
    0.5 ms (the default ladder's 193 objects: two dumps, decoded here), 0.16 s
    under the profiler in the one-vCPU lab guest, where at every convergence
    it was the largest part of the presence read: hence every
    TREE_DIGEST_EVERY-th read.
    find_drift(): per device whose tree is not known as wanted, or at every
    TREE_RECHECK_EVERY-th call, its digest and one qdisc and one
    class dump through pyroute2 (~20 ms of CPU for the default ladder's 193
    objects on the host, 3-8 s in the one-vCPU lab guest, where it was half
    of the daemon's CPU when it ran every CHECK_EVERY_S), the header dump,
    the members of each set that holds any (one dump a set, decoded here:
    ~45 ms of CPU for 10,000 members on the host, no process), one list of
    the gate, the fingerprints; `iptables -S` and `ip6tables -S`
    (two processes) only where the chain cannot be read in-process (the
    legacy backend, no libnftables: Expected.rules is None) or once for a
    generation of nftables that moved while the fingerprints stayed (an
    in-place `iptables -R`, or anyone else's table); on a bridge one
    `list ruleset bridge` through libnftables.  The presence read only counts
    the members: a flush or a removal is found at the next convergence, a
    member moved to another class or set by hand (the counts kept) by the
    full comparison.  A root qdisc replaced or removed is found at the next
    convergence; a class or leaf of the tree removed or changed by hand under
    santhrottle's root within TREE_DIGEST_EVERY convergences.

Worked example
    The daemon pinned 10.0.0.3 at class 5; someone ran `ipset flush
    santhrottle-all`: the next convergence's find_missing -> ["ipset:
    santhrottle-all holds 0 members, santhrottle left 1 there"], then
    find_drift -> the same line; the repair reads the membership back
    (empty), and the next tick adds 10.0.0.3 again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from santhrottle.appliance.datapath.host import Host, Tools
from santhrottle.appliance.datapath.mangle import Mangles, nft_fingerprint
from santhrottle.appliance.datapath.members import KernelMembers
from santhrottle.appliance.datapath.names import (
    ALL_SET_NAMES,
    DIRECT_MINOR,
    MEMBERS_SET,
    ROOT_MAJOR,
    SET_MODE,
    DatapathError,
    is_glide_minor,
    set_name,
)
from santhrottle.appliance.datapath.nftgate import NFT_TABLE, NftRules, NftSets
from santhrottle.appliance.datapath.nftrules import TABLE
from santhrottle.appliance.datapath.presence import NFPROTO_BRIDGE, Presence
from santhrottle.appliance.datapath.sets import (
    IPSET_FLAG_WITH_COUNTERS,
    IPSET_FLAG_WITH_SKBINFO,
    MemberSets,
)
from santhrottle.appliance.datapath.spec import DatapathSpec
from santhrottle.appliance.datapath.tc import TcDevice
from santhrottle.appliance.datapath.tctree import desired_tree, render_tc_plan


@dataclass(frozen=True)
class Expected:
    """What the data path left: the sets' membership as last written (None:
    unknown after a failure, not checked), whether the jumps are in, the
    (family, fingerprint) of the chain and its jumps (None: not readable
    in-process, datapath/mangle.py) and nftables' generation they were read
    at (None: it moved during the read)."""

    members: KernelMembers | None
    jumps: bool | None
    rules: tuple[tuple[int, str], ...] | None = None
    rules_gen: int | None = None


RULES_DRIFT = "iptables: the chain SANTHROTTLE or its jumps are missing or changed"
TREE_CHANGED = "its classes or leaf qdiscs changed since the tree was last found as wanted"
NFT_TABLE_MISSING = f"nft: table {NFT_TABLE} is missing"
NFT_CHANGED = f"nft: nftables changed since the last transaction of table {NFT_TABLE}"
# A tree whose digest is the one found as wanted is looked at through pyroute2 again at
# this full comparison (every CHECK_EVERY_S: 5 minutes), for what the digest leaves out
TREE_RECHECK_EVERY = 30
# The presence read takes each tree's digest at this read (each convergence: 5 s); the
# root qdisc at every one (module header, "Cost")
TREE_DIGEST_EVERY = 5


class Watch(Presence):
    """The drift check's reader (the convergence worker's, kept between checks): the
    presence read's sockets, the nftables generation at which the programs last
    found the chain (or a bridge's table) as wanted, and each device's tree digest
    (presence.py) from the full comparison that last found it as wanted (find_drift)."""

    def __init__(self, netns: str | None, tools: Tools | None = None) -> None:
        super().__init__(Host(netns, tools))
        self.verified: tuple[int, tuple[tuple[int, str], ...] | None] | None = None
        self.trees: dict[str, bytes] = {}  # device -> its tree's digest when found as wanted
        self.trees_of: DatapathSpec | None = None  # the spec `trees` were found as wanted for
        self.unlooked: dict[str, int] = {}  # device -> full comparisons since pyroute2's look
        self.presence_reads = 0  # find_missing() calls: the digests at every TREE_DIGEST_EVERY-th

    def close(self) -> None:
        super().close()
        self.host.close()


def find_missing(spec: DatapathSpec, expected: Expected, w: Watch) -> list[str]:
    """The cheap presence read (module header): what is surely missing or not as
    left, one line each; [] does not mean nothing changed (find_drift() says)."""
    out = []
    digests = w.presence_reads % TREE_DIGEST_EVERY == 0
    w.presence_reads += 1
    for dev in spec.devices:
        try:
            kind, handle = w.root(dev)
        except DatapathError as e:
            out.append(f"tc: {dev}: {e}")
        else:
            if kind != "htb" or handle >> 16 != ROOT_MAJOR:
                out.append(f"tc: {dev}: the root qdisc is not santhrottle's ({kind or 'none'})")
            elif digests and dev in w.trees and _tree(w, dev) != w.trees[dev]:
                out.append(f"tc: {dev}: {TREE_CHANGED}")
        if out and out[-1].startswith(f"tc: {dev}: "):
            w.trees.pop(dev, None)  # not as found: the full comparison looks at it
    if spec.bridged:
        return out + _nft_missing(w, expected)
    summary = w.set_summary()
    out += _ipset_headers(summary)
    if not out and expected.members is not None:
        out += _ipset_counts(summary, expected.members)
        left = len(_per_set(expected.members))
        if summary[MEMBERS_SET][1] != left:
            out.append(f"ipset: {MEMBERS_SET} lists {summary[MEMBERS_SET][1]} set(s), not {left}")
    if _rules_unchanged(w, expected) is False:
        out.append(RULES_DRIFT)
    return out


def _rules_unchanged(w: Watch, expected: Expected) -> bool | None:
    """The chain and its jumps as left (in-process): True when nothing in nftables
    changed since they were read (the generation) or since the programs last
    found them as wanted; False when their fingerprint differs; None when the
    fingerprints agree at another generation (only the programs can tell), or
    when there is nothing to compare with (the legacy backend)."""
    if expected.jumps is None or expected.rules is None:
        return None
    gen = w.nft_generation()
    if gen == expected.rules_gen or w.verified == (gen, expected.rules):
        return True
    for family, left in expected.rules:
        if nft_fingerprint(w.host, family) != left:
            return False
    return None


def _nft_missing(w: Watch, expected: Expected) -> list[str]:
    """The bridge's table: there, and as left while nftables' generation is the one
    read after its last transaction (datapath/nftgate.py) or the one the full
    comparison last found it as left at.  Never listed here: through libnftables at
    every convergence, beside the gate's own transactions, the listing left the
    kernel sensor measuring no reads on a loaded host (test_bridge_hostile.py)."""
    gen = w.nft_generation()  # first: the nearest to `expected`, taken under the lock
    if not w.nft_table(NFPROTO_BRIDGE, TABLE):
        return [NFT_TABLE_MISSING]
    if expected.rules_gen is None or gen in (expected.rules_gen, (w.verified or (None,))[0]):
        return []
    return [NFT_CHANGED]


def _tree(w: Watch, dev: str) -> bytes | None:
    try:
        return w.tree(dev)
    except DatapathError:
        return None


def find_drift(spec: DatapathSpec, expected: Expected, w: Watch) -> list[str]:
    """Each object of the data path that is missing or changed, one line each."""
    if w.trees_of != spec:  # a new spec (a reload): no tree is known as wanted for it
        w.trees.clear()
        w.trees_of = spec
    look = [dev for dev in spec.devices if not _known(w, dev)]
    trees = {dev: _tree(w, dev) for dev in look}
    out = _tc_drift(w.host, spec, look)
    for dev in look:  # as wanted, and not changed during the read
        tree = trees[dev]
        w.unlooked[dev] = 0
        if (
            tree is not None
            and tree == _tree(w, dev)
            and not any(line.startswith(f"tc: {dev}: ") for line in out)
        ):
            w.trees[dev] = tree
        else:
            w.trees.pop(dev, None)
    if spec.bridged:
        gen = w.nft_generation()
        nft = _nft_drift(w.host, spec, expected)
        if not nft and w.nft_generation() == gen:
            w.verified = (gen, None)  # as left at gen: the presence read stays quiet
        return out + nft
    out += _ipset_drift(w, expected)
    jumps = expected.jumps
    same = _rules_unchanged(w, expected)
    if same is False:
        out.append(RULES_DRIFT)
    elif same is None and jumps is not None:
        # the legacy backend, no libnftables, or another nftables transaction since
        # the chain was read (an `iptables -R` keeps the fingerprint): the programs
        gen = w.nft_generation() if expected.rules is not None else None
        if Mangles(w.host).pending(spec.devices, spec.ports, jumps):
            out.append(RULES_DRIFT)
        elif gen is not None and expected.rules is not None:
            w.verified = (gen, expected.rules)
    return out


def _known(w: Watch, dev: str) -> bool:
    """Whether the device's tree is known as wanted (the presence read's digests have
    found it as the full comparison left it), and not yet due for pyroute2's look at
    every TREE_RECHECK_EVERY-th full comparison."""
    if dev not in w.trees:
        return False
    n = w.unlooked.get(dev, 0) + 1
    if n >= TREE_RECHECK_EVERY:
        return False
    w.unlooked[dev] = n
    return True


def _tc_drift(host: Host, spec: DatapathSpec, devices: Sequence[str]) -> list[str]:
    if not devices:
        return []
    want = desired_tree(spec.ladder.delays_us, spec.link_bits_s, spec.leaf, spec.glide_leaves)
    out = []
    for dev in devices:
        try:
            have = TcDevice(host, dev).observe()
        except DatapathError as e:
            out.append(f"tc: {dev}: {e}")
            continue
        if not have.ours:
            kind = "none" if have.kernel_default else have.root_kind
            out.append(f"tc: {dev}: the root qdisc is not santhrottle's ({kind})")
            continue
        lines = render_tc_plan(dev, want, have)
        if lines:
            out.append(f"tc: {dev}: {len(lines)} class(es) or leaf qdisc(s) missing or changed")
    return out


def _per_set(members: Mapping[str, tuple[str, int]]) -> Counter[str]:
    return Counter(set_name(mode, ip) for ip, (mode, _minor) in members.items())


def _ipset_headers(summary: Mapping[str, tuple[int, int]]) -> list[str]:
    out = []
    want_flags = IPSET_FLAG_WITH_COUNTERS | IPSET_FLAG_WITH_SKBINFO
    for name in (*ALL_SET_NAMES, MEMBERS_SET):
        if name not in summary:
            out.append(f"ipset: {name} is missing")
        elif name != MEMBERS_SET and summary[name][0] & want_flags != want_flags:
            out.append(f"ipset: {name} has no counters/skbinfo")
    return out


def _ipset_counts(
    summary: Mapping[str, tuple[int, int]], members: Mapping[str, tuple[str, int]]
) -> list[str]:
    left = _per_set(members)
    return [
        f"ipset: {name} holds {summary[name][1]} members, santhrottle left "
        f"{left.get(name, 0)} there"
        for name in ALL_SET_NAMES
        if summary[name][1] != left.get(name, 0)
    ]


def _ipset_drift(w: Watch, expected: Expected) -> list[str]:
    summary = w.set_summary()
    out = _ipset_headers(summary)
    if out or expected.members is None:
        return out
    counts = _ipset_counts(summary, expected.members)
    out += counts or _ipset_members(w, summary, expected.members)
    listed, should = MemberSets(w.host).gate_listed(), set(_per_set(expected.members))
    if listed != should:
        out.append(
            f"ipset: {MEMBERS_SET} lists {', '.join(sorted(listed)) or 'no set'}, santhrottle "
            f"left {', '.join(sorted(should)) or 'no set'}"
        )
    return out


def _ipset_members(
    w: Watch, summary: Mapping[str, tuple[int, int]], members: Mapping[str, tuple[str, int]]
) -> list[str]:
    """Members whose class (skbprio) or set changed while the counts stayed: each
    set that holds any, listed through one dump (Presence.set_members)."""
    have: dict[str, tuple[str, int]] = {}
    for name in ALL_SET_NAMES:
        if summary[name][1]:
            for ip, prio in w.set_members(name).items():
                minor = prio & 0xFFFF if prio >> 16 == ROOT_MAJOR else DIRECT_MINOR
                have[ip] = ("", -1) if ip in have else (SET_MODE[name], minor)  # in two sets
    changed = _not_as_left(have, members)
    if not changed:
        return []
    return [f"ipset: {changed} member(s) not in the set or class santhrottle left"]


def _not_as_left(have: Mapping[str, tuple[str, int]], want: Mapping[str, tuple[str, int]]) -> int:
    """How many members (ip -> (mode, minor)) differ from what was left; one the kernel
    has in a glide leaf is the data path's own handoff (datapath/glide.py)."""
    return sum(
        1
        for ip in set(have) | set(want)
        if have.get(ip) != want.get(ip) and not is_glide_minor((have.get(ip) or ("", 0))[1])
    )


def _nft_drift(host: Host, spec: DatapathSpec, expected: Expected) -> list[str]:
    sets = NftSets(host)
    state = sets.state()
    out = []
    missing = sorted(set(ALL_SET_NAMES) - set(state.maps))
    if missing:
        out.append(f"nft: table {NFT_TABLE}: map(s) {', '.join(missing)} missing")
    elif expected.members is not None:
        have = {ip: (m, minor) for ip, (m, minor, _p, _b) in state.members.items()}
        changed = _not_as_left(have, expected.members)
        if changed:
            out.append(f"nft: table {NFT_TABLE}: {changed} member(s) not as left")
    if expected.jumps is not None and NftRules(host).pending(
        spec.devices, spec.ports, expected.jumps
    ):
        out.append(f"nft: table {NFT_TABLE}: its chains or jumps are missing or changed")
    return out
