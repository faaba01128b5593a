"""The configuration's Kinds that name initiators: a group's members and a host's addresses.

What it owns
    member_kind(): what a [groups.NAME] member names (an address, a network, an
    iSCSI or NVMe name, a host name); group_members() and host_addresses(), the
    Kinds of groups.NAME.members and hosts.NAME.addresses (config/schema.py).
    An address or network is checked by appliance/addresses.py, the one check
    of initiators' addresses every entry uses: 0.0.0.0, ::, loopback,
    multicast, broadcast, reserved and link-local addresses are refused.

Worked example
    member_kind("iqn.2024-01.com.example:db1") -> "iscsi"; member_kind("10.0.1.0/24")
    -> "network"; group_members().parse(["0.0.0.0"]) -> KindError "'0.0.0.0' is
    unspecified: not an initiator's address".
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from santhrottle.appliance.addresses import AddressError, initiator_address, initiator_network
from santhrottle.appliance.config.kinds import Kind, KindError, kind_error

# ----------------------------------------------------------------- groups
# An initiator group's member: an address, a network, an iSCSI or NVMe name, a host.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_RE = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
_ISCSI_NAME_RE = re.compile(
    r"^(iqn\.\d{4}-\d{2}\.[^\s]+|eui\.[0-9A-Fa-f]{16}|naa\.[0-9A-Fa-f]{16,32})$"
)
_NQN_RE = re.compile(r"^nqn\.[^\s]{1,219}$")
MEMBER_KINDS = ("address", "network", "iscsi", "nvme", "host")


def member_kind(text: str) -> str | None:
    """What a group member names (MEMBER_KINDS), or None for nothing valid."""
    if _ISCSI_NAME_RE.match(text):
        return "iscsi"
    if _NQN_RE.match(text):
        return "nvme"
    try:
        ipaddress.ip_address(text)
        return "address"
    except ValueError:
        pass
    if "/" in text:
        try:
            ipaddress.ip_network(text, strict=False)
            return "network"
        except ValueError:
            return None
    return "host" if _HOST_RE.match(text) and not text.replace(".", "").isdigit() else None


def group_members() -> Kind:
    def parse(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list) or not v:
            raise kind_error(v, "must be a non-empty list of members")
        for x in v:
            kind = member_kind(x) if isinstance(x, str) else None
            if kind is None:
                raise kind_error(
                    x,
                    "is not a member: give an address, a network (10.0.1.0/24), an iSCSI "
                    "name (iqn.*), an NVMe name (nqn.*) or a host name",
                )
            try:  # the one check of initiators' addresses (appliance/addresses.py)
                if kind == "address":
                    initiator_address(x)
                elif kind == "network":
                    initiator_network(x)
            except AddressError as e:
                raise KindError(str(e)) from None
        return tuple(v)

    return Kind("list of addresses, networks, host names or initiator names", parse)


# ------------------------------------------------------------------ hosts
def host_address(v: Any) -> str:
    """One address of a [hosts.NAME]: IPv4 or IPv6, without a zone or a prefix,
    as ipaddress writes it ("FD00:1::5" -> "fd00:1::5"); an IPv4-mapped IPv6
    address is refused (it is its IPv4 address: write that)."""
    if not isinstance(v, str):
        raise kind_error(v, 'is not an address: write it as a string, e.g. "10.0.1.5"')
    if "%" in v:
        raise kind_error(v, "has a zone: a host's address is written without one")
    if "/" in v:
        raise kind_error(v, "is a network: a host's addresses are single addresses")
    try:
        addr = ipaddress.ip_address(v)
    except ValueError:
        raise kind_error(v, "is not an IPv4 or IPv6 address") from None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        raise kind_error(v, f"is IPv4-mapped: write the IPv4 address {addr.ipv4_mapped}")
    try:  # the one check of initiators' addresses (appliance/addresses.py)
        initiator_address(v)
    except AddressError as e:
        raise KindError(str(e)) from None
    return str(addr)


def host_addresses() -> Kind:
    def parse(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list) or not v:
            raise kind_error(
                v, 'must be a non-empty list of addresses, e.g. ["10.0.1.5", "fd00::5"]'
            )
        out: list[str] = []
        for x in v:
            a = host_address(x)
            if a in out:
                raise KindError(f"{a} is given twice")
            out.append(a)
        return tuple(out)

    return Kind("list of IPv4 and IPv6 addresses", parse)
