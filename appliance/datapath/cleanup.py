"""Removing what santhrottle put in the kernel: every part, whatever became of the others.

Problem
    A stop, `santhrottle cleanup` and a start that failed remove the data path:
    the mangle rules (both families), the member sets, bridge mode's nftables
    table and the tc tree on each device.  A part can fail for a moment: a set is
    busy while another program dumps it (ipset list, a monitoring agent, the
    daemon's drift check finishing), and a set cannot go while a rule still names
    it.  One such failure must not leave the rest behind, and a set that stays
    must delay nobody.

The law
    The parts go in order (rules, sets, bridge table, tc trees: a set after the
    rules that name it), each tried whatever became of the ones before.  A part
    that failed is tried again after CLEANUP_PAUSE_S, up to CLEANUP_ATTEMPTS
    times in all; a set that still cannot go is emptied.  Then DatapathError
    names each part left and why; else the report of what went.

Worked example
    An admin's `iptables -A OUTPUT -m set --match-set santhrottle-all dst -j ACCEPT`
    keeps santhrottle-all: after three attempts (1 s of pauses) the chain, the
    jumps, the other sets and the tree are gone, santhrottle-all is empty, and
    the error reads "cleanup left the sets after 3 attempts: cannot destroy ipset
    santhrottle-all: ...".  Once that rule is gone, a cleanup removes the set.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from santhrottle.appliance.datapath.host import Host
from santhrottle.appliance.datapath.mangle import Mangles
from santhrottle.appliance.datapath.names import CHAIN, ROOT_MAJOR, DatapathError
from santhrottle.appliance.datapath.nftgate import NFT_TABLE, NftRules, NftSets
from santhrottle.appliance.datapath.sets import MemberSets
from santhrottle.appliance.datapath.tc import TcDevice, installed_devices

CLEANUP_ATTEMPTS = 3
CLEANUP_PAUSE_S = 0.5


@dataclass(slots=True)
class CleanupReport:
    qdiscs: list[str] = field(default_factory=list)  # devices whose root we deleted
    sets: list[str] = field(default_factory=list)
    rules: int = 0  # jump rules removed
    chain: bool = False
    nft_table: bool = False
    bridge_table: bool = False  # bridge mode's table bridge santhrottle
    bridge_jumps: int = 0

    def summary(self) -> str:
        if not (
            self.qdiscs
            or self.sets
            or self.rules
            or self.chain
            or self.nft_table
            or self.bridge_table
        ):
            return "nothing of santhrottle's was installed"
        parts = []
        if self.qdiscs:
            parts.append(f"root qdisc {ROOT_MAJOR:x}: on {', '.join(self.qdiscs)}")
        if self.sets:
            parts.append(f"sets {', '.join(self.sets)}")
        if self.chain or self.rules:
            parts.append(f"chain {CHAIN} and {self.rules} jump rule(s)")
        if self.nft_table:
            parts.append("the empty nft table ip mangle iptables-nft had created")
        if self.bridge_table:
            parts.append(f"table {NFT_TABLE} with {self.bridge_jumps} jump rule(s)")
        return "removed " + "; ".join(parts)


def remove_everything(host: Host, bridged: bool, sleep: Callable[[float], None]) -> CleanupReport:
    """Every part of santhrottle's in host's kernel, whichever mode (`bridged`) the
    caller runs in: a mode changed since the last run left the other's (module
    header).  DatapathError naming what is left."""
    rep = CleanupReport()
    t = host.tools
    # a tool that is not installed has nothing of ours to remove
    gated = not bridged or bool(shutil.which(t.iptables) and shutil.which(t.ipset))
    nft = bridged or bool(shutil.which(t.nft))
    parts = [("rules", _rules, gated), ("sets", _sets, gated), ("bridge table", _bridge, nft),
             ("tc trees", _tc, True)]  # fmt: skip
    todo = [(name, part) for name, part, wanted in parts if wanted]
    failed: dict[str, str] = {}
    for attempt in range(CLEANUP_ATTEMPTS):
        if attempt:
            sleep(CLEANUP_PAUSE_S)
        failed = {}
        for name, part in todo:
            try:
                part(host, rep)
            except Exception as e:  # DatapathError, a pyroute2 NetlinkError, ...
                failed[name] = str(e) or type(e).__name__
        todo = [(name, part) for name, part in todo if name in failed]
        if not todo:
            return rep
    raise DatapathError(
        f"cleanup left the {', '.join(failed)} after {CLEANUP_ATTEMPTS} attempts: "
        + "; ".join(failed.values())
    )


def _rules(host: Host, rep: CleanupReport) -> None:
    m = Mangles(host).cleanup()
    rep.rules += m.jumps
    rep.chain = rep.chain or m.chain
    rep.nft_table = rep.nft_table or m.nft_table


def _sets(host: Host, rep: CleanupReport) -> None:
    MemberSets(host).destroy(rep.sets)  # each name as it goes: a retry adds the rest


def _bridge(host: Host, rep: CleanupReport) -> None:
    n = NftRules(host).cleanup()
    rep.bridge_jumps += n.jumps
    rep.bridge_table = bool(NftSets(host).destroy()) or n.chain or rep.bridge_table


def _tc(host: Host, rep: CleanupReport) -> None:
    for dev in installed_devices(host):
        TcDevice(host, dev).remove()
        rep.qdiscs.append(dev)
