"""Names and numbers of every kernel object the data path owns (pure).

What it owns
    The handles, set and chain names, and the arithmetic between a delay
    class and its HTB class: nothing here talks to the kernel.

    tc       root qdisc htb 5374: ("St" in ASCII); delay class k is HTB class
             5374:K with leaf qdisc K:, where K is k's decimal digits read as
             hex (class 20 is 5374:20 = minor 0x20), so a class reads as its
             number in `tc` and `ipset` output.  Glide leaves are 5374:6000
             and up (GLIDE_MINOR_BASE), above every class.  Minor 0 is HTB's
             direct queue: unthrottled.
    ipset    santhrottle-all, -ack, -read: one hash:ip set per mode for
             IPv4 initiators (an initiator is in at most one), and
             santhrottle-all6, -ack6, -read6 for IPv6 ones (a hash:ip set
             holds one family); santhrottle-members, a list:set of the
             mode sets that have members (the gate: a list:set holds sets
             of both families and matches a packet against its own).
    iptables the chain SANTHROTTLE in table mangle, in iptables and ip6tables.

HTB prio (the order HTB serves)
    HTB serves the lowest prio with a packet due and round-robins within a
    prio.  Shared class k gets prio class_prio(k): one more per doubling of
    its delay, so when a move's old and new class both have a packet due,
    the lower delay (the class it left, on a rise) goes first.  Glide leaves
    get GLIDE_PRIO, after every shared class (datapath/glide.py).

Worked example
    classid(20) = "5374:20"; class_minor(20) = 0x20; minor_class(0x20) = 20;
    class_prio(1) = 0, class_prio(12) = class_prio(14) = 3, class_prio(16) = 4;
    delay_to_class(5000, 500, 100) = 10 (5 ms at 0.5 ms steps), and
    delay_to_class(1200, 500, 100) fails naming 1ms and 1.5ms;
    check_ip("FD00:0::2") = "fd00::2", check_ip("::ffff:10.0.0.3") = "10.0.0.3",
    set_name("all", "fd00::2") = "santhrottle-all6".
"""

from __future__ import annotations

import functools
import ipaddress
import socket

from santhrottle.appliance.config.schema import MAX_CLASSES, PIN_MODES
from santhrottle.appliance.units import fmt_us
from santhrottle.controller.ladder import Ladder

# The HTB root handle major, "St" in ASCII.  The skbprio major of every set
# member must equal it (HTB looks skb->priority up as a classid of its own).
ROOT_MAJOR = 0x5374
ROOT_PARENT = 0xFFFFFFFF  # TC_H_ROOT
# HTB's default "class" 0: unclassified packets take HTB's direct queue.
DIRECT_MINOR = 0
CHAIN = "SANTHROTTLE"
MODES = PIN_MODES  # all, ack, read
SET_PREFIX = "santhrottle-"
SET_NAMES = {m: f"{SET_PREFIX}{m}" for m in MODES}  # IPv4 initiators
SET_NAMES6 = {m: f"{SET_PREFIX}{m}6" for m in MODES}  # IPv6 initiators
FAMILY_SETS = {4: SET_NAMES, 6: SET_NAMES6}
FAMILIES = (4, 6)
ALL_SET_NAMES = (*SET_NAMES.values(), *SET_NAMES6.values())
SET_MODE = {name: mode for names in FAMILY_SETS.values() for mode, name in names.items()}
SET_FAMILY = {name: fam for fam, names in FAMILY_SETS.items() for name in names.values()}
# list:set of the mode sets with members: "is the destination a member of
# any?" in one match (the gate: datapath/sets.py).
MEMBERS_SET = f"{SET_PREFIX}members"
TMP_SUFFIX = "-tmp"
# Every set name we may ever create (cleanup destroys exactly these, the
# list:set first: it holds references to the others).
OWNED_SETS = (
    MEMBERS_SET,
    *ALL_SET_NAMES,
    *(s + TMP_SUFFIX for s in ALL_SET_NAMES),
)
# Glide leaves: HTB minors 0x6000 + i, above every class minor (<= 0x5000)
# and the root's 0x5374; the leaf qdisc takes the same number as its major.
GLIDE_MINOR_BASE = 0x6000
GLIDE_MINORS_MAX = 256
# HTB has prios 0-7; glide leaves are served after every shared class.
GLIDE_PRIO = 7
assert int(str(MAX_CLASSES), 16) < ROOT_MAJOR < GLIDE_MINOR_BASE


class DatapathError(Exception):
    """One line for the admin (the CLI prints it and exits 2)."""


class NetemMissing(DatapathError):
    """The kernel has no sch_netem."""


class ForeignQdisc(DatapathError):
    """The device's root qdisc belongs to someone else."""


class NotApplied(DatapathError):
    """The data path is not installed (nothing to pin into)."""


class ObjectError(DatapathError):
    """The kernel refused an object every member of a set needs (kind: "jumps", the
    rules in front of the sets; "gate", the list:set of the sets with members), not
    one member: datapath/reconcile.py waits for it instead of blaming members."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def class_minor(k: int) -> int:
    """Delay class k -> HTB minor: k's decimal digits read as hex (20 -> 0x20)."""
    if not 1 <= k <= MAX_CLASSES:
        raise ValueError(f"class {k} outside 1..{MAX_CLASSES}")
    return int(str(k), 16)


MINOR_CLASS = {int(str(k), 16): k for k in range(1, MAX_CLASSES + 1)}


def minor_class(minor: int) -> int | None:
    """HTB minor -> delay class, None for a minor that is not a class number."""
    return MINOR_CLASS.get(minor)


def minor_classid(minor: int) -> str:
    return f"{ROOT_MAJOR:x}:{minor:x}"


def classid(k: int) -> str:
    """'5374:20' for class 20; '5374:0' for class 0 (HTB's direct queue, unthrottled)."""
    return minor_classid(DIRECT_MINOR if k == 0 else class_minor(k))


def glide_minor(i: int) -> int:
    return GLIDE_MINOR_BASE + i


def is_glide_minor(minor: int) -> bool:
    return GLIDE_MINOR_BASE <= minor < GLIDE_MINOR_BASE + GLIDE_MINORS_MAX


def class_prio(k: int) -> int:
    """HTB prio of shared delay class k: 0 for class 1, one more per doubling
    of the class number, at most GLIDE_PRIO - 1 (a lower delay is served first)."""
    return min(k.bit_length() - 1, GLIDE_PRIO - 1)


CLASS_PRIO = [0] + [class_prio(k) for k in range(1, MAX_CLASSES + 1)]


def delay_to_class(delay_us: int, ladder: Ladder) -> int:
    """The class whose delay is exactly delay_us; anything else is an error
    naming the neighbours (no silent rounding: the admin asked for a delay)."""
    if delay_us < 0:
        raise DatapathError(f"bad delay {fmt_us(delay_us)}: negative")
    if delay_us > ladder.max_delay_us:
        raise DatapathError(
            f"delay {fmt_us(delay_us)} is above the maximum {fmt_us(ladder.max_delay_us)} "
            f"(class {ladder.max_class})"
        )
    k = ladder.class_of_us(delay_us)
    if k is None:
        hi = ladder.class_at_least(delay_us / 1e6)
        lo, up = ladder.delay_us(hi - 1), ladder.delay_us(hi)
        raise DatapathError(
            f"delay {fmt_us(delay_us)} is not a delay of the ladder: use {fmt_us(lo)} "
            f"(class {hi - 1}) or {fmt_us(up)} (class {hi})"
        )
    return k


def family(ip: str) -> int:
    """4 or 6: the family of a canonical address (check_ip's output)."""
    return 6 if ":" in ip else 4


def set_name(mode: str, ip: str) -> str:
    """The set of `mode` that holds `ip` (a canonical address): its family's."""
    return (SET_NAMES6 if ":" in ip else SET_NAMES)[mode]


def check_ip(ip: str) -> str:
    """The canonical form of an IPv4 or IPv6 address as the kernel and ipset print
    it, or a one-line error.  An IPv6 zone ("fe80::1%eth1") is dropped (a set
    member is an address; the link is the device's); an IPv4-mapped IPv6
    address is its IPv4 address (what a dual-stack socket reports)."""
    text = ip.split("%", 1)[0] if isinstance(ip, str) else ip
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise DatapathError(
            f"bad initiator address {ip!r}: expected an IPv4 or IPv6 address"
        ) from None
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return socket.inet_ntop(socket.AF_INET6, addr.packed)
    return str(addr)


def is_canonical_ip(ip: str) -> bool:
    """Fast path of check_ip for the 10,000-member convergence (~0.3 us vs
    ~2 us for ipaddress): the address exactly as the kernel prints it."""
    try:
        if ":" not in ip:
            return socket.inet_ntop(socket.AF_INET, socket.inet_pton(socket.AF_INET, ip)) == ip
        packed = socket.inet_pton(socket.AF_INET6, ip)
    except (OSError, TypeError):
        return False
    return socket.inet_ntop(socket.AF_INET6, packed) == ip and not packed.startswith(_MAPPED)


_MAPPED = bytes(10) + b"\xff\xff"  # ::ffff:0:0/96, IPv4-mapped


# Sort keys kept (ip_key): the initiators of the largest installations twice over.
IP_KEY_CACHE_ENTRIES = 32_768


@functools.lru_cache(maxsize=IP_KEY_CACHE_ENTRIES)
def ip_key(ip: str) -> tuple[int, int, str]:
    """Sort key of an address: IPv4 before IPv6, then numerically (a zone ignored);
    anything that is not an address after them, by its text.  Through inet_pton and
    cached: a status of 10,000 initiators sorts them at every tick."""
    text = ip.split("%", 1)[0]
    fam, version = (socket.AF_INET6, 6) if ":" in text else (socket.AF_INET, 4)
    try:
        return version, int.from_bytes(socket.inet_pton(fam, text)), ""
    except OSError:
        return 9, 0, ip
