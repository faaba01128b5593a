"""make lab-faults' orphan check (vagrant/experiments/faults_measure.py): a member counts
as an orphan only while the kernel delays its packets and the daemon wants none.

Before, every member of a mode set that the daemon's status did not show delayed was an
orphan, one riding a glide leaf whose delay was already 0 too (its traffic never paused
for the hand-off: docs/datapath.md), so a lab guest slow enough that the writers never
paused reported three orphans the kernel did not delay."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

MEASURE = Path(__file__).resolve().parents[2] / "vagrant" / "experiments" / "faults_measure.py"

IPSET_SAVE = """\
create santhrottle-all hash:ip family inet hashsize 1024 maxelem 65536 counters skbinfo
add santhrottle-all 10.0.0.3 packets 12 bytes 3000 skbprio 5374:6000
add santhrottle-all 10.0.0.4 packets 1 bytes 60 skbprio 5374:6001
add santhrottle-all 10.0.0.5 packets 1 bytes 60 skbprio 5374:4
add santhrottle-all 10.0.0.6 packets 1 bytes 60
add santhrottle-ack 10.0.0.7 skbprio 1:4
create santhrottle-members list:set size 8
add santhrottle-members santhrottle-all
"""
TC_SHOW = """\
qdisc htb 5374: root refcnt 2 r2q 10 default 0 direct_packets_stat 0 direct_qlen 1000
qdisc netem 8001: parent 5374:4 limit 1000 delay 2ms
qdisc netem 8002: parent 5374:6000 limit 1000
qdisc netem 8003: parent 5374:6001 limit 1000 delay 500us
qdisc pfifo 8004: parent 5374:5 limit 1000p
"""


@pytest.fixture(scope="module")
def fm():
    import sys

    sys.path.insert(0, str(MEASURE.parent))  # its siblings, as the lab runs it
    try:
        spec = importlib.util.spec_from_file_location("santhrottle_faults_measure", MEASURE)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(MEASURE.parent))
    return mod


def test_each_members_leaf_and_whether_it_delays(fm):
    assert fm.member_minors(IPSET_SAVE) == {
        "10.0.0.3": 0x6000,
        "10.0.0.4": 0x6001,
        "10.0.0.5": 0x4,
        "10.0.0.6": 0,  # no skbprio: HTB's direct queue
        "10.0.0.7": 0,  # another tree's
    }
    assert fm.delaying_leaves(TC_SHOW) == {0x4, 0x6001}  # netem prints no delay at 0


def test_a_member_riding_a_leaf_at_0_is_no_orphan_one_delayed_is(fm):
    members = {"10.0.0.3", "10.0.0.4", "10.0.0.5"}
    kernel = {"10.0.0.4", "10.0.0.5"}  # 10.0.0.3 rides a glide leaf at 0 ms
    daemon = {"10.0.0.5"}
    readings = [(members, kernel, daemon)] * 3
    assert fm.orphans_of(readings) == (["10.0.0.4"], [], ["10.0.0.3"])
    # one reading that does not show it (a hand-off caught in passing): none
    assert fm.orphans_of([*readings, (members, {"10.0.0.5"}, daemon)])[0] == []
    # the daemon delays one the kernel has no member for: missing
    assert fm.orphans_of([(set(), set(), {"10.0.0.9"})])[1] == ["10.0.0.9"]
    assert fm.orphans_of([]) == ([], [], [])
