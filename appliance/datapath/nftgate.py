"""Bridge mode's gate in the kernel: nftables' bridge family instead of ipset + iptables.

What it owns
    NftSets and NftRules, the kernel side of datapath/nftrules.py: the
    member maps of `table bridge santhrottle`, IPv4 and IPv6 (what
    datapath/sets.py's MemberSets is on a target host), and its chains
    (what datapath/mangle.py's Mangle is).  Datapath takes them when its spec is
    bridged; each call is one `nft -f` transaction (atomic: all or
    nothing) inside the namespace, run by libnftables in this process
    (datapath/nftlib.py), or by the `nft` program where the library cannot be
    loaded or the tools name another nft.  Nothing outside the table is touched.

As left
    NftGeneration keeps nftables' ruleset generation read right after the
    table's last transaction (one NFT_MSG_GETGEN, datapath/presence.py): while
    the namespace's generation is still that one, nothing in nftables changed
    since, and the drift check's presence read (datapath/drift.py) knows the
    table is as left without listing it.  A transaction of another program
    between ours and that read is taken for ours: the full comparison, every
    10 s, still finds what it changed.

Run time
    A member change costs about 0.08 ms of CPU in the process (a map element's
    replace), 4.6 ms as `nsenter nft -f -` (two processes): the controller changes
    classes at most once a tick (100 ms), and a glide's handoffs once more.
    The hook chain, the only thing a bridged packet passes, exists only
    while somebody is delayed (nftrules.py, the layout).

Worked example
    NftSets(host).ensure() on a clean namespace creates the table, the
    mode maps of both families (santhrottle-all ... santhrottle-read6),
    santhrottle-counted, santhrottle-counted6 and the delay chain (on a
    table from before IPv6: the IPv6 maps and set only); send([("add",
    "santhrottle-all", "10.0.0.3", 0x20), ("add", "santhrottle-all6",
    "fd00::3", 0x20)], {}) puts 10.0.0.3 : 5374:20 and fd00::3 : 5374:20 in
    their maps and returns {"10.0.0.3": ("all", 0x20), "fd00::3": ("all",
    0x20)}; NftRules(host).set_jumps(["br-port"], True) adds the hook chain
    with its jump.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress

from santhrottle.appliance.datapath import nftlib
from santhrottle.appliance.datapath.host import Host, Tools
from santhrottle.appliance.datapath.mangle import MangleCleanup
from santhrottle.appliance.datapath.members import KernelMembers, Op, members_after
from santhrottle.appliance.datapath.names import DatapathError, set_name
from santhrottle.appliance.datapath.nftrules import (
    FAMILY,
    QUALIFIED,
    NftState,
    parse_chains,
    parse_json,
    parse_jump_device,
    parse_ports,
    render_chains_cleanup,
    render_destroy,
    render_ensure,
    render_jumps,
    render_ops,
    render_reconcile,
    render_replace,
)
from santhrottle.appliance.datapath.presence import Presence
from santhrottle.appliance.datapath.sets import KnownMembers, Readback

NFT_BACKEND = "nftables bridge"
NFT_TABLE = QUALIFIED


class NftGeneration:
    """nftables' generation right after the table's last transaction, None while
    unknown (module header, "As left"); one netlink socket, kept."""

    def __init__(self, host: Host) -> None:
        self._watch = Presence(host)
        self.last: int | None = None

    def after_write(self, ok: bool) -> None:
        self.last = None
        if ok:
            with suppress(DatapathError):
                self.last = self._watch.nft_generation()


class _Nft:
    def __init__(self, host: Host, generation: NftGeneration | None = None) -> None:
        self.host = host
        self._lib: nftlib.Library | bool | None = False  # False: not loaded yet
        self.generation = generation or NftGeneration(host)

    def _library(self) -> nftlib.Library | None:
        """libnftables in this process (datapath/nftlib.py), or None: the `nft` program.
        A host whose tools name another nft than the default gets that program."""
        if self._lib is False:
            own = self.host.tools.nft == Tools.nft
            self._lib = nftlib.load(self.host.netns_path()) if own else None
        return self._lib or None

    def _list(self, json_out: bool) -> str:
        """`nft [-j] list ruleset bridge`: the bridge family's tables, ours among them or
        not (listing a table that does not exist is an error nft words variously)."""
        lib = self._library()
        if lib is not None:
            return lib.run(f"list ruleset {FAMILY}", json_out=json_out, what="nft list")
        argv = [self.host.tools.nft, *(["-j"] if json_out else []), "list", "ruleset", FAMILY]
        return self.host.run(argv, what="nft list")

    def state(self) -> NftState:
        return parse_json(self._list(json_out=True))

    def apply(self, text: str) -> None:
        if not text:
            return
        lib = self._library()
        ok = False
        try:
            if lib is not None:
                lib.run(text)
            else:
                self.host.run([self.host.tools.nft, "-f", "-"], text, what="nft -f")
            ok = True
        finally:
            self.generation.after_write(ok)


class NftSets(_Nft, KnownMembers):
    """MemberSets' interface on the bridge family's maps (datapath/sets.py)."""

    def __init__(self, host: Host, generation: NftGeneration | None = None) -> None:
        super().__init__(host, generation)
        self._members: KernelMembers | None = None

    def headers(self) -> dict[str, int]:
        """The mode maps that exist, both families (by their set names) -> 0."""
        return dict.fromkeys(sorted(self.state().maps), 0)

    def read(self) -> Readback:
        return self._read_back(dict(self.state().members))

    def ensure(self) -> list[str]:
        text, created = render_ensure(self.state())
        self.apply(text)
        return created

    def sync_gate(self, members: Mapping[str, tuple[str, int]]) -> None:
        """Nothing to do: the maps' lookups are the gate."""

    def gate_now(self) -> set[str]:
        members = self._members or {}
        return {set_name(m, ip) for ip, (m, _) in members.items()}

    def send(self, ops: Sequence[Op], before: Mapping[str, tuple[str, int]]) -> KernelMembers:
        after = members_after(before, ops)
        try:
            self.apply(render_ops(ops, before))
        except DatapathError:
            self._members = None  # unknown now: read back next time
            raise
        self._members = after
        return after

    def replace(self, mode: str, members: Mapping[str, int]) -> None:
        before = {ip: (m, minor) for ip, (m, minor, _, _) in self.read().items()}
        try:
            self.apply(render_replace(mode, members, before))
        finally:
            self._members = None

    def destroy(self) -> list[str]:
        """Delete the table with its maps and counted sets (its chains first: NftRules)."""
        st = self.state()
        self.apply(render_destroy(st))
        self.invalidate()
        return sorted(st.maps) + sorted(st.counted)


class NftRules(_Nft):
    """Mangle's interface on the bridge family's chains (datapath/mangle.py)."""

    # the bridge family's one table matches both families: nothing is missing for IPv6
    v6_problem: str | None = None

    def read6(self) -> tuple[list[str], list[str] | None] | None:
        """No separate IPv6 rules on a bridge (Mangles.read6's None)."""
        return None

    def backend(self) -> str:
        return NFT_BACKEND

    def left(self) -> tuple[None, int | None]:
        """No fingerprint: the drift check reads the bridge's table itself (drift.py);
        nftables' generation after the table's last transaction (module header)."""
        return None, self.generation.last

    def read(self) -> tuple[list[str], list[str] | None]:
        """(the hook chain's jumps, the delay chain's rules or None)."""
        jumps, rules = self._chains()
        return jumps or [], rules

    def _chains(self) -> tuple[list[str] | None, list[str] | None]:
        rules, jumps = parse_chains(self._list(json_out=False))
        return jumps, rules

    def reconcile(self, devices: Sequence[str], ports: Sequence[int], active: bool) -> bool:
        jumps, rules = self._chains()
        text = render_reconcile(ports, rules, jumps, devices, active)
        self.apply(text or "")
        return text is not None

    def pending(self, devices: Sequence[str], ports: Sequence[int], active: bool) -> bool:
        """reconcile() would change something (read only: the drift check)."""
        jumps, rules = self._chains()
        return render_reconcile(ports, rules, jumps, devices, active) is not None

    def set_jumps(self, devices: Sequence[str], active: bool) -> bool:
        jumps, _ = self._chains()
        text = render_jumps(devices, active, jumps)
        self.apply(text)
        return bool(text)

    def cleanup(self) -> MangleCleanup:
        jumps, rules = self._chains()
        self.apply(render_chains_cleanup(rules, jumps))
        return MangleCleanup(len(jumps or []), rules is not None, False)

    @staticmethod
    def ports_of(rules: Sequence[str]) -> tuple[int, ...] | None:
        return parse_ports(rules)

    @staticmethod
    def device_of(jump: str) -> str | None:
        return parse_jump_device(jump)
