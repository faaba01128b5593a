"""The member sets in the kernel: who is delayed by how much, and the gate in front of them.

What it owns
    MemberSets: the three mode sets per family (santhrottle-all, -ack,
    -read: `hash:ip family inet counters skbinfo`, and santhrottle-all6,
    -ack6, -read6: `family inet6`; a member is `IP skbprio 5374:K`), the
    gate (santhrottle-members, a list:set, holding sets of both families),
    and the membership as last read back or written (ip -> (mode, HTB minor)),
    shared by every egress device.  Ops (datapath/members.py) go as single
    netlink messages for small batches, as one `ipset restore` for large
    ones: into the live sets, or into temporary sets swapped in atomically.

The gate
    The jump into our chain matches santhrottle-members, so only packets to
    a member walk the chain.  The list:set holds a mode set only while it
    has members: listed before its first member goes in (its packets are
    delayed from the first), unlisted after its last has left (a member's
    packets must not leave its class for HTB's direct queue while older
    ones still wait there), because every listed set costs a lookup per
    storage packet.  A set gains members only by adds and loses them only
    by dels, so the gate follows from the ops without a pass over every
    member on the tick path.

Worked example
    send([("add", "santhrottle-all", "10.0.0.3", 0x20)]) on an idle data
    path: santhrottle-all goes into the gate, then 10.0.0.3 into the set
    with skbprio 5374:20 (one netlink message each); membership() is then
    {"10.0.0.3": ("all", 0x20)}.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable, Mapping, Sequence

from santhrottle.appliance.datapath.host import Host
from santhrottle.appliance.datapath.members import (
    BULK_THRESHOLD,
    MAXELEM,
    KernelMembers,
    Op,
    bulk_plan,
    members_after,
    modes_in,
    parse_ipset_save,
    render_ipset_changes,
    render_ipset_swap,
)
from santhrottle.appliance.datapath.names import (
    ALL_SET_NAMES,
    FAMILY_SETS,
    MEMBERS_SET,
    OWNED_SETS,
    ROOT_MAJOR,
    SET_FAMILY,
    TMP_SUFFIX,
    DatapathError,
    ObjectError,
    family,
)

# ipset netlink: list headers only (`ipset list -t`); create flags.
IPSET_FLAG_LIST_HEADER = 1 << 2
IPSET_FLAG_WITH_COUNTERS = 1 << 3
IPSET_FLAG_WITH_SKBINFO = 1 << 6

# ip -> (mode, HTB minor, packets, bytes) as read from the kernel
Readback = dict[str, tuple[str, int, int, int]]
# ipset's own error codes (linux/netfilter/ipset/ip_set_hash.h) that pyroute2 prints
# as "Unknown error NNNN": said in words.
IPSET_ERRORS = {
    4352: "the set is full (its maxelem)",
    4353: "a hash set takes no null element (0.0.0.0, ::)",
}


def ipset_error(e: Exception) -> str:
    """A netlink error of ipset in words where the code is ipset's own."""
    from pyroute2.ipset import IPSetError

    code = e.code if isinstance(e, IPSetError) else None
    why = IPSET_ERRORS.get(code) if isinstance(code, int) else None
    return f"{why} (ipset error {code})" if why else str(e)


class KnownMembers:
    """The membership as last read back or written (MemberSets', and NftSets' on a bridge)."""

    _members: KernelMembers | None = None

    def _read_back(self, raw: Readback) -> Readback:
        """raw, as read from the kernel, becomes the membership known."""
        self._members = {ip: (mode, minor) for ip, (mode, minor, _, _) in raw.items()}
        return raw

    def cached(self) -> KernelMembers | None:
        """The membership as last read or written; None: unknown (read it)."""
        return self._members

    def invalidate(self) -> None:
        self._members = None


class MemberSets(KnownMembers):
    def __init__(
        self, host: Host, maxelem: int = MAXELEM, bulk_threshold: int = BULK_THRESHOLD
    ) -> None:
        self.host = host
        self.maxelem = maxelem
        self.bulk_threshold = bulk_threshold
        self._members: KernelMembers | None = None
        self._gated: set[str] | None = None  # the mode sets the gate list:set holds now

    # ----------------------------------------------------------- reading
    def headers(self) -> dict[str, int]:
        """Our sets that exist -> their CADT flags (one header-only dump)."""
        out: dict[str, int] = {}
        ips = self.host.ipsets()
        try:
            msgs = list(ips.list(flags=IPSET_FLAG_LIST_HEADER))
        except Exception as e:
            raise DatapathError(f"cannot list ipsets: {e}") from None
        for m in msgs:
            name = m.get_attr("IPSET_ATTR_SETNAME")
            if name not in OWNED_SETS:
                continue
            data = m.get_attr("IPSET_ATTR_DATA")
            flags = data.get_attr("IPSET_ATTR_CADT_FLAGS") if data is not None else 0
            out[name] = int(flags or 0)
        return out

    def counts(self) -> dict[str, int]:
        """Our sets that exist -> their number of members (one header-only dump: the
        drift check compares them with the membership it left)."""
        out: dict[str, int] = {}
        try:
            msgs = list(self.host.ipsets().list(flags=IPSET_FLAG_LIST_HEADER))
        except Exception as e:
            raise DatapathError(f"cannot list ipsets: {e}") from None
        for m in msgs:
            name = m.get_attr("IPSET_ATTR_SETNAME")
            data = m.get_attr("IPSET_ATTR_DATA")
            if name in OWNED_SETS and data is not None:
                out[name] = int(data.get_attr("IPSET_ATTR_ELEMENTS") or 0)
        return out

    def gate_listed(self) -> set[str]:
        """The mode sets the gate lists now, read from the kernel (no cache)."""
        return self._list_set_members(MEMBERS_SET) & set(ALL_SET_NAMES)

    def read(self) -> Readback:
        """Every member with its mode, minor and counters; the cache follows.
        Read with `ipset save` (one process per mode set that exists): for
        10,000 members that is ~70 ms, where pyroute2's decoder takes ~1 s of
        CPU."""
        raw: Readback = {}
        existing = self.headers()
        for name in ALL_SET_NAMES:
            if name in existing:
                out = self.host.run([self.host.tools.ipset, "save", name], what="ipset save")
                raw.update(parse_ipset_save(out))
        return self._read_back(raw)

    def invalidate(self) -> None:
        super().invalidate()
        self._gated = None

    # ------------------------------------------------------------ ensure
    def ensure(self) -> list[str]:
        """Create the sets and the gate that are missing; returns what was created."""
        from pyroute2.ipset import IPSetError

        want_flags = IPSET_FLAG_WITH_COUNTERS | IPSET_FLAG_WITH_SKBINFO
        existing = self.headers()
        created = []
        for name in ALL_SET_NAMES:
            if name in existing:
                if existing[name] & want_flags != want_flags:
                    raise DatapathError(
                        f"ipset {name} exists without counters/skbinfo; "
                        "run `santhrottle cleanup` first"
                    )
                continue
            try:
                self.host.ipsets().create(
                    name,
                    stype="hash:ip",
                    family=socket.AF_INET6 if SET_FAMILY[name] == 6 else socket.AF_INET,
                    exclusive=False,
                    counters=True,
                    skbinfo=True,
                    maxelem=self.maxelem,
                )
            except IPSetError as e:
                raise DatapathError(f"cannot create ipset {name}: {e}") from None
            created.append(name)
        # The list:set through the system's ipset: pyroute2 would create it
        # at the kernel's newest revision (list:set 3 on 6.18), which an older
        # ipset (7.17) then cannot list at all.
        if MEMBERS_SET not in existing:
            self.host.run(
                [self.host.tools.ipset, "-exist", "restore"],
                f"create {MEMBERS_SET} list:set\n",
                what="ipset restore",
            )
            created.append(MEMBERS_SET)
        return created

    def sync_gate(self, members: Mapping[str, tuple[str, int]]) -> None:
        """The gate lists the mode sets that have members and no other (an
        older version listed all three of IPv4)."""
        self._gated = None
        want = modes_in(members)
        self._gate("add", want)
        self._gate("del", self._gate_now() - want)

    # ------------------------------------------------------------ writing
    def send(self, ops: Sequence[Op], before: Mapping[str, tuple[str, int]]) -> KernelMembers:
        """Send ops (single netlink ops, restore or swap, whichever is cheaper)
        against the membership `before`; returns the membership after them."""
        after = members_after(before, ops)
        self._gate("add", {op[1] for op in ops if op[0] == "add"})
        if len(ops) <= self.bulk_threshold:
            self._apply_netlink(ops)
        else:
            swap = bulk_plan(after, ops)
            if swap is not None:
                self._apply_swap(swap)
            else:
                self._apply_restore(ops)
        self._members = after
        left = {op[1] for op in ops if op[0] == "del"} & self._gate_now()
        if left:
            self._gate("del", left - modes_in(after))
        return after

    def replace(self, mode: str, members: Mapping[str, int]) -> None:
        """Replace a mode's sets atomically (temporary set + swap, per family);
        members: ip -> minor (canonical addresses of either family)."""
        sets: dict[str, dict[str, int]] = {names[mode]: {} for names in FAMILY_SETS.values()}
        for ip, minor in members.items():
            sets[FAMILY_SETS[family(ip)][mode]][ip] = minor
        self._gate("add", [name for name, part in sets.items() if part])
        self._apply_swap(sets)
        self._members = None  # other sets may hold some of these: read back next time
        self._gate("del", [name for name, part in sets.items() if not part])

    def destroy(self, done: list[str] | None = None) -> list[str]:
        """Destroy every set of ours that exists (the list:set first), each whatever
        became of the others; the names destroyed go into `done` as they go.  A set
        that cannot go (busy, a rule names it) is emptied instead: nobody stays
        delayed by it; then DatapathError naming each."""
        existing = self.headers()
        out = [] if done is None else done
        failed = []
        ips = self.host.ipsets()
        for name in OWNED_SETS:
            if name not in existing:
                continue
            try:
                ips.destroy(name)
            except Exception as e:
                with contextlib.suppress(Exception):
                    ips.flush(name)
                failed.append(f"cannot destroy ipset {name}: {e}")
                continue
            out.append(name)
        self.invalidate()
        if failed:
            raise DatapathError("; ".join(failed))
        return out

    # ------------------------------------------------------------ the gate
    def gate_now(self) -> set[str]:
        return set(self._gate_now())

    def _gate_now(self) -> set[str]:
        if self._gated is None:
            self._gated = self._list_set_members(MEMBERS_SET) & set(ALL_SET_NAMES)
        return self._gated

    def _gate(self, op: str, names: Iterable[str]) -> None:
        from pyroute2.ipset import IPSetError

        have = self._gate_now()
        for name in sorted(set(names) - have if op == "add" else set(names) & have):
            try:
                if op == "add":
                    self.host.ipsets().add(MEMBERS_SET, name, etype="set", exclusive=False)
                    have.add(name)
                else:
                    self.host.ipsets().delete(MEMBERS_SET, name, etype="set", exclusive=False)
                    have.discard(name)
            except (IPSetError, OSError) as e:
                self._gated = None  # unknown now: read back next time
                raise ObjectError("gate", f"ipset {op} {MEMBERS_SET} {name}: {e}") from None

    def _list_set_members(self, name: str) -> set[str]:
        out = set()
        for msg in self.host.ipsets().list(name):
            adt = msg.get_attr("IPSET_ATTR_ADT")
            for data in adt.get_attrs("IPSET_ATTR_DATA") if adt is not None else ():
                member = data.get_attr("IPSET_ATTR_NAME")
                if member:
                    out.add(member)
        return out

    # ------------------------------------------------------------ transports
    def _apply_netlink(self, ops: Sequence[Op]) -> None:
        from pyroute2.ipset import IPSetError

        ips = self.host.ipsets()
        for op, name, ip, minor in ops:
            fam = socket.AF_INET6 if SET_FAMILY[name] == 6 else socket.AF_INET
            try:
                if op == "add":
                    ips.add(name, ip, family=fam, exclusive=False, skbprio=(ROOT_MAJOR, minor))
                else:
                    ips.delete(name, ip, family=fam, exclusive=False)
            except IPSetError as e:
                self._members = None  # unknown now: read back next time
                if "not added" in str(e) and op == "del":
                    continue
                raise DatapathError(f"ipset {op} {name} {ip}: {ipset_error(e)}") from None
            except OSError as e:
                self._members = None
                raise DatapathError(f"ipset {op} {name} {ip}: {e}") from None

    def _apply_restore(self, ops: Sequence[Op]) -> None:
        try:
            self.host.run(
                [self.host.tools.ipset, "-exist", "restore"],
                render_ipset_changes(ops),
                what="ipset restore",
            )
        except DatapathError:
            self._members = None
            raise

    def _apply_swap(self, sets: Mapping[str, Mapping[str, int]]) -> None:
        """Rebuild whole sets (set name -> ip -> minor): one `ipset restore` that
        fills a temporary set per set and swaps it in (atomic per set; members' counters restart).
        A temporary set a crash left behind makes the create fail: it is
        destroyed and the restore tried once more."""
        text = "".join(render_ipset_swap(n, mem, self.maxelem) for n, mem in sets.items())
        for attempt in (1, 2):
            try:
                self.host.run([self.host.tools.ipset, "restore"], text, what="ipset restore")
                return
            except DatapathError as e:
                self._members = None
                leftover = self._destroy_tmp(sets)
                if attempt == 2 or not leftover or "already exists" not in str(e):
                    raise

    def _destroy_tmp(self, sets: Mapping[str, object]) -> bool:
        """Destroy the temporary sets of these sets; True if one was there."""
        found = False
        with contextlib.suppress(Exception):
            heads = self.headers()
            for name in sets:
                if name + TMP_SUFFIX in heads:
                    self.host.ipsets().destroy(name + TMP_SUFFIX)
                    found = True
        return found
