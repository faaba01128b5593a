"""Control socket, CLI smoke tests for every daemon subcommand, metrics: against a
daemon built on the fakes of tests/unit/test_daemon.py, over a real Unix socket."""

from __future__ import annotations

import json
import os
import stat

import pytest
from prometheus_client import generate_latest

from santhrottle.appliance.cli.main import main
from santhrottle.appliance.daemon.control import PROTOCOL_VERSION, request
from santhrottle.appliance.daemon.control.commands import Commands
from santhrottle.appliance.daemon.control.server import ControlServer
from santhrottle.appliance.daemon.status.build import StatusCache
from santhrottle.appliance.daemon.status.metrics import registry_for
from santhrottle.controller.ladder import Ladder
from tests.unit.test_daemon import handle

from .test_daemon import make, run_for


@pytest.fixture
def live(tmp_path):
    d, vt, _sensors, act = make()
    run_for(d, vt, 3.0)
    path = str(tmp_path / "run" / "control.sock")
    srv = ControlServer(path, Commands(d).handle, 0o600)
    srv.start()
    try:
        yield d, act, ["--socket", path]
    finally:
        srv.close()
    assert not os.path.exists(path)


def test_socket_is_root_only_and_speaks_json(live, tmp_path):
    _d, _act, sock = live
    path = sock[1]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert request(path, "ping") == {"pong": True}
    with pytest.raises(Exception, match="unknown command"):
        request(path, "frobnicate")


def test_status_json_and_table(live, capsys):
    _d, _act, sock = live
    assert main(["status", "--json", *sock]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["protocol"] == PROTOCOL_VERSION
    st = doc["data"]
    assert {r["resource"] for r in st["resources"]} == {"vg0", "vg1"}
    (ini,) = [i for i in st["initiators"] if i["initiator"] == "10.0.0.3"]
    assert ini["class"] > 0 and ini["delay_s"] == pytest.approx(Ladder().delay_s(ini["class"]))
    assert main(["status", *sock]) == 0
    out = capsys.readouterr().out
    assert "vg0" in out and "control" in out and "observe" in out


def test_threshold_set_show_and_errors(live, capsys):
    d, _act, sock = live
    assert main(["threshold", "set", "vg0", "12.5ms", *sock]) == 0
    assert d.ctl.resources["vg0"].resource.threshold_s == pytest.approx(0.0125)
    assert "vg0: threshold 12.50ms" in capsys.readouterr().out
    assert main(["threshold", "show", "--json", *sock]) == 0
    shown = json.loads(capsys.readouterr().out)["data"]
    assert shown["vg0"]["threshold_s"] == pytest.approx(0.0125) and shown["vg0"]["override"]
    assert shown["vg1"]["threshold_s"] is None and not shown["vg1"]["override"]
    for bad, msg, code in (
        (["threshold", "set", "nope", "5ms"], "unknown resource 'nope'", 1),  # refused
        (["threshold", "set", "vg0", "15"], "is not a duration", 2),  # bad input
        (["threshold", "set", "vg0", "-5ms"], "is not a duration", 2),
        (["threshold", "set", "vg0", "0ms"], "must be above 0", 2),
    ):
        assert main([*bad, *sock]) == code
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1
    assert d.ctl.resources["vg0"].resource.threshold_s == pytest.approx(0.0125)  # unaffected


def test_pause_resume_reload_top(live, capsys):
    d, act, sock = live
    assert main(["pause", *sock]) == 0 and d.runtime.paused
    d.run_once()
    assert act.kernel == {}
    assert main(["resume", *sock]) == 0 and not d.runtime.paused
    d.run_once()
    assert act.kernel
    assert main(["reload", *sock]) == 1  # refused: started without a config file
    assert "without a config file" in capsys.readouterr().err
    assert main(["top", "0.01", "2", "--json", *sock]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(json.loads(x)["data"]["resources"] for x in lines)


def test_no_daemon_is_one_line(tmp_path, capsys):
    assert main(["status", "--socket", str(tmp_path / "none.sock")]) == 3
    err = capsys.readouterr().err
    assert "santhrottled is not running" in err and err.count("\n") == 1


def test_metrics_from_a_fresh_registry(live):
    d, _act, _sock = live
    text = generate_latest(registry_for(StatusCache(d))).decode()
    for name in (
        'santhrottle_resource_read_latency_seconds{resource="vg0"}',
        'santhrottle_resource_threshold_seconds{resource="vg0"} 0.01',
        'santhrottle_resource_delay_class{resource="vg0"}',
        'santhrottle_resource_delay_seconds{resource="vg0"}',
        'santhrottle_resource_reads_completed_total{resource="vg0"}',
        'santhrottle_initiator_write_bytes_per_second{initiator="10.0.0.3",resource="vg0"}',
        'santhrottle_initiator_written_bytes_total{initiator="10.0.0.3",resource="vg0"}',
        'santhrottle_initiator_delay_seconds{initiator="10.0.0.3",mode="all"}',
        'santhrottle_initiator_delay_class{initiator="10.0.0.3",mode="all"}',
        'santhrottle_tick_duration_seconds_bucket{le="+Inf"}',
        "santhrottle_tick_overruns_total 0.0",
        "santhrottle_ticks_total",
        "santhrottle_build_info{",
    ):
        assert name in text, name
    # read at scrape time: a change shows in the next scrape
    handle(d, "threshold_set", {"resource": "vg0", "threshold_s": 0.02})
    assert (
        'santhrottle_resource_threshold_seconds{resource="vg0"} 0.02'
        in generate_latest(registry_for(StatusCache(d))).decode()
    )


def test_pin_and_unpin_go_through_a_running_daemon(live, capsys):
    d, act, sock = live
    assert main(["pin", "10.0.0.9", "--delay", "5ms", "--mode", "read", *sock]) == 0
    assert "through santhrottled" in capsys.readouterr().out
    assert d.runtime.pins["10.0.0.9"] == (10, "read")  # 5 ms / 0.5 ms steps
    d.run_once()
    assert act.kernel["10.0.0.9"] == (10, "read")
    assert main(["unpin", "10.0.0.9", *sock]) == 0
    d.run_once()
    assert "10.0.0.9" not in act.kernel
    assert main(["pin", "10.0.0.9", "--delay", "1.2ms", *sock]) == 2  # not a multiple of 0.5 ms
    assert capsys.readouterr().err.count("\n") == 1
