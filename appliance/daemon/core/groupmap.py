"""Who is in which initiator group: [groups.NAME] members matched against initiators.

What it owns
    GroupMap: from the configured groups, the group of an initiator known by
    its address and the names it logged in with (iSCSI IQNs, NVMe host NQNs).
    Host names are resolved once, when the map is built (a reload builds it
    again), through the `resolve` parameter; one that does not resolve is an
    error naming it (GroupMapError), so a reload keeps the running map.

Precedence (the most specific member wins; a tie goes to the group first in
the file)
    1. a name the initiator logged in with (iqn.*, nqn.*);
    2. its address, written or resolved from a host name;
    3. the longest network that holds its address.

Worked example
    groups db = ["10.0.1.0/24", "iqn.2024-01.com.example:db1"] and backup =
    ["10.0.1.7"]: 10.0.1.7 is in backup (an address beats a network) unless it
    logged in as iqn.2024-01.com.example:db1 (a name beats an address); 10.0.1.8
    is in db; 10.0.2.1 is in no group.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Mapping

from santhrottle.appliance.config.initiators import member_kind
from santhrottle.appliance.config.parse import ConfigError, GroupConfig

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class GroupMapError(ConfigError):
    """A member that cannot be used (a host name that does not resolve); one line."""


def resolve_host(name: str) -> list[str]:
    """Every address of a host name (the system's resolver)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as e:
        raise GroupMapError(f"host {name!r} does not resolve: {e}") from None
    return sorted({str(ipaddress.ip_address(str(i[4][0]).split("%")[0])) for i in infos})


class GroupMap:
    def __init__(
        self,
        groups: Mapping[str, GroupConfig],
        resolve: Callable[[str], list[str]] = resolve_host,
    ) -> None:
        self.by_name: dict[str, str] = {}  # lower-cased IQN / NQN -> group
        self.by_address: dict[str, str] = {}
        self.networks: list[tuple[int, Network, str]] = []  # longest prefix first
        for order, (gname, g) in enumerate(groups.items()):
            for m in g.members:
                kind = member_kind(m)
                if kind in ("iscsi", "nvme"):
                    self.by_name.setdefault(m.lower(), gname)
                elif kind == "address":
                    self.by_address.setdefault(str(ipaddress.ip_address(m)), gname)
                elif kind == "network":
                    net = ipaddress.ip_network(m, strict=False)
                    self.networks.append((-net.prefixlen * 10_000 + order, net, gname))
                elif kind == "host":
                    for addr in resolve(m):
                        self.by_address.setdefault(addr, gname)
        self.networks.sort(key=lambda x: x[0])

    def group_of(self, address: str, names: Iterable[str] = ()) -> str | None:
        """The group of the initiator at `address` that logged in as `names`; None: none."""
        for n in names:
            g = self.by_name.get(n.lower())
            if g is not None:
                return g
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return None
        g = self.by_address.get(str(ip))
        if g is not None:
            return g
        for _, net, gname in self.networks:
            if ip.version == net.version and ip in net:
                return gname
        return None

    def group_of_all(
        self, initiators: Iterable[str], names: Mapping[str, Iterable[str]] | None = None
    ) -> dict[str, str]:
        """initiator address -> group, for those in a group."""
        names = names or {}
        out: dict[str, str] = {}
        for ini in initiators:
            g = self.group_of(ini, names.get(ini, ()))
            if g is not None:
                out[ini] = g
        return out
