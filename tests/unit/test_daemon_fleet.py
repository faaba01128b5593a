"""Two daemons of one fleet in virtual time: merged samples, followed classes, faults.

Each Daemon has fake sensors and a fake actuator (tests/unit/test_daemon.py's
style) and a FleetMode whose agent runs on the in-memory engine
(tests/unit/fleet_fake.py); the agents' cycles are called in step with the
ticks instead of in their threads.  The real engine is tested in the
privileged tier, the real data path in the lab.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from prometheus_client import generate_latest

from santhrottle.appliance.config import parse_config
from santhrottle.appliance.daemon.core.fleetmode import FleetMode
from santhrottle.appliance.daemon.core.loop import CommandError, Daemon
from santhrottle.appliance.daemon.status.build import StatusCache
from santhrottle.appliance.daemon.status.metrics import registry_for
from santhrottle.appliance.fleet.agent import FleetAgent
from santhrottle.controller.domain import ReadSample, WriteSample
from tests.unit.fleet_fake import FakeCoordinator, FakeEngine
from tests.unit.test_daemon import (
    CONF,
    FakeActuator,
    FakeDiscovery,
    NoGroupSensing,
    View,
    handle,
    status_of,
)

pytestmark = pytest.mark.unit
MIB = 1024 * 1024
TICK_S = 0.1
WRITER = "10.0.0.3"
WRITE_BPS = 10 * MIB  # the writer's undelayed rate, over all paths


@dataclass
class PathSensors(NoGroupSensing):
    """What one appliance sees of vg0: its paths' reads and its share of the writes.

    The array is shared: its read latency grows with the writer's total rate,
    and the writer's rate on each path falls with the delay that path's
    appliance gives it (a closed writer: rate = share / (1 + delay / 5 ms))."""

    fleet: Fleet
    name: str
    reads: int = 20
    latency_s: float | None = None  # fixed, instead of the array's
    writes: dict[str, float] | None = None  # fixed, instead of the plant's

    def write_rates(self) -> dict[str, float]:
        if self.writes is not None:
            return self.writes
        return {WRITER: WRITE_BPS * self.fleet.share[self.name] * self.fleet.slowdown(self.name)}

    def read_samples(self) -> list[ReadSample]:
        lat = self.fleet.array_latency_s() if self.latency_s is None else self.latency_s
        return [ReadSample("vg0", self.reads, lat, sum(self.write_rates().values()))]

    def device_samples(self):
        return []

    def converge(self):
        w = self.write_rates()
        d = FakeDiscovery({"vg0": ("dm-0",)}, {ip: View({"vg0"}) for ip in w})
        return d, [WriteSample("vg0", ip, bps) for ip, bps in w.items()]


class Fleet:
    def __init__(self, names=("a", "b"), fleet=True, conf: str = CONF, split=(0.5, 0.5)) -> None:
        self.share = dict(zip(names, split, strict=True))
        self.engine = FakeEngine(now_s=1000.0)
        self.daemons: dict[str, Daemon] = {}
        self.acts: dict[str, FakeActuator] = {}
        self.sensors: dict[str, PathSensors] = {}
        self.alive: set[str] = set(names)
        self.ticks = 0
        for n in names:
            fm = None
            if fleet:
                coord = FakeCoordinator(self.engine, "arr")
                fm = FleetMode(FleetAgent(coord, n, {}, clock=self.clock))
            self.sensors[n], self.acts[n] = PathSensors(self, n), FakeActuator(self.clock)
            self.daemons[n] = Daemon(
                parse_config(conf, "t.toml"), self.sensors[n], self.acts[n],
                clock=self.clock, fleet=fm,
            )  # fmt: skip

    def clock(self) -> float:
        return self.engine.now_s

    def slowdown(self, n: str) -> float:
        """The writer's rate on n's paths over its undelayed rate."""
        d = self.daemons.get(n)
        delay_s = 0.0 if d is None else d.config.ladder.delay_s(self.kernel(n))
        return 1.0 / (1.0 + delay_s / 0.005)

    def array_latency_s(self) -> float:
        """4 ms, and 20 ms more at the writer's undelayed rate (on the live paths)."""
        load = sum(self.share[n] * self.slowdown(n) for n in self.alive)
        return 0.004 + 0.020 * load

    def run(self, seconds: float, each=None) -> None:
        for _ in range(round(seconds / TICK_S)):
            for n in sorted(self.alive):
                d = self.daemons[n]
                if d.fleet is not None:
                    d.fleet.agent.cycle()
                if self.ticks % 10 == 0:
                    d.converge_once()
                d.tick(self.engine.now_s)
            if each is not None:
                each(self)
            self.ticks += 1
            self.engine.advance(TICK_S)

    def cls(self, n: str) -> int:
        return self.daemons[n].ctl.resources["vg0"].delay_class

    def kernel(self, n: str) -> int:
        return self.acts[n].kernel.get(WRITER, (0, ""))[0]


@pytest.mark.parametrize("split", [(0.5, 0.5), (0.9, 0.1)])
def test_the_follower_applies_the_leaders_classes_and_the_threshold_holds(split):
    f = Fleet(split=split)
    f.run(8.0)
    assert f.array_latency_s() < 0.010  # T = 10 ms; 24 ms undelayed
    a, b = f.daemons["a"], f.daemons["b"]
    assert a.fleet.view.leading and not b.fleet.view.leading  # a cycled first: it leads
    followed = b.fleet.view.followed["vg0"]
    assert followed.leader == "a" and followed.classes.delay_class > 0
    # what b applies is what a published (one cycle behind a's own class)
    assert f.kernel("b") == followed.classes.members[WRITER] > 0
    assert status_of(b)["fleet"]["following"]["vg0"]["class"] == followed.classes.delay_class


def test_a_writer_split_over_two_paths_is_judged_on_its_total():
    # 0.7 MiB/s on each path: under write_heavy_enter (1 MiB/s) on either, 1.4 in all
    conf = CONF.replace("[controller]", "[controller]\nwrite_heavy_share = 0")
    alone, fleet = Fleet(fleet=False, conf=conf), Fleet(conf=conf)
    for f in (alone, fleet):
        for s in f.sensors.values():
            s.writes = {WRITER: 0.7 * MIB}
        f.run(10.0)  # the write EWMA (tau 8 s) from 0.7 to over 1 MiB/s takes 4.5 s
    for n in ("a", "b"):
        assert WRITER not in alone.daemons[n].ctl.members("vg0") and alone.kernel(n) == 0
        assert WRITER in fleet.daemons[n].ctl.members("vg0") and fleet.kernel(n) > 0


def test_the_latency_is_the_read_weighted_mean_of_both_appliances():
    f = Fleet()
    f.sensors["a"].reads, f.sensors["a"].latency_s = 30, 0.020
    f.sensors["b"].reads, f.sensors["b"].latency_s = 10, 0.004
    f.run(6.0)
    for d in f.daemons.values():  # (30 x 20 + 10 x 4) / 40 = 16 ms, on both
        assert d.ctl.resources["vg0"].ewma.value == pytest.approx(0.016, rel=0.05)


def test_an_engine_outage_degrades_to_local_control_and_rejoins_without_a_jump():
    f = Fleet(split=(0.8, 0.2))
    f.run(8.0)
    before = {n: f.kernel(n) for n in f.daemons}
    assert min(before.values()) > 0
    seen: list[dict[str, int]] = []
    f.engine.down = True
    f.run(2.0, each=lambda fl: seen.append({n: fl.kernel(n) for n in fl.daemons}))
    for d in f.daemons.values():
        st = status_of(d)["fleet"]
        assert st["mode"] == "degraded" and "down" in st["reason"]
        assert d.fleet.view.followed == {}
    assert all(min(s.values()) > 0 for s in seen)  # each controls alone: no stranded zero
    f.engine.down = False
    after: list[dict[str, int]] = []
    f.run(2.0, each=lambda fl: after.append({n: fl.kernel(n) for n in fl.daemons}))
    modes = {status_of(d)["fleet"]["mode"] for d in f.daemons.values()}
    assert modes == {"fleet"}
    series = [before, *seen, *after]
    for n in f.daemons:  # no class jump: the ramp's and the descent's bounds per tick
        for x, y in itertools.pairwise(series):
            assert abs(y[n] - x[n]) <= 2, (n, x[n], y[n])


def test_when_the_leader_leaves_the_follower_leads_from_the_last_class():
    f = Fleet()
    f.run(8.0)
    last = f.daemons["b"].fleet.view.followed["vg0"].classes.delay_class
    f.daemons["a"].shutdown()  # leaves the fleet first, then removes its delays
    f.alive.discard("a")
    assert f.kernel("a") == 0
    f.run(0.2)
    b = f.daemons["b"]
    assert "vg0" in b.fleet.view.leading
    assert last > 10 and f.cls("b") >= last - 2  # continues from where a left it, not from 0


def test_fleet_status_command_and_metrics():
    f = Fleet()
    f.run(2.0)
    a = f.daemons["a"]
    st = handle(a, "fleet_status", {})
    assert st["array"] == "arr" and st["appliance"] == "a" and st["mode"] == "fleet"
    assert st["appliances"] == ["a", "b"] and st["leaders"]["vg0"]["appliance"] == "a"
    assert set(st["parts"]) == {"b"} and st["counters"]["merged_parts"] > 0
    text = generate_latest(registry_for(StatusCache(a))).decode()
    assert 'santhrottle_fleet_degraded{array="arr"} 0.0' in text
    assert 'santhrottle_fleet_leading{resource="vg0"} 1.0' in text
    assert 'santhrottle_fleet_appliances{array="arr"} 2.0' in text
    solo = Fleet(fleet=False)
    with pytest.raises(CommandError, match="no \\[fleet\\] endpoints"):
        handle(solo.daemons["a"], "fleet_status", {})
    assert status_of(solo.daemons["a"])["fleet"] is None
    assert (
        "santhrottle_fleet_"
        not in generate_latest(registry_for(StatusCache(solo.daemons["a"]))).decode()
    )


# -- a decision in the engine that the leader did not write (issue: a forged seq) -------
FORGED_SEQ = 999_999_999_999
STRANGER = "10.9.9.9"  # an initiator nobody's controller delays


def _forge(f: Fleet, under_leaders_lease: bool) -> None:
    """A well-formed decision for vg0 put straight into the engine, as anyone with
    write access could: the leader's epoch, a huge seq, the top class for STRANGER."""
    leader = f.engine.kv["/santhrottle/arr/leader/vg0"]
    top = f.daemons["b"].config.max_class
    payload = {"v": 1, "seq": FORGED_SEQ, "class": top, "members": {STRANGER: top, WRITER: 0}}
    value = {"epoch": leader.create_revision, "appliance": "a", "payload": payload}
    lease = leader.lease if under_leaders_lease else 0
    f.engine.put("/santhrottle/arr/decisions/vg0", value, lease)


@pytest.mark.parametrize("under", ["no lease", "the leader's lease"])
def test_a_forged_decision_with_a_huge_seq_never_wedges_the_follower(under):
    f = Fleet()
    f.run(8.0)
    a, b = f.daemons["a"], f.daemons["b"]
    assert a.fleet.view.leading and f.kernel("b") > 0
    _forge(f, under_leaders_lease=under != "no lease")
    b.fleet.agent.cycle()  # the follower reads the engine before the leader writes again
    b.tick(f.engine.now_s)
    delayed: list[int] = []
    f.run(3.0, each=lambda fl: delayed.append(fl.acts["b"].kernel.get(STRANGER, (0, ""))[0]))
    assert delayed[-20:] == [0] * 20, delayed  # nobody wants STRANGER delayed
    assert sum(1 for k in delayed if k) <= 2, delayed  # a tick or two at most, never stuck
    followed = b.fleet.view.followed["vg0"]
    assert followed.leader == "a" and followed.classes.seq < FORGED_SEQ
    assert f.kernel("b") == followed.classes.members[WRITER] > 0  # the leader's class again
