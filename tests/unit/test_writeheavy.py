import pytest

from santhrottle.controller.writeheavy import WriteHeavySets

MIB = 1024.0 * 1024.0


def sets(tau=8.0):
    return WriteHeavySets(tau, 1.0 * MIB, 0.25 * MIB)


def test_worked_example_from_header():
    s = sets()
    s.observe("vg", "a", 0.9 * MIB, 0.0)
    assert s.converge(0.0).joined == {}
    s.observe("vg", "a", 4.0 * MIB, 1.0)
    assert s.rate("vg", "a") == pytest.approx(1.264 * MIB, rel=1e-3)
    assert s.converge(1.0).joined == {"vg": {"a"}}
    for t in range(2, 7):  # 5 s without samples: it wrote nothing
        change = s.converge(float(t))
        assert change.left == {}
    assert s.rate("vg", "a") == pytest.approx(0.677 * MIB, rel=1e-3)
    assert s.members["vg"] == {"a"}


def test_hovering_writer_does_not_flap():
    # Rate oscillating around the enter threshold, always above leave: one join, no leave.
    s = sets(tau=1.0)
    joins = leaves = 0
    for k in range(60):
        rate = (1.3 if k % 2 else 0.7) * MIB
        s.observe("vg", "a", rate, float(k))
        c = s.converge(float(k))
        joins += len(c.joined.get("vg", ()))
        leaves += len(c.left.get("vg", ()))
    assert (joins, leaves) == (1, 0)


def test_leaves_below_lower_threshold_and_is_forgotten():
    s = sets(tau=1.0)
    s.observe("vg", "a", 10 * MIB, 0.0)
    assert s.converge(0.0).joined == {"vg": {"a"}}
    t = 0.0
    left = False
    while not left:
        t += 1.0
        left = "a" in s.converge(t).left.get("vg", set())
    assert s.rate("vg", "a") < 0.25 * MIB
    assert s.members["vg"] == set() and "a" not in s.member_of
    for _ in range(10):
        t += 1.0
        s.converge(t)
    assert s.rate("vg", "a") is None  # forgotten once negligible


def test_member_of_indexes_both_directions_and_forget_resource():
    s = sets()
    for r in ("vg1", "vg2"):
        s.observe(r, "a", 5 * MIB, 0.0)
    s.converge(0.0)
    assert s.member_of["a"] == {"vg1", "vg2"}
    assert s.forget_resource("vg1") == {"a"}
    assert s.member_of["a"] == {"vg2"}
    assert s.rate("vg1", "a") is None


def assert_split(s, resources=("vg1", "vg2", "vg3")):
    """split() (kept between calls) agrees with the members and multi as they are."""
    for r in resources:
        alone, shared = s.split(r)
        members = s.members.get(r, set())
        assert sorted(alone) == sorted(members - s.multi), r
        assert sorted(shared) == sorted(members & s.multi), r


def test_multi_holds_the_members_of_two_resources_or_more():
    s = sets()
    for r in ("vg1", "vg2", "vg3"):
        s.observe(r, "a", 5 * MIB, 0.0)
    s.observe("vg1", "b", 5 * MIB, 0.0)
    s.converge(0.0)
    assert s.multi == {"a"}
    assert s.split("vg1") == (("b",), ("a",))
    assert_split(s)
    s.forget_resource("vg1")
    assert s.multi == {"a"} and s.member_of["a"] == {"vg2", "vg3"}
    assert_split(s)
    s.forget_resource("vg2")  # a in one set: no longer multi
    assert s.multi == set() and s.member_of == {"a": {"vg3"}}
    assert s.split("vg3") == (("a",), ())
    assert_split(s)
    for t in range(1, 40):  # a stops writing to vg3 and leaves it
        s.observe("vg3", "a", 0.0, float(t))
        s.converge(float(t))
    assert s.member_of == {} and s.multi == set()
    assert s.split("vg3") == ((), ())


def test_split_follows_joins_and_leaves():
    # b joins a second resource (it moves to both splits' shared part) and leaves it
    # again (back to alone in the first): each split asked before, kept, then stale
    s = sets(tau=1.0)
    s.observe("vg1", "b", 5 * MIB, 0.0)
    s.observe("vg2", "c", 5 * MIB, 0.0)
    s.converge(0.0)
    assert (s.split("vg1"), s.split("vg2")) == ((("b",), ()), (("c",), ()))
    s.observe("vg1", "b", 5 * MIB, 1.0)
    s.observe("vg2", "b", 5 * MIB, 1.0)
    s.observe("vg2", "c", 5 * MIB, 1.0)
    s.converge(1.0)
    assert (s.split("vg1"), s.split("vg2")) == (((), ("b",)), (("c",), ("b",)))
    t = 1.0
    while "b" in s.members["vg2"]:  # b stops writing to vg2
        t += 1.0
        s.observe("vg1", "b", 5 * MIB, t)
        s.observe("vg2", "c", 5 * MIB, t)
        s.converge(t)
        assert_split(s)
    assert (s.split("vg1"), s.split("vg2")) == ((("b",), ()), (("c",), ()))


def test_bad_thresholds():
    with pytest.raises(ValueError, match="leave < enter"):
        WriteHeavySets(1.0, 1.0, 2.0)
