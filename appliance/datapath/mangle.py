"""The mangle rules in the kernel: read them, reconcile them, remove them.

What it owns
    Mangle: the kernel side of datapath/rules.py.  It reads `iptables -t
    mangle -S`, reconciles the chain and the jumps with one
    `iptables-restore --noflush` (one transaction; the nf_tables and the
    legacy backend alike; never touches a rule that is not ours), and on
    cleanup removes the jumps and the chain, and the empty `table ip
    mangle` iptables-nft leaves behind.  Mangle(host, 6) does the same with
    ip6tables.  Mangles: both families as one, the target host's gate; a
    host whose ip6tables cannot list its mangle table (IPv6 disabled, no
    ip6tables) runs IPv4 only, and v6_problem says why.

What it left, read back in-process
    With the nf_tables backend (Debian 12's iptables is iptables-nft) the
    chain and the jumps live in nftables' `table ip mangle` and `table ip6
    mangle`.  After each reconcile and set_jumps, Mangles keeps `left()`: a
    fingerprint per family read through libnftables (datapath/nftlib.py,
    0.1-0.2 ms a family, no process) -- every rule of SANTHROTTLE and every
    POSTROUTING rule that jumps into it, with its handle and expressions,
    counters left out (nft_fingerprint()) -- and nftables' generation at
    that read (datapath/presence.py).  While the generation has not moved,
    nothing in nftables changed; when it has, the drift check compares the
    kernel's fingerprints with `left` (datapath/drift.py).  A rule deleted,
    added, flushed or put back by iptables-restore (a new handle) changes
    them.  libnftables prints an xtables match or target (set, bpf,
    multiport, SET) by its name only, so a rule replaced in place (`iptables
    -R` keeps the handle) by one with the same matches and targets but other
    arguments does not: for that case the full comparison runs `iptables -S`
    and `ip6tables -S` once per generation that moved while the fingerprints
    stayed.  With the legacy backend (x_tables: nothing in nftables), other
    iptables programs than the default ones, or without libnftables, `left()`
    is (None, None) and the full comparison runs the programs every time.

Worked example
    Mangle(host).reconcile(["eth1"], (3260, 4420), active=False) on a clean
    host installs the chain (True); again: nothing (False); set_jumps(["eth1"],
    True) adds eth1's jump in one iptables-restore, set_jumps(["eth1"], False)
    takes it out again, with the empty hook iptables-nft leaves behind.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from santhrottle.appliance.datapath import nftlib
from santhrottle.appliance.datapath.host import Host, Tools
from santhrottle.appliance.datapath.names import CHAIN, DatapathError
from santhrottle.appliance.datapath.presence import Presence
from santhrottle.appliance.datapath.rules import (
    parse_backend,
    parse_jump_device,
    parse_mangle_rules,
    parse_rule_ports,
    render_jumps,
    render_rules_cleanup,
    render_rules_restore,
)

NFT_FAMILY = {4: "ip", 6: "ip6"}
NO_TABLE = "no table mangle"  # the fingerprint of a family without iptables-nft's table


def nft_fingerprint(host: Host, family: int) -> str | None:
    """The chain SANTHROTTLE and the POSTROUTING rules jumping into it as nftables
    holds them (module header): JSON text, NO_TABLE without `table ip mangle`;
    None where this process cannot load libnftables."""
    lib = nftlib.load(host.netns_path())
    if lib is None:
        return None
    try:
        text = lib.run(f"list table {NFT_FAMILY[family]} mangle", json_out=True, what="nft list")
    except DatapathError as e:  # nft: "No such file or directory; did you mean ..."
        if "No such file or directory" in str(e):
            return NO_TABLE
        raise
    got = json.loads(text)
    out: list[object] = []
    for x in got["nftables"]:
        if x.get("chain", {}).get("name") == CHAIN:
            out.append(["chain", x["chain"]["handle"]])
        rule = x.get("rule")
        if rule is None:
            continue
        expr = [e for e in rule.get("expr", []) if "counter" not in e]
        ours = rule.get("chain") == CHAIN or {"jump": {"target": CHAIN}} in expr
        if ours:
            out.append([rule.get("chain"), rule.get("handle"), expr])
    return json.dumps(out, sort_keys=True)


@dataclass(frozen=True)
class MangleCleanup:
    jumps: int = 0
    chain: bool = False
    nft_table: bool = False


class Mangle:
    def __init__(self, host: Host, family: int = 4) -> None:
        self.host = host
        self.family = family
        t = host.tools
        self.tool, self.restore_tool = (
            (t.iptables, t.iptables_restore) if family == 4 else (t.ip6tables, t.ip6tables_restore)
        )
        self.what = "iptables" if family == 4 else "ip6tables"
        self._backend: str | None = None

    def backend(self) -> str:
        """The iptables backend in use: nf_tables, legacy (or unknown); asked once."""
        if self._backend is None:
            try:
                out = self.host.run([self.tool, "-V"], what=f"{self.what} -V")
            except DatapathError:
                return "unknown"
            self._backend = parse_backend(out)
        return self._backend

    def read(self) -> tuple[list[str], list[str] | None]:
        """(POSTROUTING jumps to our chain, our chain's rules or None)."""
        out = self.host.run([self.tool, "-w", "5", "-t", "mangle", "-S"], what=f"{self.what} -S")
        return parse_mangle_rules(out)

    def reconcile(self, devices: Sequence[str], ports: Sequence[int], active: bool) -> bool:
        """The chain with these ports; a jump on each device iff active (apply).
        True: changed."""
        jumps, chain = self.read()
        text = render_rules_restore(devices, ports, active, jumps, chain, self.family)
        if text is not None:
            self._restore(text)
        if not active:
            self._tidy()
        return text is not None

    def pending(self, devices: Sequence[str], ports: Sequence[int], active: bool) -> bool:
        """reconcile() would change something (read only: the drift check)."""
        jumps, chain = self.read()
        return render_rules_restore(devices, ports, active, jumps, chain, self.family) is not None

    def set_jumps(self, devices: Sequence[str], active: bool) -> bool:
        """Jumps on each device (the first member went in), or none at all (the
        last left); the chain is not touched.  True: changed."""
        jumps, _chain = self.read()
        text = render_jumps(devices, active, jumps)
        if text is not None:
            self._restore(text)
            if not active:
                self._tidy()
        return text is not None

    def _tidy(self) -> None:
        """Idle, no packet passes a rule or a hook of ours: the empty hook
        iptables-nft leaves behind goes too."""
        if self.backend() == "nf_tables":
            self._drop_empty_nft(table=False)

    def cleanup(self) -> MangleCleanup:
        jumps, chain = self.read()
        text = render_rules_cleanup(jumps, chain is not None)
        if text is None:
            return MangleCleanup()
        self._restore(text)
        nft = self.backend() == "nf_tables" and self._drop_empty_nft(table=True)
        return MangleCleanup(len(jumps), chain is not None, nft)

    @staticmethod
    def ports_of(rules: Sequence[str]) -> tuple[int, ...] | None:
        return parse_rule_ports(rules)

    @staticmethod
    def device_of(jump: str) -> str | None:
        return parse_jump_device(jump)

    def _restore(self, text: str) -> None:
        self.host.run(
            [self.restore_tool, "-w", "5", "--noflush"], text, what=f"{self.what}-restore"
        )

    def _drop_empty_nft(self, table: bool) -> bool:
        """iptables-nft creates `table ip mangle` with a POSTROUTING base chain
        when a jump goes in and never deletes either.  Delete that chain when
        it has no rule and accepts (every packet would still pass its hook),
        and with `table` the table when nothing at all is left in it: no
        rules, no sets, no chain other than empty accepting base chains.
        True: the table was deleted."""
        try:
            from pyroute2.nftables.main import NFTables

            with self.host.inside():
                nft = NFTables(nfgen_family=socket.AF_INET6 if self.family == 6 else socket.AF_INET)
        except Exception:
            return False
        try:
            if "mangle" not in [t.get_attr("NFTA_TABLE_NAME") for t in nft.get_tables()]:
                return False
            ruled = {
                r.get_attr("NFTA_RULE_CHAIN")
                for r in nft.get_rules()
                if r.get_attr("NFTA_RULE_TABLE") == "mangle"
            }
            chains = [c for c in nft.get_chains() if c.get_attr("NFTA_CHAIN_TABLE") == "mangle"]

            def empty_hook(c: Any) -> bool:
                hooked = c.get_attr("NFTA_CHAIN_HOOK") is not None
                accepts = c.get_attr("NFTA_CHAIN_POLICY") in (None, 1)  # NF_ACCEPT = 1
                return hooked and accepts and c.get_attr("NFTA_CHAIN_NAME") not in ruled

            for c in chains:
                if c.get_attr("NFTA_CHAIN_NAME") == "POSTROUTING" and empty_hook(c):
                    nft.chain("del", table="mangle", name="POSTROUTING")
            if not table or ruled or not all(empty_hook(c) for c in chains):
                return False
            if any(s.get_attr("NFTA_SET_TABLE") == "mangle" for s in nft.get_sets()):
                return False
            nft.table("del", name="mangle")
            return True
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                nft.close()


class Mangles:
    """The mangle rules of both families as one: Mangle's interface (module header)."""

    def __init__(self, host: Host) -> None:
        self.v4 = Mangle(host, 4)
        self.v6 = Mangle(host, 6)
        self._v6_problem: str | None = None
        self._v6_probed = False
        self._left: tuple[tuple[int, str], ...] | None = None  # (family, fingerprint)
        self._left_gen: int | None = None  # nftables' generation they were read at

    @property
    def v6_problem(self) -> str | None:
        """Why IPv6 initiators cannot be delayed on this host (None: they can)."""
        if not self._v6_probed:
            try:
                self.v6.read()
                self._v6_problem = None
            except DatapathError as e:
                self._v6_problem = f"ip6tables cannot list its mangle table: {e}"
            self._v6_probed = True
        return self._v6_problem

    def families(self) -> list[Mangle]:
        return [self.v4] if self.v6_problem else [self.v4, self.v6]

    def left(self) -> tuple[tuple[tuple[int, str], ...] | None, int | None]:
        """((family, fingerprint) of each family as last written, or None where they
        cannot be read in-process; nftables' generation they were read at)."""
        return self._left, self._left_gen

    def _keep_left(self) -> None:
        """What was just written (or found as wanted), for the drift check (module
        header): the fingerprints, read between two readings of nftables' generation
        (kept only when it did not move)."""
        self._left = self._left_gen = None
        own = (self.v4.tool, self.v6.tool) == (Tools.iptables, Tools.ip6tables)
        if not own or self.backend() != "nf_tables":
            return
        watch = Presence(self.v4.host)
        try:
            gen = watch.nft_generation()
            got = [(m.family, nft_fingerprint(m.host, m.family)) for m in self.families()]
            again = watch.nft_generation()
        except DatapathError:
            return
        finally:
            watch.close()
        if all(fp is not None for _f, fp in got):
            self._left = tuple((f, fp) for f, fp in got if fp is not None)
            self._left_gen = gen if gen == again else None

    def backend(self) -> str:
        return self.v4.backend()

    def read(self) -> tuple[list[str], list[str] | None]:
        """IPv4's (POSTROUTING jumps to our chain, our chain's rules or None)."""
        return self.v4.read()

    def read6(self) -> tuple[list[str], list[str] | None] | None:
        """IPv6's, None when this host has no ip6tables mangle table."""
        return None if self.v6_problem else self.v6.read()

    def reconcile(self, devices: Sequence[str], ports: Sequence[int], active: bool) -> bool:
        self._left = self._left_gen = None
        changed = [m.reconcile(devices, ports, active) for m in self.families()]
        self._keep_left()
        return any(changed)

    def set_jumps(self, devices: Sequence[str], active: bool) -> bool:
        self._left = self._left_gen = None
        changed = [m.set_jumps(devices, active) for m in self.families()]
        self._keep_left()
        return any(changed)

    def pending(self, devices: Sequence[str], ports: Sequence[int], active: bool) -> bool:
        return any(m.pending(devices, ports, active) for m in self.families())

    def cleanup(self) -> MangleCleanup:
        self._left = self._left_gen = None
        parts = [m.cleanup() for m in self.families()]
        return MangleCleanup(
            sum(p.jumps for p in parts),
            any(p.chain for p in parts),
            any(p.nft_table for p in parts),
        )

    ports_of = staticmethod(Mangle.ports_of)
    device_of = staticmethod(Mangle.device_of)
