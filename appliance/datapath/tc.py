"""One egress device's tc tree in the kernel: build or adopt it, read it, change a glide leaf.

What it owns
    TcDevice, the kernel side of datapath/tctree.py for one device: it
    reads the device's qdiscs and classes (pyroute2), sends the
    reconciliation as one `tc -batch`, changes a glide leaf's netem delay
    in place (one RTM_NEWQDISC, what `tc qdisc change` sends: the queue
    stays), reads glide leaves' queues (one RTM_GETTCLASS each, in one
    batch: a dump of every class costs 25 ms for 500 classes on the host,
    far more in the lab) and the classes' counters, and removes the tree.

    apply() refuses a root qdisc santhrottle did not create (ForeignQdisc)
    and leaves nothing half-built: a fresh build that fails is removed.

Worked example
    TcDevice(host, "eth1").apply(desired_tree(500, 100, 25e9, "netem", 8))
    on a device with the kernel's default root: one tc -batch of 217 lines;
    again: nothing sent ("adopted").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from santhrottle.appliance.datapath.host import NETEM_MISSING_MSG, Host
from santhrottle.appliance.datapath.names import (
    ROOT_MAJOR,
    ROOT_PARENT,
    DatapathError,
    ForeignQdisc,
    NetemMissing,
    is_glide_minor,
    minor_class,
    minor_classid,
)
from santhrottle.appliance.datapath.tctree import (
    PSCHED_TICK_NS,
    Leaf,
    TcTree,
    basic_stats,
    observe_tree,
    queued,
    render_tc_plan,
)

Record = dict[str, Any]


def tc_record(msg: Any) -> Record:
    return {
        "handle": msg["handle"],
        "parent": msg["parent"],
        "kind": msg.get_attr("TCA_KIND"),
        "options": msg.get_attr("TCA_OPTIONS"),
        "stats": msg.get_attr("TCA_STATS2"),
    }


def installed_devices(host: Host) -> list[str]:
    """Devices in the namespace whose root qdisc is ours."""
    ipr = host.iproute()
    out = []
    for q in ipr.get_qdiscs():
        root = q["parent"] == ROOT_PARENT and q["handle"] >> 16 == ROOT_MAJOR
        if root and q.get_attr("TCA_KIND") == "htb":
            links = ipr.get_links(q["index"])
            if links:
                out.append(links[0].get_attr("IFLA_IFNAME"))
    return sorted(out)


def is_bridge_port(host: Host, device: str) -> bool:
    """The device is a port of a Linux bridge (bridge mode: the gate is nftables')."""
    ipr = host.iproute()
    (link,) = ipr.get_links(host.ifindex(device))
    master = link.get_attr("IFLA_MASTER")
    if master is None:
        return False
    info = ipr.get_links(master)[0].get_attr("IFLA_LINKINFO")
    return info is not None and info.get_attr("IFLA_INFO_KIND") == "bridge"


class TcDevice:
    def __init__(self, host: Host, device: str) -> None:
        self.host = host
        self.device = device

    def records(self) -> tuple[list[Record], list[Record]]:
        ipr = self.host.iproute()
        idx = self.host.ifindex(self.device)
        with self._forget_on_failure():
            return (
                [tc_record(m) for m in ipr.get_qdiscs(index=idx)],
                [tc_record(m) for m in ipr.get_classes(index=idx)],
            )

    @contextlib.contextmanager
    def _forget_on_failure(self) -> Iterator[None]:
        """A message that failed may have named a device since recreated: the next
        one looks its index up again (Host.ifindex keeps it)."""
        try:
            yield
        except Exception:
            self.host.forget(self.device)
            raise

    def observe(self) -> TcTree:
        return observe_tree(*self.records())

    def apply(self, want: TcTree) -> tuple[int, bool]:
        """Reconcile the device's tree with `want`: (tc lines sent, fresh build)."""
        dev = self.device
        self.host.forget(dev)  # a build or a repair: the device may be a new one
        have = self.observe()
        if not have.ours and not have.kernel_default:
            raise ForeignQdisc(
                f"{dev} already has a root qdisc {have.root_kind} {have.root_major:x}: that "
                f"santhrottle did not create; remove it (tc qdisc del dev {dev} root) or "
                "choose another device"
            )
        lines = render_tc_plan(dev, want, have)
        netem = any(" netem " in ln for ln in lines)
        if netem:
            self.host.check_netem()
        if lines:
            try:
                self.host.run(
                    [self.host.tools.tc, "-batch", "-"], "\n".join(lines) + "\n", what="tc -batch"
                )
            except DatapathError as e:
                if not have.ours:  # do not leave half a tree behind
                    with contextlib.suppress(DatapathError):
                        self.remove()
                if "kind is unknown" in str(e) and netem:
                    raise NetemMissing(NETEM_MISSING_MSG) from None
                raise
        return len(lines), not have.ours

    def remove(self) -> None:
        self.host.run(
            [self.host.tools.tc, "qdisc", "del", "dev", self.device, "root"], what="tc qdisc del"
        )

    def set_leaf_delay(self, want: Leaf, delay_us: int) -> None:
        """A glide leaf's new delay, in place (one RTM_NEWQDISC: the queue stays)."""
        from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
        from pyroute2.netlink.rtnl import RTM_NEWQDISC
        from pyroute2.netlink.rtnl.tcmsg import tcmsg

        minor = want.handle_major
        msg = tcmsg()
        msg["index"] = self.host.ifindex(self.device)
        msg["handle"] = minor << 16
        msg["parent"] = (ROOT_MAJOR << 16) | minor
        msg["attrs"] = [
            ["TCA_KIND", "netem"],
            [
                "TCA_OPTIONS",
                {
                    "delay": round(delay_us * 1000 / PSCHED_TICK_NS),
                    "limit": want.limit,
                    "loss": 0,
                    "gap": 0,
                    "duplicate": 0,
                    "jitter": 0,
                    "attrs": [
                        [
                            "TCA_NETEM_RATE",
                            {
                                "rate": want.rate_bytes_s,
                                "packet_overhead": 0,
                                "cell_size": 0,
                                "cell_overhead": 0,
                            },
                        ]
                    ],
                },
            ],
        ]
        msg["header"]["type"] = RTM_NEWQDISC
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
        try:
            # the batch call: pyroute2 0.9's sync nlm_request looks for a
            # status key only its async core has
            with self._forget_on_failure():
                self.host.iproute().nlm_request_batch([msg])
        except Exception as e:
            raise DatapathError(
                f"cannot change the delay of glide leaf {minor_classid(minor)} on "
                f"{self.device}: {e}"
            ) from None

    def leaf_readings(self, minors: Sequence[int]) -> dict[int, tuple[int, int]]:
        """(packets queued now, packets sent) of these glide leaves."""
        from pyroute2.netlink import NLM_F_ACK, NLM_F_ECHO, NLM_F_REQUEST
        from pyroute2.netlink.rtnl import RTM_GETTCLASS
        from pyroute2.netlink.rtnl.tcmsg import tcmsg

        idx = self.host.ifindex(self.device)
        msgs = []
        for minor in minors:
            msg = tcmsg()
            msg["index"] = idx
            msg["handle"] = (ROOT_MAJOR << 16) | minor
            msg["header"]["type"] = RTM_GETTCLASS
            # the class comes back only to a request that asks for its echo
            msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_ECHO
            msgs.append(msg)
        try:
            with self._forget_on_failure():
                replies = self.host.iproute().nlm_request_batch(msgs)
        except Exception as e:
            raise DatapathError(f"cannot read the glide leaves' queues: {e}") from None
        out: dict[int, tuple[int, int]] = {}
        for m in replies:
            if m.get("event") == "RTM_NEWTCLASS":
                rec = tc_record(m)
                out[m["handle"] & 0xFFFF] = (queued(rec), basic_stats(rec)[0])
        return out

    def class_counters(self) -> dict[int, tuple[int, int]]:
        """Per delay class (0 = unthrottled): (packets, bytes) sent.

        HTB counts its direct queue only as packets (direct_packets_stat),
        so class 0 is the root's count minus its classes' and glide leaves'
        (HTB updates both at dequeue)."""
        qd, cl = self.records()
        root = next(
            (q for q in qd if q["parent"] == ROOT_PARENT and q["handle"] >> 16 == ROOT_MAJOR), None
        )
        out: dict[int, tuple[int, int]] = {}
        gp = gb = 0  # glide leaves: neither a class nor the direct queue
        for c in cl:
            h = c["handle"]
            if h >> 16 != ROOT_MAJOR:
                continue
            k = minor_class(h & 0xFFFF)
            if k is not None:
                out[k] = basic_stats(c)
            elif is_glide_minor(h & 0xFFFF):
                p, b = basic_stats(c)
                gp, gb = gp + p, gb + b
        if root is not None:
            rp, rb = basic_stats(root)
            out[0] = (
                rp - gp - sum(p for p, _ in out.values()),
                rb - gb - sum(b for _, b in out.values()),
            )
        return out

    def glide_records(self) -> tuple[TcTree, list[Record]]:
        """The tree and the glide leaves' class records (delay, counters, queue)."""
        qd, cl = self.records()
        glides = [
            c
            for c in cl
            if c["handle"] >> 16 == ROOT_MAJOR and is_glide_minor(c["handle"] & 0xFFFF)
        ]
        return observe_tree(qd, cl), glides
