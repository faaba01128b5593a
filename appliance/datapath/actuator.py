"""The data path: delay classes for initiators, on every egress device, composed from its parts.

Problem
    Per initiator, delay the packets the target (or bridge) sends to it by
    a chosen delay class: class k delays by k x step (0.5 ms by default), up
    to max_class (88 = 250 ms by default, controller/ladder.py).  Class 0 = unthrottled.  Classes
    change every 100 ms for thousands of initiators, so a change is one
    netlink message (or one `ipset restore`), never a tc filter or an
    iptables change; when nobody is throttled, no packet pays anything.

The parts (each a module with its own header)
    names.py    handles, set and chain names, class <-> HTB minor (pure)
    tctree.py   the tc tree: sizing, render, parse (pure)
    rules.py    the mangle rules: render, parse (pure)
    members.py  membership diffs and ipset texts (pure)
    glide.py    the glide planner: ordered moves (pure)
    host.py     tools, namespaces, pyroute2 sockets
    tc.py       one device's tree in the kernel
    sets.py     the member sets and their gate in the kernel
    mangle.py   the rules in the kernel
    cleanup.py  removing all of it, each part whatever became of the others
    nftrules.py bridge mode's sets and rules in nftables' bridge family (pure)
    nftgate.py  the same in the kernel, behind sets.py's and mangle.py's interfaces

    Datapath composes them: a TcDevice per egress device (every device has
    the same tree, so the same skbprio means the same delay on each), one
    MemberSets and one Mangles (IPv4 and IPv6) shared by all (on a bridge, spec.bridged:
    NftSets and NftRules), one GlidePlanner.

Run time
    set_classes({ip: class}, mode) diffs against the membership it knows
    (read back from the kernel once), lets the planner route descents and
    same-prio rises through glide leaves, installs the jumps with the first
    member and removes them with the last, and sends the ops.  advance_glides()
    (every tick) carries out the planner's due lowerings and handoffs.  A
    failed kernel change leaves the membership and the leaves' delays
    unknown: both are read back from the kernel at the next call.

Lifecycle
    apply() reconciles: it builds what is missing, changes what differs,
    adopts what a previous run left (members included) and refuses to
    touch a root qdisc it did not create.  cleanup() removes every qdisc,
    class, set and rule it created, and nothing else (cleanup.py).

Worked example
    Datapath(DatapathSpec(("eth1",))).apply() builds 100 netem classes of
    0.5 ms and 8 glide leaves on eth1, the sets and the chain (no jump);
    set_classes({"10.0.0.3": 20}) puts the jump on eth1 and 10.0.0.3 into
    santhrottle-all with skbprio 5374:20: its iSCSI traffic is now delayed
    10 ms; set_classes({"10.0.0.3": 0}) glides it out (20 -> leaf -> 0),
    and the advance_glides() that hands it out of the set removes the jump.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from santhrottle.appliance.datapath.cleanup import CleanupReport, remove_everything
from santhrottle.appliance.datapath.drift import Expected
from santhrottle.appliance.datapath.glide import GlidePlan, GlidePlanner, LeafDelay
from santhrottle.appliance.datapath.host import Host, Tools
from santhrottle.appliance.datapath.mangle import Mangles
from santhrottle.appliance.datapath.members import (
    BULK_THRESHOLD,
    MAXELEM,
    KernelMembers,
    Member,
    Op,
    check_mode,
    plan_changes,
)
from santhrottle.appliance.datapath.names import (
    MODES,
    DatapathError,
    ObjectError,
    check_ip,
    class_minor,
    family,
)
from santhrottle.appliance.datapath.nftgate import (
    NFT_BACKEND,
    NftGeneration,
    NftRules,
    NftSets,
)
from santhrottle.appliance.datapath.sets import MemberSets
from santhrottle.appliance.datapath.spec import DatapathSpec
from santhrottle.appliance.datapath.tc import TcDevice
from santhrottle.appliance.datapath.tctree import desired_tree, glide_leaf


@dataclass(slots=True)
class ApplyReport:
    backend: str
    tc_lines: int = 0  # tc batch commands sent (0 = the trees were adopted as they are)
    tc_fresh: bool = False
    sets_created: list[str] = field(default_factory=list)
    rules_changed: bool = False
    clamped: dict[str, int] = field(default_factory=dict)  # ip -> new class
    timings_s: dict[str, float] = field(default_factory=dict)  # step -> seconds

    def summary(self) -> str:
        if self.tc_fresh:
            tc = f"tc: built {self.tc_lines} objects"
        else:
            tc = f"tc: {self.tc_lines} changes" if self.tc_lines else "tc: adopted"
        created = ", ".join(self.sets_created)
        sets = f"sets: created {created}" if created else "sets: adopted"
        rules = "rules: installed" if self.rules_changed else "rules: adopted"
        how = self.backend if self.backend == NFT_BACKEND else f"iptables {self.backend} backend"
        out = f"{tc}; {sets}; {rules} ({how})"
        if self.clamped:
            out += f"; {len(self.clamped)} members clamped to the new maximum class"
        return out


def gate(
    host: Host, bridged: bool, maxelem: int = MAXELEM, bulk_threshold: int = BULK_THRESHOLD
) -> tuple[MemberSets | NftSets, Mangles | NftRules]:
    """The member sets and the rules in front of them: ipset + iptables on a target
    host, nftables' bridge family on a bridge (datapath/nftrules.py)."""
    if bridged:
        generation = NftGeneration(host)  # after either's last transaction
        return NftSets(host, generation), NftRules(host, generation)
    return MemberSets(host, maxelem, bulk_threshold), Mangles(host)


class Datapath:
    """The actuator: delay classes on every egress device of the spec (module header)."""

    def __init__(
        self,
        spec: DatapathSpec,
        *,
        netns: str | None = None,
        tools: Tools | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        maxelem: int = MAXELEM,
        bulk_threshold: int = BULK_THRESHOLD,
    ) -> None:
        self.spec = spec
        self.host = Host(netns, tools)
        self.devices = [TcDevice(self.host, d) for d in spec.devices]
        self.sets, self.mangle = gate(self.host, spec.bridged, maxelem, bulk_threshold)
        self.glides = GlidePlanner(spec.glide_leaves, spec.ladder)
        self.clock = clock
        self.sleep = sleep  # cleanup's pause before it tries a failed part again
        self._jumps: bool | None = None  # the jumps are installed (None: unknown)

    # ------------------------------------------------------------ plumbing
    @property
    def netns(self) -> str | None:
        return self.host.netns

    @property
    def glided(self) -> int:
        return self.glides.glided

    @property
    def unordered_moves(self) -> int:
        return self.glides.unordered

    def __enter__(self) -> Datapath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.host.close()

    def device(self, name: str | None = None) -> TcDevice:
        """The TcDevice of `name` (default: the first device of the spec)."""
        for d in self.devices:
            if name in (None, d.device):
                return d
        if name is None:
            raise DatapathError("no device given (--device)")
        return TcDevice(self.host, name)

    # ------------------------------------------------------------ lifecycle
    def apply(self) -> ApplyReport:
        """Reconcile trees, sets and rules with the spec (idempotent)."""
        if not self.devices:
            raise DatapathError("no device given (--device)")
        s = self.spec
        t0 = time.monotonic()
        report = ApplyReport(backend=self.mangle.backend())
        want = desired_tree(s.ladder.delays_us, s.link_bits_s, s.leaf, s.glide_leaves)
        t1 = time.monotonic()
        for dev in self.devices:
            lines, fresh = dev.apply(want)
            report.tc_lines += lines
            report.tc_fresh = report.tc_fresh or fresh
        t2 = time.monotonic()
        self.sets.invalidate()
        report.sets_created = self.sets.ensure()
        members = self.current()
        self.sets.sync_gate(self._membership())
        t3 = time.monotonic()
        report.rules_changed = self.mangle.reconcile(s.devices, s.ports, bool(members))
        self._jumps = bool(members)
        t4 = time.monotonic()
        # Members whose class no longer exists would fall to HTB's direct queue
        # silently: clamp them to the new maximum (unordered: their class is gone).
        over = {ip: m for ip, m in members.items() if m.klass > s.max_class}
        for mode in MODES:
            part = {ip: s.max_class for ip, m in over.items() if m.mode == mode}
            if part:
                self.set_classes(part, mode=mode, ordered=False)
        report.clamped = {ip: s.max_class for ip in over}
        t5 = time.monotonic()
        report.timings_s = {
            "checks": t1 - t0,
            "tc": t2 - t1,
            "sets": t3 - t2,
            "rules": t4 - t3,
            "members": t5 - t4,
        }
        return report

    def cleanup(self) -> CleanupReport:
        """Remove every qdisc, class, set and rule santhrottle created (cleanup.py)."""
        try:
            return remove_everything(self.host, self.spec.bridged, self.sleep)
        finally:
            self.glides.forget()
            self._jumps = None

    # ------------------------------------------------------------ members
    def current(self) -> dict[str, Member]:
        """Members of our sets with their mode, class and counters (read back)."""
        raw = self.sets.read()
        unknown = self.glides.sync({ip: (mode, minor) for ip, (mode, minor, _, _) in raw.items()})
        if unknown:
            self.glides.adopt(self._leaf_delays_us(unknown), self.clock())
        class_of = self.glides.class_of
        return {
            ip: Member(ip, mode, class_of(minor), pk, by)
            for ip, (mode, minor, pk, by) in raw.items()
        }

    def strays(self) -> list[str]:
        """Members of the sets as last read whose skbprio is none of santhrottle's
        (minor 0, members.py): put there by someone else."""
        m = self.sets.cached() or {}
        return sorted(ip for ip, (_mode, minor) in m.items() if minor == 0)

    def _membership(self) -> KernelMembers:
        m = self.sets.cached()
        if m is None:
            self.current()
            m = self.sets.cached()
        assert m is not None
        return m

    def expected(self) -> Expected:
        """What this data path left in the kernel (datapath/drift.py)."""
        return Expected(self.sets.cached(), self._jumps, *self.mangle.left())

    def plan_changes(self, classes: Mapping[str, int], mode: str | None = None) -> list[Op]:
        """The ipset ops (op, set, ip, HTB minor) that move `classes` into place."""
        mode = check_mode(mode or self.spec.write_mode)
        return plan_changes(
            self._membership(), classes, mode, self.spec.max_class, self.glides.class_table()
        )

    def set_classes(
        self, classes: Mapping[str, int], mode: str | None = None, *, ordered: bool = True
    ) -> int:
        """Move initiators into delay classes (0 = out of every set).  `mode`
        (default: the write mode) names the set: all, ack or read.  With
        `ordered`, descents and same-prio rises go through glide leaves: call
        advance_glides() every tick after it.  Returns the ipset operations sent."""
        mode = check_mode(mode or self.spec.write_mode)
        ops = self.plan_changes(classes, mode)
        if not ops:
            return 0
        self._check_families(op[2] for op in ops if op[0] == "add")
        before = self._membership()
        now = self.clock()
        if ordered and self.spec.glide_leaves:
            plan = self.glides.plan(ops, mode, before, now)
        else:
            plan = GlidePlan([], ops, [])
        with self._unknown_on_failure():
            self._set_leaf_delays(plan.before)
            self._send(plan.ops, before)
            self._set_leaf_delays(self.glides.entered(plan, self.clock()))
        return len(plan.ops)

    def advance_glides(self) -> int:
        """Carry out the glide planner's due lowerings and handoffs.  Cheap when
        nothing is due, and nothing at all while no leaf is in use (idle()): the
        daemon calls it every tick.  Returns the ops sent."""
        if self.glides.idle():
            return 0
        now = self.clock()
        with self._unknown_on_failure():
            self._set_leaf_delays(self.glides.lowerings(now))
            looks = self.glides.looks(now)
            if not looks:
                return 0
            members = self._membership()
            ops = self.glides.handoffs(self._leaf_readings(looks), members, now)
            self._send(ops, members)
        return len(ops)

    def replace_members(self, mode: str, members: Mapping[str, int]) -> None:
        """Replace a whole set atomically (temporary set + swap)."""
        check_mode(mode)
        clean = {check_ip(ip): k for ip, k in members.items()}
        for ip, k in clean.items():
            if type(k) is not int or not 1 <= k <= self.spec.max_class:
                raise DatapathError(f"bad class {k!r} for {ip}: must be 1-{self.spec.max_class}")
        self._check_families(clean)
        with self._unknown_on_failure():
            if clean:
                self._set_jumps(True)
            self.sets.replace(mode, {ip: class_minor(k) for ip, k in clean.items()})
            self._set_jumps(bool(self.current()))

    # ------------------------------------------------------------ internal
    def _check_families(self, ips: Iterable[str]) -> None:
        """An IPv6 initiator cannot be delayed where the gate has no IPv6 rules."""
        problem = self.mangle.v6_problem
        if problem:
            for ip in ips:
                if family(ip) == 6:
                    raise DatapathError(f"IPv6 initiator {ip}: {problem}")

    def _send(self, ops: Sequence[Op], before: KernelMembers) -> None:
        if not ops:
            return
        if any(op[0] == "add" for op in ops):
            self._set_jumps(True)  # the first member is delayed from its first packet
        after = self.sets.send(ops, before)
        if not after:
            self._set_jumps(False)  # the last one has left: idle costs nothing
        self.glides.moved(before, after, ops, self.clock())

    def _set_jumps(self, active: bool) -> None:
        if self._jumps != active:
            try:
                self.mangle.set_jumps(self.spec.devices, active)
            except ObjectError:
                raise
            except DatapathError as e:  # every member needs them: not one member's fault
                raise ObjectError("jumps", str(e)) from None
            self._jumps = active

    @contextlib.contextmanager
    def _unknown_on_failure(self) -> Iterator[None]:
        """A failed kernel change: membership, leaves and jumps are read back next time."""
        try:
            yield
        except Exception:
            self.glides.lost()
            self.sets.invalidate()
            self._jumps = None
            raise

    def _set_leaf_delays(self, delays: Sequence[LeafDelay]) -> None:
        if self.spec.leaf != "netem":
            return
        s = self.spec
        for d in delays:
            want = glide_leaf("netem", d.minor, s.link_bits_s, s.ladder.max_delay_us)
            for dev in self.devices:
                try:
                    dev.set_leaf_delay(want, s.delay_us(d.klass))
                except ObjectError:
                    raise
                except DatapathError as e:  # the leaf every ordered move needs: not a member's
                    raise ObjectError("leaf", str(e)) from None

    def _leaf_readings(self, minors: Sequence[int]) -> dict[int, tuple[int, int]]:
        """(queued, sent) of glide leaves, summed over the devices."""
        out: dict[int, tuple[int, int]] = {}
        for dev in self.devices:
            for minor, (q, sent) in dev.leaf_readings(minors).items():
                q0, s0 = out.get(minor, (0, 0))
                out[minor] = (q0 + q, s0 + sent)
        return out

    def _leaf_delays_us(self, minors: Sequence[int]) -> dict[int, int]:
        """The kernel's delays of these glide leaves (0 with pfifo leaves)."""
        if self.spec.leaf != "netem" or not self.devices:
            return dict.fromkeys(minors, 0)
        leaves = self.devices[0].observe().leaves
        out = {}
        for minor in minors:
            leaf = leaves.get(minor)
            out[minor] = leaf.delay_us if leaf is not None and leaf.delay_us else 0
        return out
