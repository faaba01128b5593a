"""What is installed, as plain data (`santhrottle datapath show`), and a Datapath rebuilt from it.

What it owns
    status(): the tc tree, chain, jumps, sets, members with their counters
    and the glide leaves of a namespace, for humans and --json.
    discover(): a Datapath whose spec is read back from the kernel (the
    devices with our root qdisc, the ports from the chain, step, classes,
    link speed and leaves from the tree), for the CLI acting without the
    daemon (pin, unpin); with_gate(): a spec the CLI builds, bridged when
    its device is a bridge port.

Worked example
    After `santhrottle datapath apply --device eth1`, discover() returns a
    Datapath with spec devices ("eth1",), ports (3260, 4420), step 500 us,
    max_class 100; with nothing installed it raises NotApplied.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from santhrottle.appliance.datapath.actuator import Datapath, gate
from santhrottle.appliance.datapath.host import Host, Tools
from santhrottle.appliance.datapath.names import (
    ALL_SET_NAMES,
    DatapathError,
    NotApplied,
    ip_key,
    minor_classid,
    set_name,
)
from santhrottle.appliance.datapath.spec import DatapathSpec
from santhrottle.appliance.datapath.tc import TcDevice, installed_devices, is_bridge_port
from santhrottle.appliance.datapath.tctree import basic_stats, queued, tree_summary
from santhrottle.controller.ladder import Ladder


def glide_status(dp: Datapath, device: str | None = None) -> list[dict[str, Any]]:
    """A device's glide leaves: state, delay now, members, pending lowering,
    packets and bytes sent, packets queued."""
    tree, records = dp.device(device).glide_records()
    dp.current()  # the leaves' members, as the kernel has them
    views = {v.minor: v for v in dp.glides.views(dp.clock())}
    spec = dp.spec
    out = []
    for c in records:
        minor = c["handle"] & 0xFFFF
        packets, nbytes = basic_stats(c)
        v = views.get(minor)
        leaf = tree.leaves.get(minor)
        delay_us = leaf.delay_us if leaf is not None and leaf.kind == "netem" else None
        if delay_us is None and v is not None:
            delay_us = spec.delay_us(v.klass)
        lower_to = v.lower_to if v is not None else None
        out.append(
            {
                "leaf": minor_classid(minor),
                "state": v.state.value if v is not None else "free",
                "delay_us": delay_us,
                "members": v.members if v is not None else [],
                "lowering_to_us": None if lower_to is None else spec.delay_us(lower_to),
                "packets": packets,
                "bytes": nbytes,
                "queued": queued(c),
            }
        )
    return sorted(out, key=lambda x: x["leaf"])


def _chain6(dp: Datapath) -> dict[str, Any] | None:
    """The ip6tables side of the gate on a target host (None: a bridge, or no IPv6)."""
    got = dp.mangle.read6()
    if got is None:
        return None
    jumps, rules = got
    return {"exists": rules is not None, "jumps": jumps, "rules": rules or []}


def status(dp: Datapath) -> dict[str, Any]:
    """Everything `santhrottle datapath show` prints, as plain data."""
    jumps, chain_rules = dp.mangle.read()
    devices = installed_devices(dp.host)
    dev = (
        (dp.spec.devices[0] if dp.spec.devices else None)
        or (dp.mangle.device_of(jumps[0]) if jumps else None)
        or (devices[0] if devices else None)
    )
    out: dict[str, Any] = {
        "netns": dp.netns,
        "backend": dp.mangle.backend(),
        # the gate in front of the classes: ipset + iptables, or nftables' bridge family
        "gate": "nft" if dp.spec.bridged else "iptables",
        "device": dev,
        "installed_devices": devices,
        "chain": {
            "exists": chain_rules is not None,
            "jumps": jumps,
            "rules": chain_rules or [],
            "ports": list(dp.mangle.ports_of(chain_rules or []) or []),
        },
        "chain6": _chain6(dp),
        "sets": {},
        "classes": None,
        "members": [],
    }
    heads = dp.sets.headers()
    members = dp.current() if heads else {}
    for name in ALL_SET_NAMES:
        out["sets"][name] = (
            None
            if name not in heads
            else sum(1 for m in members.values() if set_name(m.mode, m.ip) == name)
        )
    if dev:
        with contextlib.suppress(DatapathError):
            tcd = dp.device(dev)
            tree = tcd.observe()
            if tree.ours:
                out["classes"] = tree_summary(tree)
                out["classes"]["counters"] = {
                    str(k): {"packets": p, "bytes": b}
                    for k, (p, b) in sorted(tcd.class_counters().items())
                }
                out["classes"]["glides"] = glide_status(dp, dev)
    delays = (out["classes"] or {}).get("delays_us")
    for ip in sorted(members, key=ip_key):
        m = members[ip]
        out["members"].append(
            {
                "ip": ip,
                "mode": m.mode,
                "class": m.klass,
                "delay_us": delays[m.klass] if delays and m.klass < len(delays) else None,
                "packets": m.packets,
                "bytes": m.bytes,
            }
        )
    return out


def discover(netns: str | None = None, tools: Tools | None = None, **kw: Any) -> Datapath:
    """A Datapath configured from what is installed.  Raises NotApplied when
    nothing is.  kw: Datapath's keyword arguments (clock, ...)."""
    host = Host(netns, tools)
    try:
        devices = installed_devices(host)
        bridged = bool(devices) and is_bridge_port(host, devices[0])
        rules_now = gate(host, bridged)[1]
        _jumps, rules = rules_now.read()
        if rules is None or not devices:
            raise NotApplied(
                "the data path is not applied: run `santhrottle datapath apply --device IF`"
            )
        s = tree_summary(TcDevice(host, devices[0]).observe())
        ports = rules_now.ports_of(rules)
    finally:
        host.close()
    args: dict[str, Any] = {"devices": tuple(devices), "bridged": bridged}
    args.update(_ladder_args(s))
    if s["link_bits_s"]:
        args["link_bits_s"] = s["link_bits_s"]
    if s["leaf"] == "pfifo":
        args["leaf"] = "pfifo"
    args["glide_leaves"] = s["glide_leaves"]
    if ports:
        args["ports"] = ports
    return Datapath(DatapathSpec(**args), netns=netns, tools=tools, **kw)


def with_gate(
    spec: DatapathSpec, netns: str | None = None, tools: Tools | None = None
) -> DatapathSpec:
    """spec, bridged when its first device (without one: the first with our tree) is a
    port of a bridge: the gate the CLI installs or reads by hand is the one santhrottled
    would (nftables' on a bridge)."""
    if spec.bridged:
        return spec
    host = Host(netns, tools)
    try:
        devices = spec.devices or tuple(installed_devices(host))
        bridged = bool(devices) and is_bridge_port(host, devices[0])
    finally:
        host.close()
    return dataclasses.replace(spec, bridged=True) if bridged else spec


def _ladder_args(summary: dict[str, Any]) -> dict[str, Any]:
    """DatapathSpec's ladder fields for an installed tree: from its netem delays,
    else (pfifo leaves) the default ladder if it has that many classes, else a
    linear one of the default step."""
    delays = summary.get("delays_us")
    lad = Ladder.matching(delays) if delays else None
    if lad is None:
        n = summary.get("max_class") or 0
        if not n or n == Ladder().max_class:
            return {}
        lad = Ladder.linear(Ladder().step_us, n)
    return {"step_us": lad.step_us, "max_delay_us": lad.max_delay_us, "ladder_ratio": lad.ratio}
