"""Operating the initiator groups (issue 20, item 4): the control socket's group commands
(daemon/control/requests.py, daemon/control/group_commands.py), their runtime overrides
(daemon/core/group_overrides.py) in the controller, in the state file across a restart and
across a reload, and the groups' metrics (daemon/status/group_metrics.py); in virtual time
with the fakes of test_daemon.py and test_daemon_groups.py."""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import generate_latest

from santhrottle.appliance.config import parse_config
from santhrottle.appliance.daemon.control.requests import Context, RequestError, check
from santhrottle.appliance.daemon.core import group_overrides as go
from santhrottle.appliance.daemon.core.loop import CommandError
from santhrottle.appliance.daemon.core.state import Saved, StateError, StateStore, decode, encode
from santhrottle.appliance.daemon.status.build import StatusCache
from santhrottle.appliance.daemon.status.metrics import registry_for
from tests.unit.test_daemon import handle, status_of

from .test_daemon import make, run_for
from .test_daemon_groups import GROUPS, GroupSensors

UNSET = {
    "priority": None,
    "latency_target_s": None,
    "throughput_target_bps": None,
    "throughput_target_iops": None,
}
CTX = Context(max_class=100, resources=frozenset({"vg0"}), groups=frozenset({"db", "backup"}))


def grouped(conf: str = GROUPS, seconds: float = 6.0, **kw):
    """A bridge-mode daemon with groups db (10 ms, priority 2) and backup, run `seconds`."""
    d, vt, s, act = make(conf, **kw)
    d.sensors = GroupSensors(s)
    run_for(d, vt, seconds)
    return d, vt, s, act


def group_set(d, group: str = "db", **fields):
    return handle(d, "group_set", {"group": group, **UNSET, **fields})


# ------------------------------------------------------------ request checking
def test_group_requests_good_arguments_are_normalised():
    assert check("group_list", {}) == {}
    assert check("group_show", {"group": "default"}, CTX) == {"group": "default"}
    assert check("group_reset", {"group": "db"}, CTX) == {"group": "db"}
    got = check(
        "group_set",
        {"group": "db", **UNSET, "priority": 4, "latency_target_s": 0.005,
         "throughput_target_iops": 5000},
        CTX,
    )  # fmt: skip
    assert got == {"group": "db", **UNSET, "priority": 4.0, "latency_target_s": 0.005,
                   "throughput_target_iops": 5000.0}  # fmt: skip
    assert type(got["priority"]) is float
    # seconds rounded to whole ns, as threshold_s; bytes/s through the byte-rate Kind
    got = check("group_set", {"group": "db", **UNSET, "latency_target_s": 0.0050000000001,
                              "throughput_target_bps": 2e8}, CTX)  # fmt: skip
    assert got["latency_target_s"] == 0.005 and got["throughput_target_bps"] == 2e8


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("priority", 0, "group_set: priority: 0 must be above 0"),
        ("priority", 5000, "group_set: priority: 5000 must be a number within [0.001, 1000]"),
        ("priority", True, "group_set: priority: true is not a number"),
        ("priority", "2", "group_set: priority: '2' is not a number"),
        ("priority", 10**400, "group_set: priority: 1000000"),  # quoted, cut
        ("latency_target_s", 90, "group_set: latency_target_s: 90 s is above 60s"),
        ("latency_target_s", -0.001, "group_set: latency_target_s: -0.001 must be above 0"),
        ("latency_target_s", "5ms", "'5ms' is not a number of seconds"),
        ("latency_target_s", 1e-12, "1e-12 is below 1ns"),
        ("throughput_target_bps", 0, "throughput_target_bps: 0 must be above 0"),
        ("throughput_target_bps", 1e30, "1e+30 B/s is above 18446744073709551615 B/s"),
        ("throughput_target_iops", 1e10, "must be below 1e+09 iops"),
        ("throughput_target_iops", [5000], "[5000] is not a number of IOs per second"),
    ],
)
def test_group_set_bad_values_are_one_line_naming_the_field(field, value, message):
    with pytest.raises(RequestError) as e:
        check("group_set", {"group": "db", **UNSET, field: value}, CTX)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_group_names_unknown_groups_and_missing_arguments():
    for cmd in ("group_set", "group_reset"):
        with pytest.raises(RequestError, match=rf"{cmd}: group: unknown group 'web'; known: "
                           "backup, db"):  # fmt: skip
            check(cmd, {"group": "web", **(UNSET if cmd == "group_set" else {})}, CTX)
    # "default" has no targets of the file's to override; it can be shown
    with pytest.raises(RequestError, match="unknown group 'default'"):
        check("group_reset", {"group": "default"}, CTX)
    with pytest.raises(RequestError, match=r"group_show: group: '\.\./x' is not a group name"):
        check("group_show", {"group": "../x"})
    with pytest.raises(RequestError, match="group_set: latency_target_s: missing"):
        check("group_set", {"group": "db", "priority": 2, "throughput_target_bps": None,
                            "throughput_target_iops": None})  # fmt: skip
    with pytest.raises(RequestError, match="group_show: unknown argument 'priority'"):
        check("group_show", {"group": "db", "priority": 2})
    no_groups = Context(max_class=100, resources=frozenset({"vg0"}))
    with pytest.raises(RequestError, match=r"known: none \(\[groups.NAME\]"):
        check("group_show", {"group": "db"}, no_groups)


# ------------------------------------------------------------ the commands
def test_group_set_reaches_the_controller_at_once_and_the_next_convergence_uses_it():
    d, vt, _s, _act = grouped()
    db = d.ctl.groups.resources["vg0"].groups["db"]
    assert d.ctl.groups.groups["db"].priority == 2.0 and db.y == pytest.approx(0.5)
    pwfte_before = db.pwfte
    got = group_set(d, priority=4.0, throughput_target_iops=5000.0)
    # the controller's spec now, before any tick
    spec = d.ctl.groups.groups["db"]
    assert (spec.priority, spec.latency_target_s, spec.throughput_target_iops) == (
        4.0, 0.010, 5000.0)  # fmt: skip
    assert got["priority"] == 4.0 and got["throughput_target_iops"] == 5000.0
    assert got["configured"] == {
        "priority": 2.0,
        "latency_target_s": 0.010,
        "throughput_target_bps": None,
        "throughput_target_iops": None,
    }
    assert got["override"] == {"priority": 4.0, "throughput_target_iops": 5000.0}
    assert got["initiators"] == ["10.0.0.2"] and got["configured_members"] == ["10.0.0.2"]
    assert [r["resource"] for r in got["resources"]] == ["vg0"]
    run_for(d, vt, 2.0)
    # 50 IOPS against 5000: y is the worse target's, 0.01; PWFTE = 4 x (1 - 0.01)
    db = d.ctl.groups.resources["vg0"].groups["db"]
    assert db.y == pytest.approx(0.01) and db.pwfte == pytest.approx(4 * 0.99)
    assert db.pwfte > pwfte_before
    rows = {r["group"]: r for r in status_of(d)["groups"]}
    assert rows["db"]["override"] == {"priority": 4.0, "throughput_target_iops": 5000.0}
    assert rows["backup"]["override"] == {}


def test_group_reset_returns_to_the_files_values():
    d, vt, _s, _act = grouped()
    group_set(d, latency_target_s=0.005)
    got = handle(d, "group_reset", {"group": "db"})
    assert got["removed"] == {"latency_target_s": 0.005} and got["override"] == {}
    assert got["latency_target_s"] == 0.010 and d.ctl.groups.groups["db"].latency_target_s == 0.01
    assert d.runtime.group_overrides == {}
    assert handle(d, "group_reset", {"group": "db"})["removed"] is None
    run_for(d, vt, 2.0)
    assert d.ctl.groups.resources["vg0"].groups["db"].y == pytest.approx(0.5)


def test_sets_merge_and_one_throughput_unit_replaces_the_other():
    d, _vt, _s, _act = grouped(seconds=1.0)
    group_set(d, throughput_target_bps=200e6)
    group_set(d, latency_target_s=0.005)
    assert d.runtime.group_overrides["db"] == go.GroupOverride(None, 0.005, (200e6, "B/s"))
    got = group_set(d, throughput_target_iops=5000.0)
    assert got["override"] == {"latency_target_s": 0.005, "throughput_target_iops": 5000.0}
    assert got["throughput_target_bps"] is None  # the file's has none; the B/s one went
    spec = d.ctl.groups.groups["db"]
    assert (spec.throughput_target_bps, spec.throughput_target_iops) == (None, 5000.0)


def test_group_set_refusals_change_nothing():
    d, _vt, _s, _act = grouped(seconds=1.0)
    for args, message in (
        ({"group": "web", **UNSET, "priority": 2}, "unknown group 'web'; known: backup, db"),
        ({"group": "db", **UNSET}, "group_set: nothing to set"),
        ({"group": "db", **UNSET, "throughput_target_bps": 1e8, "throughput_target_iops": 10},
         "one throughput target, in B/s or in IOs/s, not both"),
        ({"group": "default", **UNSET, "priority": 2}, "unknown group 'default'"),
        ({"group": "db", **UNSET, "priority": float("nan")}, "nan is not a finite number"),
    ):  # fmt: skip
        with pytest.raises(CommandError, match=message.replace("(", r"\(")):
            handle(d, "group_set", args)
    assert d.runtime.group_overrides == {} and d.ctl.groups.groups["db"].priority == 2.0


def test_group_list_and_show_answer_every_group_and_default():
    conf = GROUPS.replace('members = ["10.0.0.0/24"]', 'members = ["10.0.0.7"]')
    d, _vt, _s, _act = grouped(conf)  # 10.0.0.3 is now in no group: "default"
    listed = handle(d, "group_list", {})
    assert [g["group"] for g in listed] == ["db", "backup", "default"]
    by = {g["group"]: g for g in listed}
    assert by["backup"]["initiators"] == [] and by["backup"]["resources"] == []
    assert by["default"]["configured"] is None and by["default"]["initiators"] == ["10.0.0.3"]
    assert by["default"]["resources"][0]["delay_class"] > 0  # the writer gives way
    shown = handle(d, "group_show", {"group": "db"})
    assert shown == by["db"]
    json.dumps(listed, allow_nan=False)  # the wire's strict JSON
    with pytest.raises(CommandError, match="unknown group 'nope'"):
        handle(d, "group_show", {"group": "nope"})
    assert d._changes == 0  # read-only: no save, the status cache stays


# ------------------------------------------------------------ lifetime
def test_overrides_survive_a_restart(tmp_path):
    d, _vt, _s, _act = grouped(store=StateStore(tmp_path))
    group_set(d, priority=4.0, throughput_target_bps=150e6)
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["group_overrides"] == {"db": {"priority": 4.0, "throughput_target_bps": 150e6}}
    d2, vt2, s2, _act2 = make(GROUPS, store=StateStore(tmp_path))
    d2.sensors = GroupSensors(s2)
    d2.restore(vt2.now)
    assert d2.runtime.group_overrides == {"db": go.GroupOverride(4.0, None, (150e6, "B/s"))}
    run_for(d2, vt2, 1.0)
    spec = d2.ctl.groups.groups["db"]
    assert (spec.priority, spec.throughput_target_bps, spec.latency_target_s) == (
        4.0, 150e6, 0.010)  # fmt: skip


def test_a_restart_without_the_group_drops_its_override(tmp_path, caplog):
    d, _vt, _s, _act = grouped(store=StateStore(tmp_path))
    group_set(d, "backup", priority=0.5)
    group_set(d, "db", priority=3.0)
    conf = GROUPS.replace("[groups.backup]", "[groups.bulk]")
    d2, vt2, _s2, _act2 = make(conf, store=StateStore(tmp_path))
    with caplog.at_level(logging.WARNING, logger="santhrottled"):
        d2.restore(vt2.now)
    assert set(d2.runtime.group_overrides) == {"db"}
    assert "start: group 'backup' is no longer configured" in caplog.text


def test_a_reload_keeps_the_overrides_of_groups_still_there_and_drops_the_others(tmp_path, caplog):
    path = tmp_path / "s.toml"
    path.write_text(GROUPS)
    d, _vt, _s, _act = grouped(load_config=lambda p: parse_config(path.read_text(), str(p)))
    d.config = parse_config(GROUPS, str(path))
    group_set(d, "db", latency_target_s=0.005)
    group_set(d, "backup", priority=0.5)
    # backup gone, db's file value changed: db's override stays over the new file
    path.write_text(GROUPS.replace("[groups.backup]", "[groups.bulk]").replace('"10ms"', '"20ms"'))
    with caplog.at_level(logging.WARNING, logger="santhrottled"):
        handle(d, "reload", {})
    assert set(d.runtime.group_overrides) == {"db"}
    assert "reload: group 'backup' is no longer configured; its runtime override" in caplog.text
    shown = handle(d, "group_show", {"group": "db"})
    assert shown["latency_target_s"] == 0.005 and shown["configured"]["latency_target_s"] == 0.02
    d.tick(1e9)  # the reload marks the groups for the next tick's refresh
    assert d.ctl.groups.groups["db"].latency_target_s == 0.005
    assert set(d.ctl.groups.groups) == {"db", "bulk"}


def test_state_file_round_trip_and_invalid_overrides():
    s = Saved(group_overrides={"db": go.GroupOverride(2.5, 0.004, (5000.0, "iops"))})
    back = decode(encode(s, 1.0).decode(), 100)
    assert back.group_overrides == s.group_overrides
    for doc, message in (
        ({"db": {"priority": 0}}, "group_overrides: db: priority: 0 must be above 0"),
        ({"db": {"latency_target_s": 120}}, "db: latency_target_s: 120 s is above 60s"),
        ({"db": {"colour": 1}}, "db: unknown field 'colour'"),
        ({"db": {"throughput_target_bps": 1e6, "throughput_target_iops": 5}}, "one or the other"),
        ({"d b": {"priority": 1}}, "'d b' is not a group name"),
        ({"db": [1]}, "db: must be an object"),
        ([1], "group_overrides: must be an object"),
    ):
        text = json.dumps({"version": 1, "group_overrides": doc})
        with pytest.raises(StateError, match=message.replace("(", r"\(")):
            decode(text, 100)


# ------------------------------------------------------------ metrics
def _value(reg, name, **labels):
    for m in reg.collect():
        for s in m.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def test_group_metrics_per_resource_and_group_read_at_scrape_time():
    d, _vt, _s, _act = grouped()
    reg = registry_for(StatusCache(d))
    db, backup = {"resource": "vg0", "group": "db"}, {"resource": "vg0", "group": "backup"}
    g = d.ctl.groups.resources["vg0"].groups
    assert _value(reg, "santhrottle_group_latency_target_seconds", **db) == 0.010
    assert _value(reg, "santhrottle_group_latency_target_seconds", **backup) is None  # unset
    assert _value(reg, "santhrottle_group_latency_seconds", **db) == pytest.approx(0.020)
    assert _value(reg, "santhrottle_group_performance_ratio", **db) == pytest.approx(0.5)
    assert _value(reg, "santhrottle_group_performance_ratio", **backup) is None  # no target
    assert _value(reg, "santhrottle_group_pwfte", **db) == pytest.approx(g["db"].pwfte)
    assert _value(reg, "santhrottle_group_share_ratio", **backup) == pytest.approx(
        g["backup"].share
    )
    assert _value(reg, "santhrottle_group_delay_class", **backup) == g["backup"].delay_class > 0
    assert _value(reg, "santhrottle_group_throughput_bytes_per_second", **db) == pytest.approx(
        4096 / 0.020
    )
    assert _value(reg, "santhrottle_group_iops", **backup) == pytest.approx(450.0)
    assert _value(reg, "santhrottle_group_resource_overloaded", resource="vg0") == 1.0
    assert _value(reg, "santhrottle_group_override", **db) == 0.0
    group_set(d, priority=4.0, throughput_target_bps=1e8)
    assert _value(reg, "santhrottle_group_override", **db) == 1.0
    assert _value(reg, "santhrottle_group_priority", **db) == 4.0
    assert _value(reg, "santhrottle_group_throughput_target_bytes_per_second", **db) == 1e8
    text = generate_latest(reg).decode()
    assert "# TYPE santhrottle_group_pwfte gauge" in text
    assert 'santhrottle_group_delay_seconds{group="backup",resource="vg0"}' in text


def test_without_groups_there_are_no_group_families():
    d, vt, _s, _act = make()
    run_for(d, vt, 2.0)
    assert not [
        m for m in registry_for(StatusCache(d)).collect() if m.name.startswith("santhrottle_group")
    ]
