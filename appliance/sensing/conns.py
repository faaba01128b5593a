"""Established TCP connections on the storage ports, from sock_diag (pyroute2).

On a target whose TPGs generate their ACLs (generate_node_acls=1) LIO
keeps no initiator addresses, and nvmet never does: the peers of the
established connections to the portal ports are the connected initiators.
One dump of all established IPv4 + IPv6 TCP sockets, filtered here by local
port (~1.5 ms for thousands of sockets, design.md).

A dump can be captured as JSON (`santhrottle-capture` in the lab) and parsed
with parse_diag_dump(), the same code path as a live dump.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TCP_ESTABLISHED = 1
DIAG_FIELDS = ("idiag_src", "idiag_sport", "idiag_dst", "idiag_dport", "idiag_state")


@dataclass(frozen=True, slots=True)
class TcpConn:
    local_ip: str
    local_port: int
    peer_ip: str
    peer_port: int


def _norm(ip: str) -> str:
    """Canonical text form; IPv4-mapped IPv6 (::ffff:a.b.c.d) as IPv4."""
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def parse_diag_dump(records: Iterable[Mapping[str, Any]], ports: Iterable[int]) -> list[TcpConn]:
    """sock_diag records (dicts with the idiag_* fields) -> established conns on `ports`."""
    wanted = set(ports)
    out: list[TcpConn] = []
    for r in records:
        try:
            if r.get("idiag_state", TCP_ESTABLISHED) != TCP_ESTABLISHED:
                continue
            sport = int(r["idiag_sport"])
            if sport not in wanted:
                continue
            out.append(
                TcpConn(_norm(r["idiag_src"]), sport, _norm(r["idiag_dst"]), int(r["idiag_dport"]))
            )
        except (KeyError, TypeError, ValueError):
            continue  # a record we cannot read is not a connection we can use
    return out


def dump_established(netns: str | None = None) -> list[dict[str, Any]]:
    """Live dump of established TCP sockets (IPv4 and IPv6) as plain dicts."""
    from pyroute2 import DiagSocket
    from pyroute2 import netns as pnetns

    if netns:
        pnetns.pushns(netns)
    try:
        with DiagSocket() as ds:
            ds.bind()
            out = []
            for family in (socket.AF_INET, socket.AF_INET6):
                for m in ds.get_sock_stats(family=family, states=1 << TCP_ESTABLISHED):
                    out.append({k: m.get(k) for k in DIAG_FIELDS})
            return out
    finally:
        if netns:
            pnetns.popns()


class ConnectionSensor:
    """Established connections to the given local ports, optionally inside a netns."""

    def __init__(self, ports: Iterable[int], netns: str | None = None) -> None:
        self.ports = tuple(sorted(set(ports)))
        self.netns = netns

    def connections(self) -> list[TcpConn]:
        return parse_diag_dump(dump_established(self.netns), self.ports)
