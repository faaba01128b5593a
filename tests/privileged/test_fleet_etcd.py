"""EtcdCoordinator against a real 3-member etcd cluster, each member in a network
namespace this test makes (tests/privileged/etcd_cluster.py), the appliances in
processes inside those namespaces.

The shared behaviour suite (tests/unit/fleet_contract.py) runs here as on the fake;
then what only a real engine can show: the minimum lease TTL with the chosen timers,
a new leader within 2 s of the leader's death, a stalled leader fenced by the
engine, a partitioned member's client failing fast while the majority works, and a
lost quorum failing fast instead of hanging.  Skips, with the reason, without root
or etcd.
"""

from __future__ import annotations

import itertools
import os
import time

import pytest

from santhrottle.appliance.fleet.engine import EngineUnavailable, LeaseLost
from santhrottle.appliance.fleet.etcd import CALL_BUDGET_S, REQUEST_TIMEOUT_S
from tests.privileged.etcd_cluster import (
    ELECTION_MS,
    HEARTBEAT_MS,
    Agent,
    Forger,
    cluster,
    missing,
)
from tests.unit.fleet_contract import CHECKS, FORGERY_CHECKS

pytestmark = pytest.mark.privileged
_n = itertools.count()
# A call on a dead engine: the budget, plus the last attempt's connect and read.
FAIL_FAST_S = CALL_BUDGET_S + REQUEST_TIMEOUT_S + 0.5
FAILOVER_BOUND_S = 2.0


@pytest.fixture(scope="module")
def etcd():
    why = missing()
    if why:
        pytest.skip(why)
    with cluster(f"{os.getpid()}") as c:
        yield c


@pytest.fixture
def fresh_etcd():
    """A cluster of its own, for the tests that break it."""
    why = missing()
    if why:
        pytest.skip(why)
    with cluster(f"{os.getpid()}x{next(_n)}") as c:
        yield c


@pytest.fixture
def agents(etcd):
    """agents(member, array) -> an appliance's process; killed after the test."""
    made: list[Agent] = []

    def make(member: int, array: str) -> Agent:
        made.append(Agent(etcd, member, array))
        return made[-1]

    yield make
    for a in made:
        a.kill()


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.__name__)
def test_etcd_meets_the_contract(agents, check):
    array, members = f"contract{next(_n)}", itertools.cycle(range(3))
    check(lambda: agents(next(members), array))


@pytest.mark.parametrize("check", FORGERY_CHECKS, ids=lambda f: f.__name__)
def test_etcd_binds_decisions_as_the_contract_says(etcd, agents, check):
    array, members = f"forged{next(_n)}", itertools.cycle(range(3))
    check(lambda: agents(next(members), array), Forger(etcd, array))


def test_lease_ttl_of_one_second_is_granted(agents):
    """etcd's minimum TTL is 1.5 election timeouts, rounded up to a second."""
    a = agents(0, f"ttl{next(_n)}")
    a.join("a", {})
    granted = a.call("granted_ttl_s")
    print(f"\nheartbeat {HEARTBEAT_MS} ms, election {ELECTION_MS} ms: TTL 1 s -> {granted} s")
    assert granted == 1


def test_concurrent_campaigns_elect_one_leader(agents):
    """Three appliances in three namespaces campaign at the same moment, 20 times."""
    array = f"race{next(_n)}"
    cs = [agents(i, array) for i in range(3)]
    for i, c in enumerate(cs):
        c.join(f"a{i}", {})
    winners = set()
    for n in range(20):
        for c in cs:
            c.send("campaign", f"vg{n}")
        won = [c.receive() for c in cs]
        assert len([w for w in won if w]) == 1, won
        winners |= {w["appliance"] for w in won if w}
    print(f"\n20 races won by {sorted(winners)}")


def _first_campaign(contenders: list[Agent], resource: str, within_s: float):
    """Campaign in turn until one wins: (winner, its leadership, seconds)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        for c in contenders:
            got = c.campaign(resource)
            if got is not None:
                return c, got, time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"no new leader within {within_s} s")


def test_a_dead_leaders_successor_within_2_s(agents):
    array = f"failover{next(_n)}"
    a, b, c = agents(0, array), agents(1, array), agents(2, array)
    for x, name in ((a, "a"), (b, "b"), (c, "c")):
        x.join(name, {})
    first = a.campaign("vg0")
    assert first is not None and b.campaign("vg0") is None
    time.sleep(0.6)  # a few refreshes: its lease is alive on its own
    assert b.leader("vg0") == first
    a.kill()  # the process dies: nothing refreshes its lease
    t0 = time.monotonic()
    _, second, _ = _first_campaign([b, c], "vg0", within_s=5.0)
    took = time.monotonic() - t0
    print(f"\nleader killed -> {second.appliance} leads after {took:.2f} s (TTL 1 s)")
    assert second.epoch > first.epoch
    assert [x.campaign("vg0") for x in (b, c)].count(None) == 1
    assert took < FAILOVER_BOUND_S


def test_a_stalled_leader_is_fenced_by_the_engine(agents):
    array = f"fence{next(_n)}"
    a, b = agents(0, array), agents(1, array)
    a.join("a", {})
    b.join("b", {})
    first = a.campaign("vg0")
    assert first is not None and a.publish_decisions("vg0", first.epoch, {"c": 1})
    a.call("refreshing", False)  # a stalls (a long pause): its lease runs out
    _, second, _ = _first_campaign([b], "vg0", within_s=5.0)
    assert b.publish_decisions("vg0", second.epoch, {"c": 2})
    # a wakes up and publishes what it computed: the engine refuses it
    assert not a.publish_decisions("vg0", first.epoch, {"c": 99})
    with pytest.raises(LeaseLost):  # and its next refresh tells it why
        a.refresh()
    a.join("a", {})  # even with a live lease again, its epoch is refused
    assert not a.publish_decisions("vg0", first.epoch, {"c": 99})
    got = a.decisions("vg0")
    assert got is not None and (got.epoch, dict(got.payload)) == (second.epoch, {"c": 2})


def _until(fn, within_s: float, what: str):
    deadline = time.monotonic() + within_s
    while True:
        try:
            got = fn()
            if got:
                return got
        except LeaseLost:
            raise
        except EngineUnavailable:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within_s} s")
        time.sleep(0.1)


def test_a_partitioned_member_fails_fast_and_the_majority_works(fresh_etcd):
    array = "part"
    a, b, c = (Agent(fresh_etcd, i, array) for i in range(3))
    for x, name in ((a, "a"), (b, "b"), (c, "c")):
        x.join(name, {})
    assert c.campaign("vg0") is not None
    fresh_etcd.link(2, up=False)
    for call in (c.snapshot, c.refresh, lambda: c.publish_samples({"seq": 2})):
        with pytest.raises(EngineUnavailable) as e:
            call()
        print(f"\npartitioned: {c.last_s:.2f} s: {e.value}")
        assert c.last_s < FAIL_FAST_S
    a.publish_samples({"seq": 1})
    # c's lease ends in the majority: it no longer leads, b may
    _until(lambda: b.campaign("vg0"), 10.0, "b leads after c's lease ended")
    assert "c" not in b.snapshot().appliances
    fresh_etcd.link(2, up=True)
    with pytest.raises(LeaseLost):
        _until(c.refresh, 10.0, "c's member back")
    c.join("c", {})
    assert {m.appliance for m in a.appliances()} == {"a", "b", "c"}


def test_a_lost_quorum_fails_fast_and_recovers(fresh_etcd):
    a = Agent(fresh_etcd, 0, "quorum")
    a.join("a", {})
    fresh_etcd.stop(1)
    fresh_etcd.stop(2)
    for call in (a.snapshot, a.refresh, lambda: a.campaign("vg0")):
        with pytest.raises(EngineUnavailable) as e:
            call()
        print(f"\nno quorum: {a.last_s:.2f} s: {e.value}")
        assert a.last_s < FAIL_FAST_S
    fresh_etcd.start(1)  # a majority again (its data dir is kept)
    _until(lambda: a.snapshot() is not None, 20.0, "the cluster back")
    a.join("a", {})
    assert a.campaign("vg0") is not None


def test_an_etcd_leader_change_keeps_the_appliances_leases(fresh_etcd):
    """etcd's new raft leader renews every lease on taking over: losing the etcd
    leader stalls the appliances for an election, but nobody loses a lease."""
    probe = Agent(fresh_etcd, 0, "raft")
    lead = int(probe.call("etcd_leader").split(":")[0].rsplit(".", 1)[1]) - 1
    probe.kill()
    x, y = (Agent(fresh_etcd, i, "raft") for i in range(3) if i != lead)
    x.join("x", {})
    y.join("y", {})
    first = x.campaign("vg0")
    assert first is not None
    time.sleep(0.6)
    fresh_etcd.stop(lead)
    t0 = time.monotonic()
    _until(lambda: x.snapshot(), 10.0, "the majority answers again")
    print(f"\netcd leader killed: the appliances wait {time.monotonic() - t0:.2f} s")
    time.sleep(1.5)  # more than a TTL: a lease the new leader did not renew would end
    x.refresh()
    y.refresh()
    assert x.leader("vg0") == first
    assert {m.appliance for m in y.appliances()} == {"x", "y"}


def test_a_payload_over_etcds_request_limit_is_engine_unavailable(agents):
    a = agents(0, f"big{next(_n)}")
    a.join("a", {})
    writes = [["vg0", f"10.1.{n // 250}.{n % 250}", 1e6] for n in range(50_000)]
    with pytest.raises(EngineUnavailable) as e:  # 1.7 MB of JSON
        a.publish_samples({"writes": writes})
    print(f"\n50,000 write records: {e.value}")
    assert "too large" in str(e.value)
    a.publish_samples({"seq": 1})  # the lease and the connection are fine
