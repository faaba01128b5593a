"""The audit trail (core/audit.py, core/why.py; issue 46 item 7).

Before: pin, pause, resume, threshold set/reset, group set and reload left nothing in
the log though the socket knew the caller's uid; a refused `santhrottle reload` was not
logged; initiators entering or leaving a delay class were not logged either."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from santhrottle.appliance.cli.main import main as cli_main
from santhrottle.appliance.daemon import main as daemon_main
from santhrottle.appliance.daemon.control import RemoteError, request
from santhrottle.appliance.daemon.control.commands import Commands
from santhrottle.appliance.daemon.control.server import ControlServer
from santhrottle.appliance.daemon.core.audit import CLASS_LOG_MIN_INTERVAL_S, Caller

from .test_daemon import CONF, MIB, CommandError, make, run_for

ROOT = Path(__file__).parents[2]
ROOT_CALLER = Caller("socket", 0, 4242)


def audit_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "santhrottled.audit"]


@pytest.mark.parametrize(
    "cmd, args, before, after",
    [
        (
            "pin",
            {"initiator": "10.0.0.9", "class": 10, "mode": "all"},
            '"not pinned"',
            '"class 10 all"',
        ),
        ("pause", {}, "running", "paused"),
        ("threshold_set", {"resource": "vg0", "threshold_s": 0.02}, "0.01", '"0.02 (override)"'),
        ("reload", {}, None, None),
    ],
)
def test_every_state_change_is_one_audit_line_with_who_what_before_after(
    cmd, args, before, after, caplog, tmp_path
):
    conf = tmp_path / "s.toml"
    conf.write_text(CONF)
    d, _vt, _s, _a = make(load_config=daemon_main.load_daemon_config)
    d.config = daemon_main.load_daemon_config(str(conf))
    with caplog.at_level(logging.INFO, logger="santhrottled.audit"):
        Commands(d).handle(cmd, args, ROOT_CALLER)
        Commands(d).handle("status", {}, ROOT_CALLER)  # reads: nothing
    (line,) = audit_lines(caplog)
    assert line.startswith(f"audit: event=command command={cmd} via=socket uid=0 pid=4242")
    assert line.endswith("result=done")
    if cmd != "reload":
        assert f" before={before} after={after} " in line
    (rec,) = [r for r in caplog.records if r.name == "santhrottled.audit"]
    assert rec.SANTHROTTLE_UID == "0" and cmd == rec.SANTHROTTLE_COMMAND  # journald fields


def test_a_refused_reload_is_logged_the_same_way(caplog, tmp_path):
    conf = tmp_path / "s.toml"
    conf.write_text("")  # truncated
    d, _vt, _s, _a = make(load_config=daemon_main.load_daemon_config)
    d.config = dataclasses.replace(d.config, path=str(conf))
    with caplog.at_level(logging.INFO, logger="santhrottled.audit"), pytest.raises(CommandError):
        Commands(d).handle("reload", {}, ROOT_CALLER)
    (line,) = audit_lines(caplog)
    assert "command=reload via=socket uid=0 pid=4242" in line and "result=refused" in line
    assert "datapath.devices is empty" in line


def test_a_request_the_checks_refuse_is_audited_with_the_peers_uid(caplog, tmp_path):
    d, _vt, _s, _a = make()
    commands = Commands(d)
    path = str(tmp_path / "c.sock")
    srv = commands.control_server(path)  # as santhrottled wires it
    srv.start()
    try:
        with caplog.at_level(logging.INFO, logger="santhrottled.audit"):
            for _ in range(3):  # rate limited per uid and command: one line a second
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(path)
                    s.sendall(
                        b'{"cmd": "pin", "args": {"initiator": "0.0.0.0", "class": 5, '
                        b'"mode": "all\\nINFO forged"}}\n'
                    )
                    assert b'"ok": false' in s.recv(4096)
    finally:
        srv.close()
    (line,) = audit_lines(caplog)
    assert f"uid={os.geteuid()} pid={os.getpid()}" in line and "result=refused" in line
    assert "error=\"pin: initiator: '0.0.0.0' is unspecified" in line
    assert "\\nINFO forged" in line  # the newline escaped: one line


def test_the_socket_checks_a_class_against_this_daemons_ladder(tmp_path):
    """Before, the socket's first check knew only the ladder's ceiling: a class of -1
    was "outside 0..5000" while this daemon's classes end at its max_class."""
    d, _vt, _s, _a = make()
    srv = Commands(d).control_server(str(tmp_path / "c.sock"))
    srv.start()
    try:
        for bad in (-1, d.config.max_class + 1):
            with pytest.raises(RemoteError, match=rf"outside 0\.\.{d.config.max_class}$"):
                request(srv.path, "pin", initiator="10.0.0.9", **{"class": bad, "mode": "all"})
    finally:
        srv.close()


def test_each_class_change_is_logged_with_its_reason_rate_limited(caplog):
    d, vt, _s, _act = make()
    with caplog.at_level(logging.INFO, logger="santhrottled.audit"):
        run_for(d, vt, 6.0)  # 10.0.0.3 writes 20 MiB/s to vg0 at 30 ms: it joins, rises
    lines = [ln for ln in audit_lines(caplog) if "event=class" in ln]
    assert (
        lines[0].startswith("audit: event=class initiator=10.0.0.3 resource=vg0 from=0 to=")
        and 'why="write-heavy on vg0 (joined)"' in lines[0]
    )
    changes = [e for e in d.audit.history("10.0.0.3") if e.old >= 0]
    assert len(changes) > len(lines)  # every change remembered, fewer lines
    assert len(lines) <= 1 + 6.0 / CLASS_LOG_MIN_INTERVAL_S + 1
    with caplog.at_level(logging.INFO, logger="santhrottled.audit"):
        run_for(d, vt, CLASS_LOG_MIN_INTERVAL_S + 1)
    later = [ln for ln in audit_lines(caplog) if "event=class" in ln][len(lines) :]
    assert not later or "changes_not_logged=" in later[0] or "why=" in later[0]


def test_why_answers_from_the_recent_history(capsys, tmp_path):
    d, vt, _s, _act = make()
    commands = Commands(d)
    run_for(d, vt, 3.0)
    commands.handle("pin", {"initiator": "10.0.0.3", "class": 50, "mode": "all"}, ROOT_CALLER)
    run_for(d, vt, 1.0)
    got = commands.handle("why", {"initiator": "10.0.0.3"}, ROOT_CALLER)
    assert got["class"] == 50 and got["pinned"] and got["write_heavy_on"] == ["vg0"]
    whys = [e["why"] for e in got["events"]]
    assert whys[0] == "write-heavy on vg0 (joined)"
    assert "pin by uid 0 pid 4242" in whys and "pinned (class 50 all)" in whys
    path = str(tmp_path / "c.sock")
    srv = ControlServer(path, commands.handle)
    srv.start()
    try:
        assert cli_main(["why", "10.0.0.3", "--socket", path]) == 0
    finally:
        srv.close()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("10.0.0.3: class 50 (") and out[0].endswith(
        "ms, all); pinned; write-heavy on vg0"
    )
    assert any(
        " class 0 -> " in ln and ln.endswith("vg0: write-heavy on vg0 (joined)") for ln in out
    )
    assert any(ln.endswith("pin by uid 0 pid 4242") for ln in out)


def test_journald_gets_the_audit_fields_through_python_systemd():
    """Debian's python3 with its python3-systemd: the daemon's JournalHandler path
    (daemon/main.py) hands journald the SANTHROTTLE_* fields.  (No journald runs on
    this machine: python-systemd's own sender is replaced by a list.)"""
    py = shutil.which("python3", path="/usr/bin")
    if (
        py is None
        or subprocess.run(
            [py, "-c", "import systemd.journal"], capture_output=True, check=False
        ).returncode
    ):
        pytest.skip("Debian's python3 has no python3-systemd here")
    code = (
        "import logging, sys\n"
        "from systemd.journal import JournalHandler\n"
        "from santhrottle.appliance.daemon.core.audit import Audit, Caller\n"
        "sent = []\n"
        "h = JournalHandler(sender_function=lambda *a, **k: sent.append(k),"
        " SYSLOG_IDENTIFIER='santhrottled')\n"
        "logging.getLogger('santhrottled').addHandler(h)\n"
        "logging.getLogger('santhrottled').setLevel(logging.INFO)\n"
        "Audit().command(Caller('socket', 0, 77), 'unpin', {'initiator': '10.0.0.3'},"
        " 'class 5 all', 'not pinned')\n"
        "k = sent[0]\n"
        "print(k['SYSLOG_IDENTIFIER'], k['SANTHROTTLE_COMMAND'], k['SANTHROTTLE_UID'],"
        " k['SANTHROTTLE_INITIATOR'], k['SANTHROTTLE_BEFORE'])\n"
    )
    shim = Path(os.environ.get("TMPDIR", "/tmp")) / f"st-shim-{os.getpid()}"
    pkg = shim / "santhrottle"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    link = pkg / "appliance"
    if not link.exists():
        link.symlink_to(ROOT / "appliance", target_is_directory=True)
    try:
        p = subprocess.run(
            [py, "-c", code],
            capture_output=True,
            text=True,
            check=False,
            env={"PYTHONPATH": str(shim), "PATH": "/usr/bin:/bin"},
        )
    finally:
        shutil.rmtree(shim)
    assert p.stdout.split() == ["santhrottled", "unpin", "0", "10.0.0.3", "class", "5", "all"], (
        p.stderr
    )


def test_a_futile_delay_is_released_logged_shown_and_explained(caplog, capsys, tmp_path):
    """vg0 stays at 30 ms (T = 10 ms) while the delay takes 10.0.0.3's writes from 20
    to 2 MiB/s: the delay does not work (controller/futile.py)."""
    d, vt, sensors, _act = make()
    commands = Commands(d)
    run_for(d, vt, 6.0)  # 10.0.0.3 joins vg0's set, the class rises
    assert d.ctl.resources["vg0"].delay_class > 0
    sensors.write_bps = 2 * MIB  # taken by the delay; the latency does not move
    with caplog.at_level(logging.INFO, logger="santhrottled.audit"):
        run_for(d, vt, 40.0)
    (line,) = [ln for ln in audit_lines(caplog) if "event=futile" in ln]
    assert line.startswith("audit: event=futile resource=vg0 latency_ms=30.0 ")
    assert "threshold_ms=10.0" in line and "released_s=60" in line
    assert d.ctl.resources["vg0"].delay_class == 0 and d.ctl.effective == {}
    (vg0,) = [r for r in commands.handle("status", {}, ROOT_CALLER)["resources"]
              if r["resource"] == "vg0"]  # fmt: skip
    assert 0 < vg0["futile_released_s"] < 60 and vg0["futile_releases"] == 1
    whys = [e.why for e in d.audit.history("10.0.0.3")]
    assert "vg0's delay released (futile: it did not lower the read latency)" in whys
    path = str(tmp_path / "c.sock")
    srv = ControlServer(path, commands.handle)
    srv.start()
    try:
        assert cli_main(["status", "--socket", path]) == 0
    finally:
        srv.close()
    out = capsys.readouterr().out
    assert "vg0: delay released for " in out and "(futile; 1 release(s))" in out


def test_a_release_the_latency_refutes_ends_and_is_logged(caplog):
    """vg0's delay released as futile (30 ms whatever the delay); without it the latency
    climbs to 80 ms: the release ends long before its 60 s (audit event=futile_refuted
    with the latency and the peak it climbed past) and the class rises again."""
    d, vt, sensors, _act = make()
    run_for(d, vt, 6.0)
    sensors.write_bps = 2 * MIB
    with caplog.at_level(logging.INFO, logger="santhrottled.audit"):
        run_for(d, vt, 40.0)
        assert d.ctl.resources["vg0"].futile.released(vt.now)
        sensors.latency_s, sensors.write_bps = 0.080, 20 * MIB  # the delay was working
        run_for(d, vt, 15.0)
    (line,) = [ln for ln in audit_lines(caplog) if "event=futile_refuted" in ln]
    assert line.startswith("audit: event=futile_refuted resource=vg0 latency_ms=")
    assert "peak_latency_ms=30.0" in line and "threshold_ms=10.0" in line
    rs = d.ctl.resources["vg0"]
    assert not rs.futile.released(vt.now) and rs.futile.refutations == 1
    assert rs.delay_class > 0
