"""The daemon with [groups.NAME] (appliance/daemon/core/grouping.py), in virtual time with the
fakes of test_daemon.py: the sensors' IoSamples reach the groups, whose classes the
actuator gets; a reload with a host that does not resolve keeps the running groups; on
a target host, the real TargetSensor's samples and initiator names."""

from __future__ import annotations

from pathlib import Path

import pytest

from santhrottle.appliance.config import parse_config
from santhrottle.appliance.daemon.core import grouping
from santhrottle.appliance.daemon.core.groupmap import GroupMapError
from santhrottle.appliance.daemon.core.loop import CommandError
from santhrottle.appliance.sensing.conns import TcpConn
from santhrottle.appliance.sensing.diskstats import parse_diskstats
from santhrottle.appliance.sensing.lio import LioAcl, LioLun, LioTpg
from santhrottle.appliance.sensing.target import TargetSensor
from santhrottle.controller.domain import IoSample
from tests.unit.test_config_groups import BRIDGE
from tests.unit.test_daemon import CONF, NoGroupSensing, make, run_for, status_of
from tests.unit.test_sensing import FakeConns

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


class GroupSensors(NoGroupSensing):
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

    def utilization_samples(self):
        return self.inner.utilization_samples()

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
    rows = {r["group"]: r for r in status_of(d)["groups"]}
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
    # no group names resources: those its members load (vg1's initiator is in none);
    # vg2 has only backup, without a target: nothing to arbitrate, its PID keeps it
    assert grouping.grouped_resources(cfg, {"vg0", "vg1", "vg2"}, group_of, loads) == {"vg0"}
    assert grouping.grouped_resources(cfg, {"vg0"}, group_of, loads) == {"vg0"}  # known only
    only = parse_config(
        BRIDGE
        + CONF
        + '[groups.db]\nmembers = ["10.0.0.2"]\nresources = ["vg1", "vg9"]\n'
        + 'latency_target = "10ms"\n'
    )
    assert grouping.grouped_resources(only, {"vg0", "vg1"}, group_of, loads) == {"vg1"}
    assert grouping.grouped_resources(parse_config(CONF), {"vg0"}, group_of, loads) == set()
    # without a target there is nothing to arbitrate: the resources keep their PID
    none = parse_config(BRIDGE + CONF + '[groups.db]\nmembers = ["10.0.0.2"]\n')
    assert grouping.grouped_resources(none, {"vg0", "vg1", "vg2"}, group_of, loads) == set()
    lv = parse_config(BRIDGE + CONF + '[groups.db]\nmembers = ["10.0.0.2"]\niops_levels = [5]\n')
    assert grouping.grouped_resources(lv, {"vg0", "vg1", "vg2"}, group_of, loads) == set()
    assert grouping.level_resources(lv, group_of, loads) == {"vg0"}


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


# -- a target host ----------------------------------------------------------------------

LAB = Path(__file__).parents[1] / "fixtures" / "lab"  # its sysfs: labvg = dm-0, dm-1, dm-2
DB_IQN = "iqn.2024-01.com.example:db1"
TARGET_GROUPS = f"""
[datapath]
devices = ["eth1"]
[controller]
class_hysteresis = 0
[resources.labvg]
threshold = "10ms"

[groups.db]
members = ["{DB_IQN}"]
latency_target = "10ms"
priority = 2

[groups.backup]
members = ["10.0.0.0/24"]
"""


class LabDiskstats:
    """/proc/diskstats at the daemon's virtual time: the db host reads lun1 (dm-1), 50
    reads/s at 20 ms; the backup host writes lun0 (dm-0), 450 writes/s of 128 KiB at
    20 ms (nine times the reader's IOs outstanding)."""

    def __init__(self, vt) -> None:
        self.vt = vt

    def snapshot(self, devices=None):  # DiskstatsReader.snapshot(): every device
        t = self.vt.now - 1000.0
        r, w = int(50 * t), int(450 * t)
        return parse_diskstats(
            f"253 0 dm-0 0 0 0 0 {w} 0 {w * 256} {w * 20} 0 {w * 20} {w * 20}\n"
            f"253 1 dm-1 {r} 0 {r * 8} {r * 20} 0 0 0 0 0 {r * 20} {r * 20}\n"
            "253 2 dm-2 0 0 0 0 0 0 0 0 0 0 0\n"
        )


def test_a_target_host_groups_an_initiator_by_the_iqn_it_logged_in_with(tmp_path):
    """Target mode, the real TargetSensor: the db host 10.0.0.3 has an explicit LIO ACL
    as iqn.2024-01.com.example:db1 (lun1), the backup host 10.0.0.4 uses lun0 through
    generated ACLs. 10.0.0.3 is in 10.0.0.0/24 too, but its name puts it in db; the
    samples of its device reach its group, which sees the 20 ms its reads take."""
    d, vt, _s, act = make(TARGET_GROUPS)
    assert not d.config.bridge_mode
    acl = LioAcl(DB_IQN, ("10.0.0.3",), (0,), {0: 0}, {0: 0}, {0: 0})
    tpgs = [
        LioTpg("iscsi", "iqn.t:lun0", 1, True, True, (("10.0.0.11", 3260),),
               (LioLun(0, "block/lun0", "/dev/labvg/lun0"),), ()),
        LioTpg("iscsi", "iqn.t:lun1", 1, True, False, (("10.0.0.12", 3260),),
               (LioLun(0, "block/lun1", "/dev/labvg/lun1"),), (acl,)),
    ]  # fmt: skip
    sensor = TargetSensor(
        proc_root=tmp_path,
        sys_root=LAB / "sys",
        configfs_root=tmp_path / "no-configfs",
        debugfs_root=tmp_path / "no-debugfs",
        clock=vt.clock,
        connections=FakeConns([TcpConn("10.0.0.11", 3260, "10.0.0.4", 40000)]),
    )
    sensor.lio = type("Lio", (), {"last_skipped": (), "scan": lambda self: tpgs})()
    sensor.diskstats = LabDiskstats(vt)
    d.sensors = sensor
    run_for(d, vt, 8.0)
    assert sensor.initiator_names() == {"10.0.0.3": (DB_IQN,)}
    assert sensor.io_resources == {"labvg"}  # asked for by the groups' refresh
    assert d.ctl.grouped == frozenset({"labvg"})
    assert d.ctl.groups.group_of == {"10.0.0.3": "db", "10.0.0.4": "backup"}
    groups = d.ctl.groups.resources["labvg"].groups
    assert groups["db"].members == {"10.0.0.3"}
    assert groups["db"].latency_s == pytest.approx(0.020)  # its reads', undelayed
    assert groups["db"].y == pytest.approx(0.5)  # 10 ms target, 20 ms seen
    assert groups["backup"].delay_class > 0 and groups["db"].delay_class == 0
    assert act.kernel["10.0.0.4"][0] == groups["backup"].delay_class
    assert "10.0.0.3" not in act.kernel


def test_a_daemon_without_groups_asks_the_target_sensor_for_no_samples(tmp_path):
    d, vt, _s, _act = make()
    sensor = TargetSensor(proc_root=tmp_path, sys_root=LAB / "sys",
                          configfs_root=tmp_path / "none", clock=vt.clock,
                          connections=FakeConns([]))  # fmt: skip
    sensor.want_io_samples(["labvg"])
    sensor.diskstats = LabDiskstats(vt)
    d.sensors = sensor
    run_for(d, vt, 3.0)
    assert sensor.io_resources == frozenset() and sensor.io_samples == []


def test_io_samples_are_scaled_to_one_convergence():
    """A sensor whose convergence covered 1.25 s hands counts of 1.25 s: scaled to the
    1 s the controller reads them as; the latencies stay."""

    got = [IoSample("vg0", "10.0.0.3", 125.0, 125.0 * 4096, 25.0, 0.02, 0.03)]
    (one,) = grouping.io_samples(got, 1.25, 1.0)
    assert (one.ios, one.bytes, one.reads) == pytest.approx((100.0, 100.0 * 4096, 20.0))
    assert (one.read_latency_s, one.latency_s) == (0.02, 0.03)
    # a sensor that does not say what they cover: as they are
    assert grouping.io_samples(got, None, 1.0) == got
