"""The kernel's per-initiator delay counters, read for the metrics at scrape time.

What it owns
    MemberCounterReader: a read-only view of the member sets' counters
    (`hash:ip ... counters`: the packets and bytes each member's entry
    matched, i.e. the packets that went to its delay class).  It is called
    from prometheus_client's HTTP threads, never from the tick: the tick
    thread owns the data path's netlink sockets (pyroute2's sockets are not
    thread-safe), so each call opens its own Host(netns), reads with
    MemberSets.read() and closes it again; a lock makes concurrent scrapes
    take turns.  In bridge mode it reads NftSets instead (the counters of
    santhrottle-counted, datapath/nftrules.py).  It never writes to the kernel.  The collector
    (daemon/status/metrics.py) takes any callable of this shape, so unit tests pass
    a fake; daemon/main.py wires this one.

    pyroute2 keeps its namespace stack process-wide: the socket is opened
    inside the namespace through appliance/netns.py's entered(), which lets
    one thread in at a time (the tick's and the convergence worker's sockets
    are opened the same way).

    The counters restart from 0 when an initiator leaves its set and joins
    again, and for every member of a set rebuilt by a bulk swap (a large
    batch of class changes, datapath/sets.py); Prometheus' rate() and
    increase() take such a drop as a counter reset.

Worked example
    MemberCounterReader("tgt")() with 10.0.0.3 delayed in santhrottle-all
    at class 20 returns {"10.0.0.3": ("all", 0x20, 1834, 2650112)}: 1834
    packets, 2650112 bytes delayed since it joined the set.
"""

from __future__ import annotations

import threading

from santhrottle.appliance.datapath.host import Host, Tools
from santhrottle.appliance.datapath.nftgate import NftSets
from santhrottle.appliance.datapath.sets import MemberSets, Readback


class MemberCounterReader:
    """ip -> (mode, HTB minor, packets, bytes) of every member, read-only, per call."""

    def __init__(
        self, netns: str | None = None, tools: Tools | None = None, bridged: bool = False
    ) -> None:
        self.netns = netns
        self.tools = tools
        self.bridged = bridged  # bridge mode: the counters of nftables' bridge table
        self._lock = threading.Lock()

    def __call__(self) -> Readback:
        with self._lock:
            host = Host(self.netns, self.tools)
            try:
                return (NftSets(host) if self.bridged else MemberSets(host)).read()
            finally:
                host.close()
