"""The bridge itself: a transparent Linux bridge between the initiators' port and the array's.

Problem
    In bridge mode santhrottle stands on the path between the initiators
    and the array: two ports (the initiator side, the array side) joined by
    a Linux bridge that forwards every frame and holds no address. The
    appliance must build it on a fresh host, or adopt one an admin made,
    and a restart of santhrottled must never black-hole the storage
    network: the bridge stays, and it forwards at once.

Law
    ensure(): the bridge NAME exists (created with kind bridge if absent;
    an existing device of another kind is refused), with STP off and a
    forward delay of 0 (a port joining a bridge with STP on listens and
    learns for 2 x forward_delay, 30 s by default, before it forwards: a
    restart would stop the storage traffic that long); both ports are its
    members (a port that belongs to another master is refused: it is
    someone else's); the bridge and both ports are up. Applied again it
    changes nothing that is already so (adoption); nothing else on the
    bridge is touched (other ports, VLAN filtering, an address an admin
    gave it).
    The kernel's bridge forwards whether santhrottled runs or not (fail
    open); what santhrottled adds on the initiator-side port (the delay
    classes) its stop removes.

Bounds
    Every kernel object is named by the caller; the IPRoute handle is
    opened by the caller in the namespace it means (the daemon's netns).
    Errors are BridgeError with one line naming the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# IFLA_BR_* as pyroute2 names them
STP_OFF = 0
FORWARD_DELAY_CS = 0  # centiseconds (the kernel's unit for forward_delay)


class BridgeError(RuntimeError):
    """The bridge cannot be made as asked; the message names the device."""


@dataclass(frozen=True, slots=True)
class BridgeState:
    name: str
    index: int
    ports: tuple[str, ...]  # every member, sorted
    stp_state: int
    forward_delay_cs: int
    created: bool  # made by this call (else adopted)


def _attr(msg: Any, name: str) -> Any:
    return msg.get_attr(name)


def _linkinfo(msg: Any) -> tuple[str | None, Any]:
    info = msg.get_attr("IFLA_LINKINFO")
    if info is None:
        return None, None
    return info.get_attr("IFLA_INFO_KIND"), info.get_attr("IFLA_INFO_DATA")


def _one(ipr: Any, ifname: str) -> Any | None:
    idx = ipr.link_lookup(ifname=ifname)
    return ipr.get_links(idx[0])[0] if idx else None


def ensure(ipr: Any, name: str, initiator_port: str, array_port: str) -> BridgeState:
    """Make or adopt bridge `name` with both ports, STP off, forward delay 0, all up."""
    if initiator_port == array_port:
        raise BridgeError(f"bridge {name}: the initiator and array ports are both {array_port}")
    ports = {}
    for role, port in (("initiator", initiator_port), ("array", array_port)):
        msg = _one(ipr, port)
        if msg is None:
            raise BridgeError(f"bridge {name}: no {role}-side device {port}")
        ports[port] = msg
    br = _one(ipr, name)
    created = br is None
    if br is None:
        ipr.link(
            "add",
            ifname=name,
            kind="bridge",
            br_stp_state=STP_OFF,
            br_forward_delay=FORWARD_DELAY_CS,
        )
        br = _one(ipr, name)
        if br is None:
            raise BridgeError(f"bridge {name}: created, but the kernel does not show it")
    else:
        kind, _ = _linkinfo(br)
        if kind != "bridge":
            raise BridgeError(f"{name} exists and is a {kind or 'plain'} device, not a bridge")
        # STP off first: with STP on the kernel refuses a forward delay under 2 s
        ipr.link("set", index=br["index"], kind="bridge", br_stp_state=STP_OFF)
        ipr.link("set", index=br["index"], kind="bridge", br_forward_delay=FORWARD_DELAY_CS)
    br_index = br["index"]
    for port, msg in ports.items():
        master = _attr(msg, "IFLA_MASTER")
        if master not in (None, br_index):
            other = ipr.get_links(master)[0].get_attr("IFLA_IFNAME")
            raise BridgeError(f"bridge {name}: port {port} already belongs to {other}")
        if master is None:
            ipr.link("set", index=msg["index"], master=br_index)
        ipr.link("set", index=msg["index"], state="up")
    ipr.link("set", index=br_index, state="up")
    return describe(ipr, name, created)


def describe(ipr: Any, name: str, created: bool = False) -> BridgeState:
    br = _one(ipr, name)
    if br is None:
        raise BridgeError(f"no bridge {name}")
    kind, data = _linkinfo(br)
    if kind != "bridge" or data is None:
        raise BridgeError(f"{name} is not a bridge")
    members = sorted(
        m.get_attr("IFLA_IFNAME")
        for m in ipr.get_links()
        if m.get_attr("IFLA_MASTER") == br["index"]
    )
    return BridgeState(
        name,
        br["index"],
        tuple(members),
        int(data.get_attr("IFLA_BR_STP_STATE")),
        int(data.get_attr("IFLA_BR_FORWARD_DELAY")),
        created,
    )
