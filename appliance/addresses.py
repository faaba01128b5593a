"""Initiator addresses: one check for every entry; what the data path cannot hold stays out.

Problem
    An initiator is delayed by putting its address into a `hash:ip` set (or an
    nftables set on a bridge) that the egress device's packets are matched
    against.  Some addresses are not an initiator's: the kernel refuses
    0.0.0.0 in a hash:ip set (ipset error 4353), and an address no storage
    initiator sends from (loopback, multicast, broadcast) or one that names a
    host only on one link (link-local: the set holds it without its link) would
    delay nobody or the wrong host.  Every entry checks with this module: the
    command line and the control socket (pin, unpin), the state file's pins,
    the configuration ([groups.NAME] members, [hosts.NAME] addresses, the
    static map) and the fleet's decisions; the data path refuses what reaches
    it anyway (a discovered address) the same way, member by member.

What is refused, with one line
    unspecified  0.0.0.0/8 ("this network"), ::
    loopback     127.0.0.0/8, ::1
    multicast    224.0.0.0/4, ff00::/8
    broadcast    255.255.255.255
    reserved     240.0.0.0/4 (besides the broadcast address)
    link-local   169.254.0.0/16, fe80::/10 (the data path's sets match an
                 address on every link alike: a zone, "%eth1", cannot be kept)
    A zone on any other address is dropped ("fd00::2%eth1" is "fd00::2").
    Every other IPv4 or IPv6 unicast address is accepted, in the data path's
    canonical form: IPv6 as the kernel prints it ("FD00:0::2" is "fd00::2"),
    an IPv4-mapped IPv6 address as its IPv4 address (what a dual-stack socket
    reports), checked after that mapping ("::ffff:0.0.0.0" is 0.0.0.0).

Networks ([groups.NAME] members, the static map)
    A network is refused only when every address in it is refused
    ("224.0.0.0/8", "fe80::/64"); 0.0.0.0/0 and ::/0 mean every initiator.

Worked example
    initiator_address("FD00::2") -> "fd00::2"
    initiator_address("::ffff:10.0.0.3") -> "10.0.0.3"
    initiator_address("0.0.0.0") -> AddressError "'0.0.0.0' is unspecified, not an
        initiator's address"
    initiator_address("fe80::1%eth1") -> AddressError "'fe80::1%eth1' is link-local:
        the data path matches an address on every link alike; give the
        initiator's global or unique local address"
    initiator_network("10.0.1.0/24") -> "10.0.1.0/24"
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

# The longest address text worth parsing (an IPv6 address with a zone is < 64).
MAX_ADDRESS_CHARS = 128
# A value quoted in an error is cut to this many characters.
MAX_QUOTE_CHARS = 80

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network
# (network, what it is, why it is not an initiator's), most specific first
REFUSED: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str, str], ...] = (
    (_V4("255.255.255.255/32"), "broadcast", "not one host"),
    (_V4("0.0.0.0/8"), "unspecified", "not an initiator's address"),
    (_V4("127.0.0.0/8"), "loopback", "never leaves this host"),
    (_V4("224.0.0.0/4"), "multicast", "not one host"),
    (_V4("240.0.0.0/4"), "reserved", "not an initiator's address"),
    (_V4("169.254.0.0/16"), "link-local", ""),
    (_V6("::/128"), "unspecified", "not an initiator's address"),
    (_V6("::1/128"), "loopback", "never leaves this host"),
    (_V6("ff00::/8"), "multicast", "not one host"),
    (_V6("fe80::/10"), "link-local", ""),
)
LINK_LOCAL_WHY = (
    "the data path matches an address on every link alike; give the initiator's "
    "global or unique local address"
)


class AddressError(ValueError):
    """Not an initiator's address: one line naming it and why."""


class RefusedAddress(AddressError):
    """An IP address, but none an initiator has (REFUSED): the state file drops
    such a pin with a warning instead of setting the whole file aside."""


def quoted(v: Any) -> str:
    """The value as the admin wrote it, on one line, printable, cut when long: a
    newline or a NUL in it cannot forge a log line."""
    text = repr(v)
    return text if len(text) <= MAX_QUOTE_CHARS else text[: MAX_QUOTE_CHARS - 3] + "..."


def _parse(v: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if not isinstance(v, str) or len(v) > MAX_ADDRESS_CHARS:
        raise AddressError(f"{quoted(v)} is not an IPv4 or IPv6 address")
    text = v.partition("%")[0]  # a zone is dropped: a set member is an address
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise AddressError(f"{quoted(v)} is not an IPv4 or IPv6 address") from None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr


def refusal(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[str, str] | None:
    """(what it is, why it is refused) for an address no initiator has, else None."""
    for net, what, why in REFUSED:
        if addr.version == net.version and addr in net:
            return what, why or LINK_LOCAL_WHY
    return None


def canonical(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """The text the kernel and ipset print for an address."""
    if isinstance(addr, ipaddress.IPv6Address):
        return socket.inet_ntop(socket.AF_INET6, addr.packed)
    return str(addr)


def initiator_address(v: Any) -> str:
    """An initiator's address in the data path's canonical form, or AddressError."""
    addr = _parse(v)
    bad = refusal(addr)
    if bad is not None:
        what, why = bad
        article = "an" if what[0] in "aeiou" else "a"
        if what in ("unspecified", "link-local", "reserved"):
            raise RefusedAddress(f"{quoted(v)} is {what}: {why}")
        raise RefusedAddress(f"{quoted(v)} is {article} {what} address: {why}")
    return canonical(addr)


def initiator_network(v: Any) -> str:
    """A network of initiators ("10.0.1.0/24", strict=False: host bits dropped) in
    ipaddress' form, or AddressError when it holds no initiator's address."""
    if not isinstance(v, str) or len(v) > MAX_ADDRESS_CHARS:
        raise AddressError(f"{quoted(v)} is not a network")
    if "/" not in v:  # one address: said as one
        return str(ipaddress.ip_network(initiator_address(v)))
    try:
        net = ipaddress.ip_network(v, strict=False)
    except ValueError:
        raise AddressError(f"{quoted(v)} is not a network (e.g. 10.0.1.0/24)") from None
    for bad, what, _why in REFUSED:
        if net.version == bad.version and net.subnet_of(bad):  # type: ignore[arg-type]
            raise RefusedAddress(f"{quoted(v)} holds only {what} addresses, no initiator's")
    return str(net)
