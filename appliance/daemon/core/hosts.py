"""Dual-stack hosts: the addresses a [hosts.NAME] says are one initiator, one to the controller.

What it owns
    HostMap, built from the configuration's [hosts.NAME] (config/hosts.py)
    at start and at every reload: each host's addresses in the data path's
    canonical form (datapath/names.py check_ip), IPv4 before IPv6
    (ip_key), and the translation between the kernel's per-address world
    and the controller's per-initiator one.  The controller (controller/,
    pure) knows nothing of hosts: it is handed one key per host, the host's
    first address (its "key"), so everything it keeps per initiator (the
    write-rate EWMAs, the write-heavy sets, the effective classes) holds a
    host once, and a key is always an address (a reload that changes the
    hosts leaves nothing behind that is not one).

    fold_writes()  the sensors' WriteSamples with a host's addresses summed
                   into one sample of its key per resource: a host writing
                   half over IPv4 and half over IPv6 is judged on its total.
    spread()       the controller's classes per initiator -> per address:
                   every address of a host gets the highest class of the
                   host's key and its addresses (the groups' classes are
                   per address), so a host's addresses are delayed alike.
    key()          the key of an address (itself when it is in no host).

    Pins stay per address (the admin names one address); the kernel's
    members, their counters and the adopted members are per address too.
    Without [hosts] every call is the identity at the cost of one test.

Worked example
    [hosts.db1] addresses = ["fd00:1::5", "10.0.1.5"]:
    key("fd00:1::5") = "10.0.1.5"; fold_writes([("vg0", "10.0.1.5", 1e6),
    ("vg0", "fd00:1::5", 1e6), ("vg0", "10.0.0.9", 5e5)]) ->
    [("vg0", "10.0.1.5", 2e6), ("vg0", "10.0.0.9", 5e5)];
    spread({"10.0.1.5": 20, "10.0.0.9": 3}) ->
    {"10.0.1.5": 20, "fd00:1::5": 20, "10.0.0.9": 3}.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from santhrottle.appliance.config.hosts import HostConfig
from santhrottle.appliance.datapath.names import check_ip, ip_key
from santhrottle.controller.domain import WriteSample


@dataclass(frozen=True)
class Host:
    name: str
    addresses: tuple[str, ...]  # canonical, IPv4 first then IPv6, numerically

    @property
    def key(self) -> str:
        """The controller's initiator for the host: its first address."""
        return self.addresses[0]


@dataclass
class HostMap:
    hosts: dict[str, Host] = field(default_factory=dict)  # name -> host
    by_address: dict[str, Host] = field(default_factory=dict)  # every address -> its host

    @classmethod
    def of(cls, configured: Mapping[str, HostConfig]) -> HostMap:
        """The map of the file's hosts (their addresses are checked by the parser)."""
        out = cls()
        for name, hc in configured.items():
            addrs = sorted({check_ip(a) for a in hc.addresses}, key=ip_key)
            host = out.hosts[name] = Host(name, tuple(addrs))
            for a in addrs:
                out.by_address[a] = host
        return out

    def __bool__(self) -> bool:
        return bool(self.hosts)

    def host_of(self, address: str) -> Host | None:
        return self.by_address.get(address)

    def key(self, address: str) -> str:
        """The controller's initiator for `address`: its host's key, else itself."""
        host = self.by_address.get(address)
        return address if host is None else host.key

    def addresses_of(self, key: str) -> tuple[str, ...]:
        """Every address behind a controller initiator (a host's key: all of its)."""
        host = self.by_address.get(key)
        return (key,) if host is None else host.addresses

    def fold_writes(self, writes: list[WriteSample]) -> list[WriteSample]:
        """One sample per (resource, initiator), a host's addresses summed under its
        key, in the order the first of each came; the list itself without hosts."""
        if not self.by_address:
            return writes
        by = self.by_address
        summed: dict[tuple[str, str], float] = {}
        for res, ini, bps in writes:
            host = by.get(ini)
            k = (res, ini if host is None else host.key)
            summed[k] = summed.get(k, 0.0) + bps
        return [WriteSample(res, ini, bps) for (res, ini), bps in summed.items()]

    def spread(self, classes: Mapping[str, int]) -> Mapping[str, int]:
        """Classes per controller initiator -> per address: every address of a host at
        the highest class of its key and its addresses; the mapping itself without
        hosts."""
        if not self.by_address:
            return classes
        by = self.by_address
        out: dict[str, int] = {}
        for ini, k in classes.items():
            host = by.get(ini)
            for a in (ini,) if host is None else host.addresses:
                if out.get(a, 0) < k:
                    out[a] = k
        return out

    def rows(self, addresses: Iterable[str]) -> dict[str, list[str]]:
        """The initiators' rows: key -> the addresses shown in it (a host's row lists
        every address it has, seen or not), in the order of their first address."""
        if not self.by_address:
            return {a: [a] for a in addresses}
        out: dict[str, list[str]] = {}
        by = self.by_address
        for a in addresses:
            host = by.get(a)
            if host is None:
                out.setdefault(a, [a])
            elif host.key not in out:
                out[host.key] = list(host.addresses)
        return out
