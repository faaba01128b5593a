"""FleetAgent (fleet/agent.py) on the in-memory engine: joins, leaders, samples, faults.

The engine is tests/unit/fleet_fake.py's, which keeps the real adapter's rules
(tests/unit/fleet_contract.py holds both to them); the agent's clock is the
engine's, so lease expiry and the degraded mode run in virtual time.
"""

from __future__ import annotations

import time

import pytest

from santhrottle.appliance.fleet.agent import DEGRADED_AFTER_S, FleetAgent
from santhrottle.appliance.fleet.codec import LeaderClasses, Published, SampleBatch
from santhrottle.controller.domain import ReadSample, Samples, WriteSample
from tests.unit.fleet_fake import FakeCoordinator, FakeEngine

pytestmark = pytest.mark.unit
TICK_S = 0.1


def agent(engine: FakeEngine, name: str, **kw) -> FleetAgent:
    return FleetAgent(
        FakeCoordinator(engine, "arr"), name, {"mode": "bridge"}, clock=lambda: engine.now_s, **kw
    )


def cycles(engine: FakeEngine, agents: list[FleetAgent], n: int = 1) -> None:
    for _ in range(n):
        for a in agents:
            a.cycle()
        engine.advance(TICK_S)


def batch(name: str, seq: int, reads: int = 6) -> Published:
    tick = SampleBatch(name, seq, 1.0, Samples(reads=[ReadSample("vg0", reads, 0.012)]))
    conv = SampleBatch(name, 1, 1.0, Samples(writes=[WriteSample("vg0", "10.0.0.3", 5e6)]))
    return Published(tick, conv)


def test_no_good_cycle_yet_is_degraded():
    e = FakeEngine()
    a = agent(e, "a")
    v = a.view()
    assert v.degraded and v.ok_age_s is None and v.reason == "not joined yet"


def test_one_leader_per_resource_the_other_sees_its_samples_and_decision():
    e = FakeEngine()
    a, b = agent(e, "a"), agent(e, "b")
    a.want({"vg0"})
    b.want({"vg0"})
    a.offer(batch("a", 1))
    cycles(e, [a, b])
    va, vb = a.view(), b.view()
    assert not va.degraded and not vb.degraded
    assert va.leading == {"vg0": va.leaders["vg0"][1]} and vb.leading == {}
    assert vb.leaders["vg0"][0] == "a" and vb.appliances == ("a", "b")
    part = vb.parts["a"]
    assert part.tick.seq == 1 and part.tick.samples.reads[0].reads == 6
    assert part.conv is not None and part.conv.samples.writes[0].write_bps == 5e6
    seen = part.tick_seen_s
    cycles(e, [a, b])  # the same seq again: first seen then, not now
    assert b.view().parts["a"].tick_seen_s == seen
    a.offer_decision("vg0", va.leading["vg0"], LeaderClasses(7, 12, {"10.0.0.3": 12}))
    cycles(e, [a, b])
    f = b.view().followed["vg0"]
    assert (f.leader, f.epoch, f.classes.seq, f.classes.delay_class) == (
        "a", va.leading["vg0"], 7, 12,
    )  # fmt: skip
    assert a.view().followed == {}  # a leads it: nothing to follow


def test_a_decision_at_another_epoch_is_not_published():
    e = FakeEngine()
    a = agent(e, "a")
    a.want({"vg0"})
    cycles(e, [a])
    epoch = a.view().leading["vg0"]
    a.offer_decision("vg0", epoch - 1, LeaderClasses(1, 5, {}))
    cycles(e, [a])
    assert e.kv.get("/santhrottle/arr/decisions/vg0") is None


def test_outage_degrades_after_the_bound_and_rejoins_with_a_new_lease():
    e = FakeEngine()
    a, b = agent(e, "a"), agent(e, "b")
    a.want({"vg0"})
    b.want({"vg0"})
    cycles(e, [a, b], 3)
    e.down = True
    cycles(e, [a, b], 5)  # 0.5 s: one slow second is not an outage yet
    assert not a.view().degraded
    cycles(e, [a, b], round(DEGRADED_AFTER_S / TICK_S))
    v = a.view()
    assert v.degraded and "fake engine: down" in v.reason and v.leading == {}
    assert a.counters.failures >= 10
    e.down = False  # the leases ran out meanwhile: LeaseLost, then a new join
    cycles(e, [a, b], 3)
    assert a.counters.leases_lost == 1 and a.counters.joins == 2
    va, vb = a.view(), b.view()
    assert not va.degraded and not vb.degraded
    assert len({va.leaders["vg0"], vb.leaders["vg0"]}) == 1  # one leader, both agree


def test_stop_leaves_so_the_other_leads_at_the_next_cycle():
    e = FakeEngine()
    a, b = agent(e, "a"), agent(e, "b")
    a.want({"vg0"})
    b.want({"vg0"})
    cycles(e, [a, b])
    old = a.view().leading["vg0"]
    a.stop()
    cycles(e, [b])
    vb = b.view()
    assert vb.leading["vg0"] > old and b.counters.elections_won == 1


def test_bad_payloads_of_another_appliance_are_skipped_and_counted():
    e = FakeEngine()
    a, b = agent(e, "a"), agent(e, "b")
    a.want({"vg0"})
    cycles(e, [a, b])
    epoch = a.view().leading["vg0"]
    b.coord.publish_samples({"tick": {"v": 1, "appliance": "b"}, "conv": None})
    a.coord.publish_decisions("vg0", epoch, {"v": 1, "seq": 1, "class": 10**6, "members": {}})
    cycles(e, [a, b])
    assert a.counters.bad_payloads == 1 and "b" not in a.view().parts
    assert b.counters.bad_payloads == 1 and b.view().followed == {}
    assert not a.view().degraded and not b.view().degraded


def test_resource_names_with_slashes_are_one_key_segment():
    e = FakeEngine()
    a, b = agent(e, "a"), agent(e, "b")
    name = "nvme://10.0.0.5:4420/*/*"
    a.want({name})
    cycles(e, [a, b])
    assert b.view().leaders[name][0] == "a" and name in a.view().leading


def test_an_unexpected_error_in_a_round_is_counted_and_the_thread_goes_on():
    e = FakeEngine()
    a = agent(e, "a", tick_s=0.01)
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("a bug")

    a.coord.snapshot = broken
    a.start()  # its own thread, on the wall clock: waits for rounds, never for a time
    try:
        t0 = time.monotonic()
        while len(calls) < 3 and time.monotonic() - t0 < 30:
            time.sleep(0.01)
    finally:
        a.stop()
    assert len(calls) >= 3 and a.counters.failures >= 3
    assert "RuntimeError: a bug" in a.view().reason


def test_a_decision_not_under_the_leaders_lease_is_skipped_and_counted_once(caplog):
    e = FakeEngine()
    a, b = agent(e, "a"), agent(e, "b")
    a.want({"vg0"})
    cycles(e, [a, b])
    epoch = a.view().leading["vg0"]
    payload = {"v": 1, "seq": 10**12, "class": 9, "members": {"10.9.9.9": 9}}
    forged = {"epoch": epoch, "appliance": "a", "payload": payload}
    e.put("/santhrottle/arr/decisions/vg0", forged)  # by hand: no lease
    cycles(e, [b], 3)  # the leader writes nothing meanwhile: the same version, counted once
    assert b.view().followed == {} and b.counters.unbound == 1
    assert sum("not written under its leader's lease" in r.message for r in caplog.records) == 1
    a.offer_decision("vg0", epoch, LeaderClasses(8, 3, {"10.0.0.3": 3}))
    cycles(e, [a, b])
    f = b.view().followed["vg0"]
    assert (f.classes.seq, f.epoch) == (8, epoch) and f.revision > epoch
    assert b.counters.unbound == 1


def test_a_leader_key_naming_me_under_another_lease_is_not_my_leadership():
    e = FakeEngine()
    a, b = agent(e, "a"), agent(e, "b")
    a.want({"vg0"})
    cycles(e, [a, b])
    key = "/santhrottle/arr/leader/vg0"
    e.put(key, "a", b.coord.lease)  # b's lease on a key that names a: etcd keeps the epoch
    cycles(e, [a, b])
    assert a.view().leading == {} and b.view().leading == {"vg0": e.kv[key].create_revision}


def test_an_appliance_that_may_not_lead_never_campaigns():
    e = FakeEngine()
    a = agent(e, "a", lead=False)
    a.want({"vg0"})
    cycles(e, [a], 3)
    assert a.view().leaders == {} and a.counters.elections_won == 0
    b = agent(e, "b")
    b.want({"vg0"})
    cycles(e, [a, b], 2)
    assert a.view().leaders["vg0"][0] == "b" and a.view().leading == {}


def test_a_decision_member_no_initiator_has_is_dropped_and_counted_once():
    e = FakeEngine()
    a, b = agent(e, "a"), agent(e, "b")
    a.want({"vg0"})
    cycles(e, [a, b])
    epoch = a.view().leading["vg0"]
    a.offer_decision("vg0", epoch, LeaderClasses(5, 4, {"0.0.0.0": 4, "10.0.0.3": 4}))
    cycles(e, [a, b], 3)  # the same decision read three times: said once
    f = b.view().followed["vg0"]
    assert f.classes.members == {"10.0.0.3": 4} and b.counters.bad_payloads == 1
