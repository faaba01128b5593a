"""The daemon with [groups.NAME] (appliance/daemon/grouping.py), in virtual time with the
fakes of test_daemon.py: the sensors' IoSamples reach the groups, whose classes the
actuator gets; a reload with a host that does not resolve keeps the running groups."""

from __future__ import annotations

import pytest

from santhrottle.appliance.config import parse_config
from santhrottle.appliance.daemon import grouping
from santhrottle.appliance.daemon.groupmap import GroupMapError
from santhrottle.appliance.daemon.loop import CommandError
from santhrottle.controller.domain import IoSample
from tests.unit.test_daemon import CONF, make, run_for

BRIDGE = """
[daemon]
mode = "bridge"
[bridge]
initiator_port = "eth1"
array_port = "eth2"
"""
GROUPS = (
    BRIDGE
    + CONF
    + """
[groups.db]
members = ["10.0.0.2"]
latency_target = "10ms"
priority = 2

[groups.backup]
members = ["10.0.0.0/24"]
priority = 1
"""
)


class GroupSensors:
    """The fake sensors plus the wire's IoSamples: a reader 10.0.0.2 that sees 20 ms and a
    writer 10.0.0.3 with nine times its IOs outstanding."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.inner.writers = {"10.0.0.3": "vg0", "10.0.0.2": "vg0"}
        self.io_samples: list[IoSample] = []

    def read_samples(self):
        return self.inner.read_samples()

    def device_samples(self):
        return self.inner.device_samples()

    def converge(self):
        out = self.inner.converge()
        lat = 0.020
        self.io_samples = [
            IoSample("vg0", "10.0.0.2", 1 / lat, 4096 / lat, 1 / lat, lat, lat),
            IoSample("vg0", "10.0.0.3", 9 / lat, 131072 * 9 / lat, 0.0, None, lat),
        ]
        return out


def test_groups_reach_the_controller_and_the_actuator():
    d, vt, s, act = make(GROUPS)
    d.sensors = GroupSensors(s)
    run_for(d, vt, 6.0)
    assert d.ctl.grouped == frozenset({"vg0"})
    assert d.ctl.groups.group_of == {"10.0.0.2": "db", "10.0.0.3": "backup"}
    groups = d.ctl.groups.resources["vg0"].groups
    assert groups["db"].y == pytest.approx(0.5)  # 10 ms target, 20 ms seen
    assert groups["backup"].delay_class > 0 and groups["db"].delay_class == 0
    assert act.kernel["10.0.0.3"][0] == groups["backup"].delay_class  # the group's class
    assert "10.0.0.2" not in act.kernel  # db is never delayed
    rows = {r["group"]: r for r in d.status()["groups"]}
    assert rows["db"]["latency_target_s"] == 0.010 and rows["db"]["members"] == ["10.0.0.2"]
    assert rows["backup"]["delay_class"] == groups["backup"].delay_class
    assert rows["backup"]["pwfte"] == pytest.approx(groups["backup"].pwfte)


def test_without_groups_nothing_is_grouped():
    d, vt, s, _act = make()
    d.sensors = GroupSensors(s)
    run_for(d, vt, 3.0)
    assert d.ctl.grouped == frozenset() and not d.ctl.groups.resources and not d.ctl.ios


def test_a_reload_whose_host_does_not_resolve_keeps_the_running_groups(tmp_path, monkeypatch):
    def resolve(name):  # no resolver is asked: the test sends nothing
        if name == "backup1.lab":
            return ["10.0.0.3"]
        raise GroupMapError(f"host {name!r} does not resolve")

    monkeypatch.setattr(grouping, "resolve_host", resolve)
    conf = GROUPS + '\n[groups.hosts]\nmembers = ["backup1.lab"]\n'
    path = tmp_path / "s.toml"
    path.write_text(conf)
    d, _vt, _s, _act = make(conf, load_config=lambda p: parse_config(path.read_text(), str(p)))
    assert d.group_map.group_of("10.0.0.3") == "hosts"  # resolved at the start
    running = d.group_map
    path.write_text(conf + '\n[groups.x]\nmembers = ["gone.lab"]\n')
    with pytest.raises(CommandError, match=r"gone\.lab"):
        d.reload()
    assert d.group_map is running and "x" not in d.config.groups


def test_grouped_resources_follow_the_groups_resources():
    cfg = parse_config(GROUPS)
    group_of = {"10.0.0.2": "db", "10.0.0.3": "backup"}
    loads = {"10.0.0.2": {"vg0"}, "10.0.0.3": {"vg0", "vg2"}, "10.0.1.9": {"vg1"}}
    # no group names resources: those its members load (vg1's initiator is in none)
    assert grouping.grouped_resources(cfg, {"vg0", "vg1", "vg2"}, group_of, loads) == {
        "vg0",
        "vg2",
    }
    assert grouping.grouped_resources(cfg, {"vg0"}, group_of, loads) == {"vg0"}  # known only
    only = parse_config(
        BRIDGE + CONF + '[groups.db]\nmembers = ["10.0.0.2"]\nresources = ["vg1", "vg9"]\n'
    )
    assert grouping.grouped_resources(only, {"vg0", "vg1"}, group_of, loads) == {"vg1"}
    assert grouping.grouped_resources(parse_config(CONF), {"vg0"}, group_of, loads) == set()


def test_a_grouped_resource_needs_no_threshold():
    """The lab's case: a resource with groups and no threshold is controlled for its
    groups (its PID only observes: math.inf), and its writer still gets the class."""
    d, vt, s, act = make(GROUPS.replace('threshold = "10ms"\n', ""))
    d.sensors = GroupSensors(s)
    run_for(d, vt, 6.0)
    assert d.ctl.grouped == frozenset({"vg0"})
    assert d.ctl.resources["vg0"].resource.threshold_s == float("inf")
    assert act.kernel["10.0.0.3"][0] == d.ctl.groups.resources["vg0"].groups["backup"].delay_class
    assert act.kernel["10.0.0.3"][0] > 0
    ungrouped = make(CONF.replace('threshold = "10ms"\n', ""))[0]
    ungrouped.sensors = GroupSensors(s)
    ungrouped._reconcile_resources()
    assert not ungrouped.ctl.resources  # without groups: observed, as before
