import re
from pathlib import Path

import pytest

from santhrottle.appliance.config.parse import parse_config
from santhrottle.controller.domain import ControllerConfig
from santhrottle.controller.ladder import Ladder
from santhrottle.sim.scenario import ScenarioError, parse_scenario

PAPER = Path(__file__).parents[2] / "sim" / "scenarios" / "paper.toml"

MINIMAL = """
[run]
duration_s = 10
thresholds_ms = [10]
[[resource]]
name = "vg"
intercept_ms = 2
slope_ms_per_io = 3
[[stream]]
name = "r"
kind = "read"
loop = "open"
rate_kib_per_s = 256
size_kib = 4
resource = "vg"
initiator = "10.0.0.2"
[[stream]]
name = "w"
kind = "write"
loop = "closed"
depth = 2
size_kib = 64
resource = "vg"
initiator = "10.0.0.3"
count = 3
schedule = { start_s = 1, on_s = 2, off_s = 1, cycles = 2 }
[controller]
"""


def test_paper_scenario_parses():
    sc = parse_scenario(PAPER.read_text())
    assert sc.thresholds_s == (0.010, 0.015, 0.020)
    writers = [s for s in sc.streams if s.kind == "write"]
    assert len(writers) == 12 and {s.initiator for s in writers} == {
        "10.0.0.3",
        "10.0.0.4",
        "10.0.0.5",
    }
    reader = next(s for s in sc.streams if s.kind == "read")
    assert reader.rate_iops == pytest.approx(64.0)  # 256 kB/s of 4 kB reads
    assert sc.switch_ons() == [10.0, 35.0, 60.0, 85.0, 110.0]
    assert sc.default_settle_s() == 30.0


def test_minimal_defaults_and_schedule():
    sc = parse_scenario(MINIMAL)
    w = [s for s in sc.streams if s.kind == "write"]
    assert [s.name for s in w] == ["w#0", "w#1", "w#2"]
    assert w[0].schedule.windows(sc.duration_s) == [(1.0, 3.0), (4.0, 6.0)]
    assert sc.controller.ladder == Ladder() and sc.controller.law == "log"
    assert sc.controller == ControllerConfig()  # the daemon's defaults, key for key


def test_controller_and_datapath_are_the_daemons_keys():
    """A scenario's [controller] and [datapath] are santhrottle.toml's: the same text
    gives the same ControllerConfig as the daemon's parser."""
    tables = '[controller]\nti_log = "1s"\nlaw = "paper"\n[datapath]\nstep = "250us"\n'
    sc = parse_scenario(MINIMAL.replace("[controller]\n", tables))
    conf = parse_config(tables + 'devices = ["eth1"]\n')
    assert sc.controller == conf.controller
    assert sc.controller.log_gains.ti_s == 1.0 and sc.controller.ladder.step_s == 0.00025


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("duration_s = 10", ""), "run.duration_s: missing"),
        (("duration_s = 10", "duration_s = -1"), "run.duration_s: must be > 0"),
        (("depth = 2", "depth = 0"), "stream[1].depth: must be > 0"),
        (("depth = 2", 'depth = "2"'), "stream[1].depth: must be a finite number"),
        (('kind = "write"', 'kind = "erase"'), "stream[1].kind: must be one of read, write"),
        (
            ('resource = "vg"\ninitiator = "10.0.0.3"', 'resource = "nope"\ninitiator = "x"'),
            "stream[1].resource: no [[resource]] named 'nope'",
        ),
        (("thresholds_ms = [10]", "thresholds_ms = []"), "run.thresholds_ms"),
        (("[controller]", "[controller]\nkp = 3"), "controller.kp: unknown key"),
        (("slope_ms_per_io = 3", "slope_ms_per_io = 30"), "exceed the device's peak"),
        (
            ("[controller]", '[controller]\nwrite_heavy_leave = "5MiB/s"'),
            "controller.write_heavy_leave: must be below write_heavy_enter",
        ),
        (("cycles = 2", "cycles = 2.5"), "schedule.cycles: must be an integer"),
        (
            ("[controller]", "[controller]\nclass_increase_max_ratio_per_tick = 0.5"),
            "controller.class_increase_max_ratio_per_tick: must be 0 (no limit) or >= 1",
        ),
        (("[controller]", "[controller]\nti_log = 1"), "controller.ti_log: 1 is not a duration"),
        (("[controller]", '[controller]\ndefault_threshold = "9ms"'), "not in a scenario"),
        (("[controller]", '[datapath]\ndevices = ["eth1"]'), "datapath.devices: not in a scenario"),
        (("[controller]", '[datapath]\nstep = "2ms"\nmax_delay = "1ms"'), "datapath.max_delay"),
        (("duration_s = 10", "duration_s = 10\nduration = 3"), "run.duration: unknown field"),
        (("[run]", "[run\n"), "not valid TOML"),
    ],
)
def test_bad_fields_are_named(edit, field):
    old, new = edit
    assert old in MINIMAL
    with pytest.raises(ScenarioError) as e:
        parse_scenario(MINIMAL.replace(old, new, 1))
    assert field in str(e.value)
    assert "\n" not in str(e.value)


def test_the_tick_is_at_least_the_plants_dt():
    text = MINIMAL.replace("duration_s = 10", "duration_s = 10\ndt_s = 0.05")
    with pytest.raises(ScenarioError, match=r"controller.tick: must be at least run.dt_s"):
        parse_scenario(text.replace("[controller]", '[controller]\ntick = "20ms"'))


def test_missing_tables():
    with pytest.raises(ScenarioError, match=r"resource: needs at least one"):
        parse_scenario("[run]\nduration_s = 1\nthresholds_ms = [5]\n")


GROUPS = PAPER.with_name("groups.toml").read_text()


def test_groups_scenario_parses_with_its_changes():
    sc = parse_scenario(GROUPS)
    a, b = sc.groups
    assert b.group.priority == 2.0
    assert a.group.name == "tenant-a" and a.members == ("10.0.1.1",)
    assert a.group.priority == 1.0 and a.group.throughput_target_bps == 25 * 1024 * 1024
    ((at_s, later),) = a.changes
    assert at_s == 70.0 and later.priority == 2.0
    assert later.throughput_target_bps == a.group.throughput_target_bps  # kept
    assert not parse_scenario(PAPER.read_text()).groups


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('name = "tenant-b"', 'name = "tenant-a"'), "group[1].name: duplicate"),
        (('name = "tenant-b"', 'name = "default"'), "reserved group name"),
        (('members = ["10.0.2.1"]', 'members = ["10.9.9.9"]'), "group[1].members"),
        (('members = ["10.0.2.1"]', 'members = ["10.0.1.1"]'), "in one group only"),
        (("priority = 2\n", "priority = 0\n"), "group[1].priority: 0 must be a number within"),
        (
            (
                'throughput_target = "25MiB/s"\nchanges = [{ at_s = 70.0, priority = 1 }]',
                "throughput_target = 25",
            ),
            "group[1].throughput_target: 25 is not a throughput",
        ),
        (("{ at_s = 70.0, priority = 1 }", "{ at_s = 999.0 }"), "changes[0].at_s"),
        (("{ at_s = 70.0, priority = 1 }", "{ at_s = 70.0, colour = 1 }"), "colour: unknown"),
    ],
)
def test_bad_groups_are_named(edit, message):
    old, new = edit
    assert old in GROUPS
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario(GROUPS.replace(old, new))
