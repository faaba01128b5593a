"""One behaviour suite for every Coordinator (fleet/engine.py): the fake and the real.

Each check takes `new`, a factory of fresh, not yet joined coordinators on one
array of their own (every call of `new` in one check: the same array), and
states what the interface promises.  FORGERY_CHECKS also take a Forger: it
writes straight into the engine under the array's prefix, as anyone with write
access to it could (the fake's engine; etcdctl on the real cluster).
tests/unit/test_fleet_fake.py runs them on FakeCoordinator,
tests/privileged/test_fleet_etcd.py on EtcdCoordinator against a 3-member etcd
cluster: the fake is equivalent where it matters.  No check waits for a lease
to expire (the fake's clock is not the engine's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pytest

from santhrottle.appliance.fleet.engine import Coordinator, LeaseLost

New = Callable[[], Coordinator]


class Forger(Protocol):
    def put(self, key: str, value: dict[str, Any], lease: int = 0) -> None:
        """Put value (as JSON) at the array's prefix + key, under lease (0: none)."""
        ...

    def delete(self, key: str) -> None: ...


def joined(new: New, *names: str) -> list[Coordinator]:
    out = []
    for name in names:
        c = new()
        c.join(name, {"name": name})
        out.append(c)
    return out


def check_join_and_appliances(new: New) -> None:
    a, b = joined(new, "a", "b")
    assert a.appliance == "a"
    assert {m.appliance: dict(m.info) for m in b.appliances()} == {
        "a": {"name": "a"},
        "b": {"name": "b"},
    }
    a.refresh()
    a.leave()
    a.leave()  # idempotent
    assert [m.appliance for m in b.appliances()] == ["b"]


def check_one_leader_per_resource(new: New) -> None:
    cs = joined(new, "a", "b", "c")
    won = [c.campaign("vg0") for c in cs]
    leaders = [w for w in won if w is not None]
    assert len(leaders) == 1 and leaders[0].appliance == "a"
    assert cs[2].leader("vg0") == leaders[0]
    assert cs[0].campaign("vg0") == leaders[0]  # campaigning again: the same leadership
    other = cs[1].campaign("vg1")
    assert other is not None and other.appliance == "b" and other.epoch > leaders[0].epoch
    assert cs[0].leader("nothing") is None


def check_leave_hands_over_at_once(new: New) -> None:
    a, b = joined(new, "a", "b")
    first = a.campaign("vg0")
    assert first is not None and b.campaign("vg0") is None
    a.leave()
    assert b.leader("vg0") is None
    second = b.campaign("vg0")
    assert second is not None and second.appliance == "b" and second.epoch > first.epoch


def check_decisions_are_fenced_by_epoch(new: New) -> None:
    a, b = joined(new, "a", "b")
    first = a.campaign("vg0")
    assert first is not None
    assert a.publish_decisions("vg0", first.epoch, {"classes": {"h1": 3}})
    got = b.decisions("vg0")
    assert got is not None and (got.epoch, got.appliance) == (first.epoch, "a")
    assert dict(got.payload) == {"classes": {"h1": 3}}
    assert not b.publish_decisions("vg0", first.epoch, {"classes": {}})  # not b's leadership
    a.leave()
    assert b.decisions("vg0") is None  # the leader's decisions went with its lease
    with pytest.raises(LeaseLost):
        a.publish_decisions("vg0", first.epoch, {"classes": {"h1": 9}})
    second = b.campaign("vg0")
    assert second is not None
    a.join("a", {"name": "a"})  # back, with a new lease: its old epoch is refused
    assert not a.publish_decisions("vg0", first.epoch, {"classes": {"h1": 9}})
    assert not a.publish_decisions("vg0", second.epoch, {"classes": {"h1": 9}})
    assert b.publish_decisions("vg0", second.epoch, {"classes": {"h1": 5}})
    snap = a.snapshot()
    current = snap.current("vg0")
    assert current is not None and current.epoch == second.epoch
    assert dict(current.payload) == {"classes": {"h1": 5}}


def check_resign(new: New) -> None:
    a, b = joined(new, "a", "b")
    lead = a.campaign("vg0")
    assert lead is not None and a.publish_decisions("vg0", lead.epoch, {"x": 1})
    assert not b.resign("vg0")
    assert a.resign("vg0")
    assert b.leader("vg0") is None and b.decisions("vg0") is None
    assert not a.publish_decisions("vg0", lead.epoch, {"x": 2})
    assert b.campaign("vg0") is not None


def check_samples_and_snapshot(new: New) -> None:
    a, b = joined(new, "a", "b")
    a.publish_samples({"seq": 1, "reads": [["vg0", 3, 0.004, None, None]]})
    b.publish_samples({"seq": 7})
    b.publish_samples({"seq": 8})
    assert a.samples() == {
        "a": {"seq": 1, "reads": [["vg0", 3, 0.004, None, None]]},
        "b": {"seq": 8},
    }
    lead = b.campaign("vg0")
    assert lead is not None and b.publish_decisions("vg0", lead.epoch, {"c": 1})
    snap = a.snapshot()
    assert set(snap.appliances) == {"a", "b"} and set(snap.samples) == {"a", "b"}
    assert snap.leaders == {"vg0": lead}
    assert snap.current("vg0") is not None and snap.current("other") is None
    later = a.snapshot()
    assert later.revision >= snap.revision
    b.leave()
    gone = a.snapshot()
    assert gone.revision > snap.revision
    assert set(gone.samples) == {"a"} and not gone.leaders and not gone.decisions


def check_without_a_lease(new: New) -> None:
    c = new()
    assert c.appliance is None
    for call in (
        c.refresh,
        lambda: c.campaign("vg0"),
        lambda: c.publish_samples({}),
        lambda: c.publish_decisions("vg0", 5, {}),
        lambda: c.resign("vg0"),
    ):
        with pytest.raises(LeaseLost):
            call()
    c.leave()  # nothing to leave: no error
    assert c.snapshot().appliances == {}


def check_bad_names(new: New) -> None:
    (a,) = joined(new, "a")
    for bad in ("", "x/y"):
        with pytest.raises(ValueError):
            a.campaign(bad)
    with pytest.raises(ValueError):
        new().join("a/b", {})


CHECKS = [
    check_join_and_appliances,
    check_one_leader_per_resource,
    check_leave_hands_over_at_once,
    check_decisions_are_fenced_by_epoch,
    check_resign,
    check_samples_and_snapshot,
    check_without_a_lease,
    check_bad_names,
]


def check_a_decision_is_current_only_when_its_leader_wrote_it(new: New, forge: Forger) -> None:
    """The engine's records bind a decision to its leader, never the value's numbers."""
    a, b = joined(new, "a", "b")
    lead = a.campaign("vg0")
    assert lead is not None and lead.lease == a.lease and a.lease is not None
    assert a.publish_decisions("vg0", lead.epoch, {"seq": 1})
    snap = b.snapshot()
    got = snap.current("vg0")
    assert got is not None and got.lease == snap.leaders["vg0"].lease == lead.lease
    assert got.revision > lead.epoch
    # put by hand, with the leader's epoch and a huge seq, without its lease
    huge = {"epoch": lead.epoch, "appliance": "a", "payload": {"seq": 10**12}}
    forge.put("decisions/vg0", huge)
    snap = b.snapshot()
    assert snap.decisions["vg0"].lease == 0 and snap.current("vg0") is None
    assert a.publish_decisions("vg0", lead.epoch, {"seq": 2})  # the leader's next write
    got = b.snapshot().current("vg0")
    assert got is not None and dict(got.payload) == {"seq": 2}
    # the leader key deleted by hand: campaigning again (the same lease) is a new
    # epoch, and the decision of the old one is not current under it
    forge.delete("leader/vg0")
    again = a.campaign("vg0")
    assert again is not None and again.epoch > lead.epoch and again.lease == lead.lease
    snap = b.snapshot()
    assert snap.decisions["vg0"].lease == lead.lease and snap.current("vg0") is None
    assert a.publish_decisions("vg0", again.epoch, {"seq": 3})
    got = b.snapshot().current("vg0")
    assert got is not None and dict(got.payload) == {"seq": 3}
    # what an etcd without access control cannot tell apart: a put under the
    # leader's own lease is current, until the leader writes again
    forge.put("decisions/vg0", huge, lease=lead.lease)
    got = b.snapshot().current("vg0")
    assert got is not None and dict(got.payload) == {"seq": 10**12}
    assert a.publish_decisions("vg0", again.epoch, {"seq": 4})
    got = b.snapshot().current("vg0")
    assert got is not None and dict(got.payload) == {"seq": 4}


def check_a_leader_key_put_by_hand_is_nobodys_leadership(new: New, forge: Forger) -> None:
    """Without a lease it would never end: a campaign replaces it, at a new epoch."""
    a, b = joined(new, "a", "b")
    first = a.campaign("vg0")
    assert first is not None
    forge.put("leader/vg0", {"not": "a name"})  # overwrites a's key: no lease any more
    held = b.snapshot().leaders.get("vg0")
    assert held is None or held.lease == 0  # (a value that is no name is skipped)
    got = b.campaign("vg0")
    assert got is not None and got.appliance == "b" and got.epoch > first.epoch
    assert b.leader("vg0") == got and a.campaign("vg0") is None


FORGERY_CHECKS = [
    check_a_decision_is_current_only_when_its_leader_wrote_it,
    check_a_leader_key_put_by_hand_is_nobodys_leadership,
]
