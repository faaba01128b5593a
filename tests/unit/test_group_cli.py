"""`santhrottle group list|show|set|reset` and status' groups section (cli/groups.py,
cli/groupview.py): argument checking with the file's Kinds, exit codes, one-line errors,
--json, and the human output; against a bridge-mode daemon with groups (the fakes of
test_daemon.py and test_daemon_groups.py) over a real Unix socket."""

from __future__ import annotations

import json
import re

import pytest

from santhrottle.appliance.cli import groupview
from santhrottle.appliance.cli.common import EXIT_FAILED, EXIT_NO_DAEMON, EXIT_OK, EXIT_USAGE
from santhrottle.appliance.cli.main import main
from santhrottle.appliance.daemon.control import PROTOCOL_VERSION
from santhrottle.appliance.daemon.control.commands import Commands
from santhrottle.appliance.daemon.control.server import ControlServer
from tests.unit.test_daemon import handle

from .test_daemon import make, run_for
from .test_daemon_groups import GROUPS, GroupSensors

LIST_HEAD = (
    "GROUP            PRIO LAT_TARGET    TPUT_TARGET INIS  RESOURCE         LATENCY     MB/s     "
    "IOPS      Y   PWFTE  SHARE CLASS"
)


@pytest.fixture
def live(tmp_path):
    conf = GROUPS.replace('members = ["10.0.0.0/24"]', 'members = ["10.0.0.3"]')
    d, vt, s, _act = make(conf)
    d.sensors = GroupSensors(s)
    run_for(d, vt, 6.0)
    path = str(tmp_path / "control.sock")
    srv = ControlServer(path, Commands(d).handle, 0o600)
    srv.start()
    try:
        yield d, ["--socket", path]
    finally:
        srv.close()


def out_of(capsys, argv) -> tuple[int, str, str]:
    rc = main(argv)
    got = capsys.readouterr()
    return rc, got.out, got.err


def test_group_list_one_line_per_group_and_resource(live, capsys):
    d, sock = live
    rc, out, _ = out_of(capsys, ["group", "list", *sock])
    lines = out.splitlines()
    assert rc == EXIT_OK and lines[0] == LIST_HEAD
    db = d.ctl.groups.resources["vg0"].groups["db"]
    assert re.fullmatch(
        r"db +2 +10\.00ms +- +1  vg0 +20\.00ms +0\.20 +50 +0\.50 +1\.00 +"
        rf"{db.share:.3f} +0",
        lines[1],
    ), lines[1]
    backup = d.ctl.groups.resources["vg0"].groups["backup"]
    assert re.fullmatch(rf"backup +1 +- +- +1  vg0 .* - +0\.00 +{backup.share:.3f} +"
                        rf"{backup.delay_class}", lines[2]), lines[2]  # fmt: skip
    assert len(lines) == 3  # no override: no note


def test_group_set_marks_the_override_and_reset_returns(live, capsys):
    d, sock = live
    rc, out, _ = out_of(capsys, ["group", "set", "db", "--priority", "4",
                                 "--throughput-target", "5000iops", *sock])  # fmt: skip
    assert rc == EXIT_OK
    assert out == (
        "db: priority 4 (file: 2), latency target 10.00ms, throughput target 5000iops "
        "(file: none)\n"
    )
    spec = d.ctl.groups.groups["db"]
    assert (spec.priority, spec.throughput_target_iops) == (4.0, 5000.0)
    _, out, _ = out_of(capsys, ["group", "list", *sock])
    lines = out.splitlines()
    assert re.match(r"db +4\* +10\.00ms +5000iops\* +1  vg0", lines[1]), lines[1]
    assert lines[-1] == groupview.OVERRIDE_NOTE
    rc, out, _ = out_of(capsys, ["group", "set", "db", "--latency-target", "5ms",
                                 "--throughput-target", "200MB/s", *sock])  # fmt: skip
    assert out == (
        "db: priority 4 (file: 2), latency target 5.00ms (file: 10.00ms), throughput target "
        "200.00MB/s (file: none)\n"
    )
    rc, out, _ = out_of(capsys, ["group", "reset", "db", *sock])
    assert rc == EXIT_OK and out == (
        "db: the file's values again: priority 2, latency target 10.00ms, throughput target none\n"
    )
    assert d.runtime.group_overrides == {} and d.ctl.groups.groups["db"].priority == 2.0
    _, out, _ = out_of(capsys, ["group", "reset", "db", *sock])
    assert out.startswith("db: nothing set at run time; priority 2")


def test_group_show_the_whole_of_one_group(live, capsys):
    d, sock = live
    out_of(capsys, ["group", "set", "backup", "--latency-target", "80ms", *sock])
    rc, out, _ = out_of(capsys, ["group", "show", "backup", *sock])
    g = d.ctl.groups.resources["vg0"].groups["backup"]
    lines = out.splitlines()
    assert rc == EXIT_OK
    assert lines[0] == ("group backup: priority 1, latency target 80.00ms (file: none), "
                        "throughput target none")  # fmt: skip
    assert lines[1:4] == [
        "  members (file)    10.0.0.3",
        "  resources (file)  every resource its members load",
        "  initiators now    10.0.0.3",
    ]
    assert lines[4] == "  on vg0 (overloaded: not every group's target can be met)"
    assert lines[5].startswith(f"    latency         {g.latency_s * 1e3:.2f}ms mean, its delay")
    assert lines[6] == "    throughput      58.98 MB/s, 450 IOPS"
    assert lines[7].startswith("    y               - (measured / target")  # no y until measured
    assert lines[9].startswith(f"    share           {g.share:.3f} of the resource's concurrency")
    assert lines[10].startswith(f"    class           {g.delay_class}, delay ")
    assert lines[-1] == "  set at run time; `santhrottle group reset backup` returns to the file's"


def test_group_json_is_the_envelope(live, capsys):
    _d, sock = live
    rc, out, _ = out_of(capsys, ["group", "list", "--json", *sock])
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["protocol"] == PROTOCOL_VERSION
    assert [g["group"] for g in doc["data"]] == ["db", "backup"]
    rc, out, _ = out_of(capsys, ["group", "set", "--json", "db", "--priority", "3", *sock])
    assert json.loads(out)["data"]["override"] == {"priority": 3.0}
    rc, out, _ = out_of(capsys, ["group", "reset", "db", "--json", *sock])
    assert json.loads(out)["data"]["removed"] == {"priority": 3.0}


def test_status_shows_the_groups_section(live, capsys):
    d, sock = live
    out_of(capsys, ["group", "set", "db", "--priority", "3", *sock])
    rc, out, _ = out_of(capsys, ["status", *sock])
    lines = out.splitlines()
    head = lines.index(
        "GROUP            PRIO             TARGET  RESOURCE         LATENCY     MB/s     IOPS "
        "     Y   PWFTE  SHARE CLASS"
    )
    assert rc == EXIT_OK
    assert re.match(r"backup +1 +- +vg0 ", lines[head + 1])
    assert re.match(r"db +3\* +10\.00ms +vg0 +20\.00ms +0\.20 +50 +0\.50 ", lines[head + 2])
    assert lines[head + 3] == groupview.OVERRIDE_NOTE
    handle(d, "group_reset", {"group": "db"})
    _, out, _ = out_of(capsys, ["status", *sock])
    assert groupview.OVERRIDE_NOTE not in out


def test_status_without_groups_has_no_groups_section(tmp_path, capsys):
    d, vt, _s, _act = make()
    run_for(d, vt, 2.0)
    path = str(tmp_path / "c.sock")
    srv = ControlServer(path, Commands(d).handle, 0o600)
    srv.start()
    try:
        rc, out, _ = out_of(capsys, ["status", "--socket", path])
        assert rc == EXIT_OK and "GROUP" not in out
        rc, out, _ = out_of(capsys, ["group", "list", "--socket", path])
        assert out == "no groups: [groups.NAME] in the configuration (docs/groups.md)\n"
        rc, _, err = out_of(capsys, ["group", "show", "db", "--socket", path])
        assert rc == EXIT_FAILED and "unknown group 'db'; known: none" in err
    finally:
        srv.close()


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["group", "set", "web", "--priority", "2"], EXIT_FAILED,
         "santhrottle: group_set: group: unknown group 'web'; known: backup, db"),
        (["group", "show", "web"], EXIT_FAILED, "group_show: group: unknown group 'web'"),
        (["group", "reset", "default"], EXIT_FAILED, "unknown group 'default'"),
        (["group", "set", "db"], EXIT_USAGE,
         "santhrottle: group set db: nothing to set: give --priority, --latency-target or "
         "--throughput-target"),
    ],
)  # fmt: skip
def test_refusals_are_one_line(live, capsys, argv, code, message):
    d, sock = live
    rc, _, err = out_of(capsys, [*argv, *sock])
    assert rc == code and err.count("\n") == 1 and message in err
    assert d.runtime.group_overrides == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--latency-target", "5"], "argument --latency-target: '5' is not a duration"),
        (["--latency-target", "90s"], "argument --latency-target: '90s' is above 60s"),
        (["--latency-target", "0ms"], "argument --latency-target: '0ms' must be above 0"),
        (["--priority", "0"], "argument --priority: '0' must be a number within [0.001, 1000]"),
        (["--priority", "nan"], "argument --priority: 'nan' is not a number"),
        (["--priority", "-1"], "argument --priority: '-1' is not a number"),
        (["--latency-target=-5ms"], "argument --latency-target: '-5ms' is not a duration"),
        (["--throughput-target", "5000"], "argument --throughput-target: '5000' is not a "
                                          "throughput"),
        (["--throughput-target", "0iops"], "'0iops' must be more than 0 iops"),
        (["--throughput-target", "2e9iops"], "'2e9iops' must be below 1e+09 iops"),
    ],
)  # fmt: skip
def test_bad_values_never_reach_the_daemon(argv, message, capsys, tmp_path):
    """The file's Kinds, in the CLI: argparse's error naming the option, exit 2 (the
    socket does not exist: a value that got through would be exit 3)."""
    with pytest.raises(SystemExit) as e:
        main(["group", "set", "db", *argv, "--socket", str(tmp_path / "none.sock")])
    err = capsys.readouterr().err
    assert e.value.code == EXIT_USAGE and message in err.splitlines()[-1]


def test_no_daemon_is_exit_3(tmp_path, capsys):
    for argv in (["group", "list"], ["group", "set", "db", "--priority", "2"]):
        rc, _, err = out_of(capsys, [*argv, "--socket", str(tmp_path / "none.sock")])
        assert rc == EXIT_NO_DAEMON and err.count("\n") == 1


# ------------------------------------------------------------ formatting alone
def test_targets_and_a_group_on_no_resource(capsys):
    g = {
        "group": "tenant-a", "priority": 0.5, "latency_target_s": None,
        "throughput_target_bps": 25e6, "throughput_target_iops": None,
        "configured": {"priority": 1.0, "latency_target_s": None,
                       "throughput_target_bps": 20e6, "throughput_target_iops": None},
        "override": {"priority": 0.5, "throughput_target_bps": 25e6},
        "configured_members": ["10.0.2.0/24"], "configured_resources": ["vg0"],
        "initiators": [], "resources": [],
    }  # fmt: skip
    assert groupview.targets(g) == (
        "priority 0.5 (file: 1), latency target none, throughput target 25.00MB/s (file: 20.00MB/s)"
    )
    groupview.print_list([g])
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        r"tenant-a +0\.5\* +- +25\.00MB/s\* +0  - +\(no IOs on a grouped resource yet\)", lines[1]
    ), lines[1]
    groupview.print_show(g)
    out = capsys.readouterr().out
    assert "  resources (file)  vg0\n" in out and "  on no grouped resource yet" in out
