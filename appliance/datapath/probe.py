"""The kernel asked for real: the data path built in a throwaway network namespace.

What it owns
    probe(spec): `santhrottled --check`'s kernel test.  A module tree can
    say a module exists and still the kernel refuses (no module loading, a
    kernel without a tree, a missing iptables match); only building tells.
    It creates a namespace of its own (santhrottle-check-PID), a veth pair
    in it, and runs on that device what a start runs, on a small tree (two
    classes, one glide leaf: every kind of object, not the configured
    count): apply() (the HTB tree with the configured leaf, netem or pfifo;
    the skbinfo ipsets; the mangle chain), one member in and out (the jump
    rule with its set and bpf matches), cleanup().  The namespace goes whatever happens.

Kernel objects
    network namespace santhrottle-check-PID, veth stchk0/stchk1 in it;
    nothing outside it is touched.

Worked example
    probe(DatapathSpec(("eth1",))) on a kernel without
    sch_netem -> ["the kernel refused the data path: netem is not available
    in this kernel: load it with `modprobe sch_netem` or ..."]; with leaf
    "pfifo" on the same kernel -> [].
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace

from santhrottle.appliance.datapath.actuator import Datapath
from santhrottle.appliance.datapath.host import Tools
from santhrottle.appliance.datapath.names import DatapathError
from santhrottle.appliance.datapath.spec import DatapathSpec
from santhrottle.appliance.netns import entered

PROBE_DEVICE = "stchk0"
PROBE_PEER = "stchk1"
# An address from TEST-NET-1 (RFC 5737): never a real initiator.
PROBE_MEMBER = "192.0.2.1"
# The kernel modules the data path's objects need (the Ansible role loads them at boot;
# sch_netem only for the netem leaf).
KERNEL_MODULES = (
    "sch_htb",
    "sch_netem",
    "ip_set",
    "ip_set_hash_ip",
    "xt_set",
    "xt_bpf",
    "xt_multiport",
)
# What is built: every kind of object a start builds, a few of each.
PROBE_CLASSES = 2
PROBE_GLIDE_LEAVES = 1


def probe(spec: DatapathSpec, tools: Tools | None = None) -> list[str]:
    """What the kernel refuses of this data path ([] = it builds)."""
    from pyroute2 import IPRoute
    from pyroute2 import netns as pnetns

    ns = f"santhrottle-check-{os.getpid()}"
    try:
        pnetns.create(ns)
    except Exception as e:  # pyroute2 raises OSError and its own errors
        return [f"cannot create a network namespace to probe the kernel: {e}"]
    try:
        with entered(ns), IPRoute() as ipr:
            ipr.link("add", ifname=PROBE_DEVICE, kind="veth", peer=PROBE_PEER)
            for dev in (PROBE_DEVICE, PROBE_PEER):
                ipr.link("set", index=ipr.link_lookup(ifname=dev)[0], state="up")
        # the kernel's features, not the tree's size: two classes and one glide leaf
        small = replace(
            spec,
            devices=(PROBE_DEVICE,),
            max_delay_us=spec.delay_us(min(spec.max_class, PROBE_CLASSES)),
            glide_leaves=min(spec.glide_leaves, PROBE_GLIDE_LEAVES),
        )
        with Datapath(small, netns=ns, tools=tools) as d:
            d.apply()
            d.set_classes({PROBE_MEMBER: 1}, ordered=False)
            d.set_classes({PROBE_MEMBER: 0}, ordered=False)
            d.cleanup()
    except DatapathError as e:
        return [f"the kernel refused the data path: {e}"]
    except Exception as e:  # netlink errors from pyroute2 (veth, ...)
        return [f"the kernel refused the probe's veth pair: {e}"]
    finally:
        with contextlib.suppress(Exception):
            pnetns.remove(ns)
    return []
