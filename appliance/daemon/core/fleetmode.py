"""The daemon in a fleet ([fleet] in the config): merged samples in, the leaders' classes out.

Problem
    Behind two (or four) fabrics each appliance sees only its paths' share of
    each initiator's writes and of each resource's reads.  Per resource one
    appliance leads (elected through the engine, fleet/agent.py) and the
    classes it publishes are what every appliance applies; the others follow.

Per tick (main thread, the daemon's lock held), with the agent's last view
    samples(): this appliance's samples of the tick, merged
        (controller/fleet.py merge) with every other appliance's newest tick
        that this appliance has not used yet and that arrived within
        STALE_SAMPLES_S; at this appliance's convergence (its writes and IO
        samples are new) also with every other appliance's last convergence,
        if it arrived within CONV_STALE_CONVERGES convergences.  So every
        appliance runs decide() on (nearly) what one appliance on every path
        would see.  The tick's own samples are handed to the agent to publish.
    after_decide():
        led here: the resource's class and its members' classes go to the
            agent, which publishes them at the leadership's epoch;
        led elsewhere, with a current decision (the engine binds it to the
        leader: fleet/engine.py Snapshot.current) whose (epoch, revision) is
        not the one applied last -- the engine's numbers, never the payload's
        seq, and "not the last" rather than "newer", so no value anyone puts
        into the engine can make the follower wait for a later one: this
            appliance's controller moves to the leader's class -- at once
            when they agree within one tick's move, else as decide() would
            move (down at most class_decrease_max_per_tick, up through the
            ramp) -- so the class it applies is the leader's, and when the
            leader dies or the engine goes away it continues from there
            (bumpless handover, no jump on rejoin).  The decision's members
            this appliance's write-heavy sets lack are delayed too (extra()).
    Degraded (no good cycle for fleet/agent.py's DEGRADED_AFTER_S): own
        samples only, own classes only -- control alone, never a stranded
        delay; the leaders' classes it followed are dropped at once.

Worked example
    a leads vg0 at epoch 17; b follows.  b's tick: b's reads (10 at 8 ms)
    and a's newest (30 at 12 ms) merge to 40 at 11 ms; b's decide() computes
    class 14, a published class 15 (seq 812) -> b's vg0 class becomes 15,
    and b's netem delay for vg0's members is class 15's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from santhrottle.appliance.fleet.agent import FleetAgent, FleetView, Followed
from santhrottle.appliance.fleet.codec import LeaderClasses, Published, SampleBatch
from santhrottle.controller.domain import Samples
from santhrottle.controller.fleet import STALE_SAMPLES_S, follow, merge

if TYPE_CHECKING:
    from santhrottle.appliance.daemon.core.loop import Daemon

# Another appliance's last convergence counts for this many of its
# convergences: one late convergence does not drop its writers from the sum.
CONV_STALE_CONVERGES = 2.5


def _followed(f: Followed) -> dict[str, Any]:
    return {
        "leader": f.leader,
        "epoch": f.epoch,
        "seq": f.classes.seq,
        "revision": f.revision,
        "class": f.classes.delay_class,
    }


class FleetMode:
    """The tick's side of the fleet for one daemon (its agent runs the engine)."""

    def __init__(self, agent: FleetAgent) -> None:
        self.agent = agent
        self.view: FleetView = agent.view()
        # per followed resource: the (epoch, revision) applied last, and its members' classes
        self.applied: dict[str, tuple[int, int]] = {}
        self.classes: dict[str, dict[str, int]] = {}
        self.used: dict[str, int] = {}  # appliance -> its tick seq merged last
        self.tick_seq = 0
        self.conv: SampleBatch | None = None  # this appliance's last convergence
        self.extra: dict[str, int] = {}  # followed members that are not members here
        self.merged_parts = 0  # other appliances' ticks merged (metrics)
        self.converges = 0  # the daemon's convergences seen

    # -------------------------------------------------------------- samples
    def samples(self, d: Daemon, own: Samples, now: float) -> Samples:
        """What decide() runs on this tick (see the module's doc)."""
        self.view = v = self.agent.view()
        self.tick_seq += 1
        name = self.agent.name
        tick = SampleBatch(name, self.tick_seq, now, Samples(own.reads, [], own.devices, []))
        # a convergence since the last tick (its writes may be none: that is news too)
        converged = bool(own.writes or own.ios) or d.counters.converges != self.converges
        self.converges = d.counters.converges
        if converged:
            seq = 1 if self.conv is None else self.conv.seq + 1
            self.conv = SampleBatch(name, seq, now, Samples([], own.writes, [], own.ios))
        self.agent.offer(Published(tick, self.conv))
        if v.degraded:
            return own
        parts = [own]
        conv_stale_s = CONV_STALE_CONVERGES * d.config.controller.converge_s
        for who, p in v.parts.items():
            if self.used.get(who) != p.tick.seq and now - p.tick_seen_s <= STALE_SAMPLES_S:
                self.used[who] = p.tick.seq
                parts.append(p.tick.samples)
                self.merged_parts += 1
            if converged and p.conv is not None and now - p.conv_seen_s <= conv_stale_s:
                parts.append(p.conv.samples)
        return own if len(parts) == 1 else merge(parts)

    # -------------------------------------------------------------- decisions
    def after_decide(self, d: Daemon) -> None:
        ctl, v = d.ctl, self.view
        if v.degraded:
            self._unfollow(set(self.classes))
            return
        for r, epoch in v.leading.items():
            rs = ctl.resources.get(r)
            if rs is None:
                continue
            members = {i: ctl.effective.get(i, 0) for i in sorted(ctl.members(r))}
            self.agent.offer_decision(
                r, epoch, LeaderClasses(self.tick_seq, rs.delay_class, members)
            )
        self._unfollow({r for r in self.classes if r not in v.followed})
        for r, f in v.followed.items():
            rs = ctl.resources.get(r)
            if rs is None or self.applied.get(r) == (f.epoch, f.revision):
                continue  # applied already (the leader's next is a tick away)
            self.applied[r] = (f.epoch, f.revision)
            self.classes[r] = {i: k for i, k in f.classes.members.items() if k > 0}
            follow(ctl, r, f.classes.delay_class)
        self.extra = {}
        for r, per in self.classes.items():
            local = ctl.members(r)
            for ini, k in per.items():
                if ini not in local and k > self.extra.get(ini, 0):
                    self.extra[ini] = k

    def effective(self, own: dict[str, int]) -> dict[str, int]:
        """The classes to apply: this controller's, and the followed leaders'
        members that are not members here (the larger class where both are)."""
        if not self.extra:
            return own
        out = dict(self.extra)
        for ini, k in own.items():
            if k > out.get(ini, 0):
                out[ini] = k
        return out

    def _unfollow(self, resources: set[str]) -> None:
        for r in resources:
            self.classes.pop(r, None)
            self.applied.pop(r, None)  # followed again: the decision then current applies
        if resources:
            self.extra = {}

    # -------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        v = self.view
        c = self.agent.counters
        now_parts = {
            who: {"tick_seq": p.tick.seq, "conv_seq": None if p.conv is None else p.conv.seq}
            for who, p in sorted(v.parts.items())
        }
        return {
            "array": v.array,
            "appliance": v.appliance,
            "mode": "degraded" if v.degraded else "fleet",
            "reason": v.reason,
            "revision": v.revision,
            "engine_age_s": v.ok_age_s,
            "appliances": list(v.appliances),
            "leaders": {
                r: {"appliance": who, "epoch": e} for r, (who, e) in sorted(v.leaders.items())
            },
            "leading": sorted(v.leading),
            "following": {r: _followed(f) for r, f in sorted(v.followed.items())},
            "parts": now_parts,
            "counters": {
                "cycles": c.cycles,
                "failures": c.failures,
                "joins": c.joins,
                "leases_lost": c.leases_lost,
                "elections_won": c.elections_won,
                "refused": c.refused,
                "bad_payloads": c.bad_payloads,
                "unbound_decisions": c.unbound,
                "merged_parts": self.merged_parts,
            },
        }
