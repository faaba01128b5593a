"""Set membership: which initiator is in which delay class, and the ipset texts (pure).

What it owns
    The membership as the data path knows it (ip -> (mode, HTB minor)),
    the diff from wanted classes to ipset operations, and the `ipset
    restore` inputs that carry large diffs.  datapath/sets.py sends them.
    IPv4 and IPv6 initiators share the membership; an op names the set of
    the member's family (names.set_name: santhrottle-all6 for an IPv6 one).

    An op is (verb, set, ip, minor): ("add", "santhrottle-all", "10.0.0.3",
    0x20) puts 10.0.0.3 in santhrottle-all with skbprio 5374:20; ("del",
    "santhrottle-ack", "10.0.0.3", 0) takes it out of santhrottle-ack.  An
    initiator is in at most one mode set; moving it to another mode is a
    del from the old set and an add to the new one.

Large change sets (datapath/sets.py chooses)
    Up to BULK_THRESHOLD ops go as single netlink messages (~0.2 ms each, no
    process start); more as one `ipset restore`: either into the live sets
    (one netlink round trip per line) or, when that rewrites at most
    SWAP_LINES_PER_INPLACE_LINE members per changed one, by filling a
    temporary set (batched: ~85 messages for 10,000 members) that is swapped
    in atomically.

Worked example
    membership {"10.0.0.2": ("all", 0x4)}; plan_changes(..., {"10.0.0.2": 6,
    "10.0.0.9": 0}, "all") -> [("add", "santhrottle-all", "10.0.0.2", 0x6)]
    (10.0.0.9 is in no set: class 0 needs nothing); render_ipset_changes of
    it -> "add santhrottle-all 10.0.0.2 skbprio 5374:6\\n"; {"FD00::9": 3}
    -> [("add", "santhrottle-all6", "fd00::9", 0x3)].
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from santhrottle.appliance.datapath.names import (
    MODES,
    ROOT_MAJOR,
    SET_FAMILY,
    SET_MODE,
    TMP_SUFFIX,
    DatapathError,
    check_ip,
    class_minor,
    is_canonical_ip,
    minor_classid,
    set_name,
)

Op = tuple[str, str, str, int]  # (add|del, set name, ip, HTB minor)
KernelMembers = dict[str, tuple[str, int]]  # what the kernel's sets hold: ip -> (mode, HTB minor)

# Change sets up to this size go as single netlink ops (~0.17-0.2 ms each, no
# process start); larger ones as one `ipset restore` (~2-3 ms + a few us per
# line).  `make bench` measures the crossover (tests/bench/bench_datapath.py).
BULK_THRESHOLD = 16
# Above it: rebuild + swap the affected sets when that rewrites at most this
# many members per changed one, else change them in place (header).
SWAP_LINES_PER_INPLACE_LINE = 2.0
# ipset members per set.
MAXELEM = 65536


@dataclass(frozen=True, slots=True)
class Member:
    ip: str
    mode: str
    klass: int
    packets: int = 0
    bytes: int = 0


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise DatapathError(f"bad mode {mode!r}: expected {', '.join(MODES)}")
    return mode


def plan_changes(
    members: Mapping[str, tuple[str, int]],
    classes: Mapping[str, int],
    mode: str,
    max_class: int,
    class_of: Mapping[int, int],
) -> list[Op]:
    """The ops that move `classes` (ip -> class, 0 = out of every set) into
    place in `mode`'s set.  class_of: HTB minor -> the delay class it gives now."""
    check_mode(mode)
    ops: list[Op] = []
    minors = _minors(max_class)
    for ip_raw, k in classes.items():
        cur = members.get(ip_raw)
        # members' keys are canonical (read back from the kernel)
        ip = ip_raw if cur is not None or is_canonical_ip(ip_raw) else check_ip(ip_raw)
        if ip is not ip_raw:
            cur = members.get(ip)
        if type(k) is not int or not 0 <= k <= max_class:
            raise DatapathError(f"bad class {k!r} for {ip}: must be 0-{max_class}")
        if k == 0:
            if cur is not None:
                ops.append(("del", set_name(cur[0], ip), ip, 0))
            continue
        if cur is not None and cur[0] != mode:
            ops.append(("del", set_name(cur[0], ip), ip, 0))
        if cur is None or cur[0] != mode or class_of.get(cur[1], 0) != k:
            ops.append(("add", set_name(mode, ip), ip, minors[k]))
    return ops


@functools.lru_cache(maxsize=8)
def _minors(max_class: int) -> list[int]:
    """HTB minor of every class 0..max_class (0: not a class)."""
    return [0] + [class_minor(k) for k in range(1, max_class + 1)]


def members_after(members: Mapping[str, tuple[str, int]], ops: Sequence[Op]) -> KernelMembers:
    """The membership once ops are applied."""
    out = dict(members)
    set_mode = SET_MODE
    for op, name, ip, minor in ops:
        mode = set_mode[name]
        if op == "del":
            cur = out.get(ip)
            if cur is not None and cur[0] == mode:
                del out[ip]
        else:
            out[ip] = (mode, minor)
    return out


def modes_in(members: Mapping[str, tuple[str, int]]) -> set[str]:
    """The set names that have members."""
    return {set_name(mode, ip) for ip, (mode, _) in members.items()}


def render_ipset_changes(ops: Sequence[Op]) -> str:
    """`ipset -exist restore` input: one add/del line per op."""
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


def render_ipset_swap(name: str, members: Mapping[str, int], maxelem: int = MAXELEM) -> str:
    """`ipset restore` input that replaces the set `name` atomically: build a
    temporary set, swap it in, destroy the old contents.  members: ip -> HTB
    minor, all of the set's family."""
    tmp = name + TMP_SUFFIX
    fam = "inet6" if SET_FAMILY[name] == 6 else "inet"
    # sized up front: no rehashing while the members go in
    hashsize = max(1024, 1 << max(0, (len(members) // 4 - 1).bit_length()))
    ids: dict[int, str] = {}
    lines = [
        f"create {tmp} hash:ip family {fam} hashsize {hashsize} maxelem {maxelem} counters skbinfo"
    ]
    add = f"add {tmp} "
    for ip, minor in members.items():
        cid = ids.get(minor)
        if cid is None:
            cid = ids[minor] = " skbprio " + minor_classid(minor)
        lines.append(add + ip + cid)
    lines += [f"swap {tmp} {name}", f"destroy {tmp}", ""]
    return "\n".join(lines)


def parse_ipset_save(text: str) -> dict[str, tuple[str, int, int, int]]:
    """Our members from `ipset save NAME` output: ip -> (mode, HTB minor,
    packets, bytes).  Lines of other sets, and a member whose skbprio is not
    one of our classes (minor 0: HTB's direct queue), are what they are:
    `add santhrottle-all 10.0.0.3 packets 12 bytes 3000 skbprio 5374:20`
    -> {"10.0.0.3": ("all", 0x20, 12, 3000)}."""
    out: dict[str, tuple[str, int, int, int]] = {}
    root = f"{ROOT_MAJOR:x}:"
    for line in text.splitlines():
        f = line.split()
        if len(f) < 3 or f[0] != "add" or f[1] not in SET_MODE:
            continue
        kv = dict(zip(f[3::2], f[4::2], strict=False))
        prio = kv.get("skbprio", "")
        minor = int(prio[len(root) :], 16) if prio.startswith(root) else 0
        out[f[2]] = (SET_MODE[f[1]], minor, int(kv.get("packets", 0)), int(kv.get("bytes", 0)))
    return out


def bulk_plan(
    members_after_ops: Mapping[str, tuple[str, int]], ops: Sequence[Op]
) -> dict[str, dict[str, int]] | None:
    """For a large change set: the sets to rebuild and swap in (set name -> ip
    -> minor), or None when changing them in place rewrites less."""
    affected = {op[1] for op in ops}
    out: dict[str, dict[str, int]] = {name: {} for name in sorted(affected)}
    rebuilt = 0
    for ip, (m, minor) in members_after_ops.items():
        part = out.get(set_name(m, ip))
        if part is not None:
            part[ip] = minor
            rebuilt += 1
    if rebuilt > SWAP_LINES_PER_INPLACE_LINE * len(ops):
        return None
    return out
