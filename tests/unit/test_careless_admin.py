"""Issue 46's smaller probes (item 8) and the reload that accepted an empty file (item 5).

Each was found by trying it on main: a 100,000-character --device gave a
traceback; a state file with 5,000 pins loaded them all, and class 500 was
clamped without a word; a configuration key with a newline was echoed raw into
the error and the log (a forged log line); `--check` on an empty file exited 1
where the start exits 2; `status --config broken.toml` went to the default
socket; a reload of an empty (truncated) file turned every threshold off."""

from __future__ import annotations

import contextlib
import io
import json
import logging

import pytest

from santhrottle.appliance.cli.main import main as cli_main
from santhrottle.appliance.config import ConfigError, parse_config
from santhrottle.appliance.daemon import main as daemon_main
from santhrottle.appliance.daemon.core.state import MAX_PINS, StateError, decode

from .test_daemon import CONF, CommandError, handle, make, run_for, status_of


@pytest.mark.parametrize(
    "argv",
    [
        ["datapath", "show", "--device", "x" * 100_000],
        ["datapath", "apply", "--device", "x" * 100_000],
        ["pin", "10.0.0.3", "--delay", "5ms", "--device", "x" * 100_000, "--socket", "/n.s"],
        ["datapath", "show", "--netns", "n" * 100_000],
    ],
    ids=["show", "apply", "pin", "netns"],
)
def test_a_huge_name_is_one_line_exit_2_not_a_traceback(argv, capsys):
    try:
        rc = cli_main(argv)  # an exception escaping main() fails the test: a traceback
    except SystemExit as e:  # argparse's usage error
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.splitlines()[-1]) < 300


def test_a_huge_interface_name_in_the_file_is_refused_by_the_parser():
    with pytest.raises(ConfigError, match="longer than 15 characters, the longest interface"):
        parse_config(CONF.replace('"eth1"', '"' + "x" * 100_000 + '"'), "t.toml")


def test_a_state_file_with_more_pins_than_the_limit_is_refused():
    pins = {f"10.{i // 65536}.{i // 256 % 256}.{i % 256 + 1}": [5, "all"] for i in range(5000)}
    with pytest.raises(StateError, match=f"pins: 5000 pins, at most {MAX_PINS}"):
        decode(json.dumps({"version": 1, "pins": pins}), 88)


def test_a_state_file_class_above_the_maximum_is_clamped_with_a_warning(caplog):
    doc = {"version": 1, "pins": {"10.0.0.3": [500, "all"]}, "resource_classes": {"vg0": 90}}
    with caplog.at_level(logging.WARNING):
        saved = decode(json.dumps(doc), 88)
    assert saved.pins == {"10.0.0.3": (88, "all")} and saved.resource_classes == {"vg0": 88}
    assert "pins: 10.0.0.3: class 500 is above the maximum class now, 88" in caplog.text
    with pytest.raises(StateError, match="is not a delay class"):  # above any ladder
        decode(json.dumps({"version": 1, "pins": {"10.0.0.3": [10**6, "all"]}}), 88)


@pytest.mark.parametrize(
    "text",
    [
        '[datapath]\ndevices = ["eth1"]\n"a\\nINFO santhrottled: reloaded" = 1\n',
        '[datapath]\ndevices = ["eth1"]\n[resources."vg\\u0000x"]\nthreshold = "10ms"\n',
        '["x\\r\\nWARNING y"]\n',
    ],
)
def test_a_key_with_a_newline_or_a_nul_cannot_forge_a_line(text):
    with pytest.raises(ConfigError) as e:
        parse_config(text, "t.toml")
    msg = str(e.value)
    assert msg.isprintable() and ("\\n" in msg or "\\x00" in msg), msg


def test_the_daemons_log_escapes_what_it_is_told():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(daemon_main.OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("santhrottled.test-forgery")
    log.addHandler(handler)
    try:
        log.error("reload refused: %s", "t.toml: a\nINFO santhrottled: reloaded t.toml\x00")
    finally:
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines == [
        "ERROR santhrottled.test-forgery: reload refused: t.toml: a\\nINFO "
        "santhrottled: reloaded t.toml\\x00"
    ]


def test_check_of_an_empty_file_exits_2_as_the_start_does(tmp_path, capsys):
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    assert daemon_main.main(["--check", "--config", str(empty)]) == 2
    assert daemon_main.main(["--config", str(empty)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        err == [f"santhrottled: {empty}: datapath.devices is empty: name the egress device(s)"] * 2
    )


@pytest.mark.parametrize(
    "text",
    [
        '[datapath]\ndevices = ["eth1", "eth1"]\n',
        '[datapath]\ndevices = ["eth1"]\n[resources.r]\ndevices = ["sdb", "sdb"]\n',
    ],
)
def test_a_device_named_twice_is_refused(text):
    """Before, datapath.devices = ["eth1", "eth1"] was taken: the drift check found one
    jump where it expected two and "repaired" the chain at every convergence."""
    with pytest.raises(ConfigError, match=r"devices: '(eth1|sdb)' is given twice$"):
        parse_config(text, "t.toml")


@pytest.mark.parametrize("key", ["state_dir", "control_socket"])
def test_a_directory_others_may_write_is_refused_at_check_and_start(tmp_path, capsys, key):
    """Before, state_dir = "/tmp" (or a socket there) was taken: any user could write
    /tmp/state.json first, and santhrottled restored its pins as root's word."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp is
    where = shared / ("control.sock" if key == "control_socket" else "state")
    conf = tmp_path / "s.toml"
    conf.write_text(f'[daemon]\n{key} = "{where}"\n[datapath]\ndevices = ["eth1"]\n')
    cfg = daemon_main.load_daemon_config(str(conf))
    (problem,) = daemon_main.directory_problems(cfg)
    assert problem == (
        f"daemon.{key}: {shared} is writable by others (mode 1777): another user could "
        "plant what santhrottled reads back"
    )
    assert daemon_main.main(["--config", str(conf)]) == 1  # before the kernel is touched
    assert capsys.readouterr().err == f"santhrottled: {problem}\n"
    shared.chmod(0o755)
    assert daemon_main.directory_problems(cfg) == []


def test_status_with_a_broken_config_never_falls_back_to_the_default_socket(tmp_path, capsys):
    broken = tmp_path / "broken.toml"
    broken.write_text("[daemon\n")
    assert cli_main(["status", "--config", str(broken)]) == 2
    err = capsys.readouterr().err
    assert str(broken) in err and "(or give --socket)" in err and "/run/santhrottle" not in err
    assert cli_main(["status", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["", "# the rest was lost\n", '[datapath]\ndevices = ["eth'])
def test_a_reload_of_an_empty_or_truncated_file_is_refused_and_the_config_kept(tmp_path, content):
    f = tmp_path / "s.toml"
    f.write_text(CONF + '[groups.db]\nmembers = ["10.0.0.2"]\npriority = 2\n')
    d, vt, _s, _act = make(f.read_text(), load_config=daemon_main.load_daemon_config)
    d.config = daemon_main.load_daemon_config(str(f))
    handle(
        d,
        "group_set",
        {
            "group": "db",
            "priority": 4.0,
            "latency_target_s": None,
            "throughput_target_bps": None,
            "throughput_target_iops": None,
        },
    )
    run_for(d, vt, 2.0)
    f.write_text(content)
    with pytest.raises(CommandError, match="reload refused, keeping the running config"):
        handle(d, "reload", {})
    run_for(d, vt, 1.0)
    st = status_of(d)
    assert d.config.threshold_of("vg0") == 0.01 and d.runtime.group_overrides
    assert st["resources"][0]["threshold"]["in_force_s"] == 0.01
    assert st["counters"]["reload_failures"] == 1 and st["counters"]["reloads"] == 0


def test_cleanup_force_never_signals_what_is_not_santhrottled(tmp_path):
    """`cleanup --force --socket` naming another program's socket (a typo, a careless
    copy): refused, that program untouched. In-process servers, so a signal would end
    the test itself."""
    import socket
    import threading

    from santhrottle.appliance.cli.cleanup import stop_daemon
    from santhrottle.appliance.cli.common import Failed
    from santhrottle.appliance.daemon.control.commands import Commands
    from santhrottle.appliance.daemon.control.server import ControlServer

    other = str(tmp_path / "other.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(other)
    srv.listen(8)

    def answer_hello() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c, contextlib.suppress(OSError):  # the client may be gone already
                c.sendall(b"hello, I am not a storage daemon\n")

    threading.Thread(target=answer_hello, daemon=True).start()
    try:
        with pytest.raises(Failed, match=r"does not answer as santhrottled.*nothing stopped"):
            stop_daemon(other)
    finally:
        srv.close()
    d, _vt, _s, _a = make()
    ours = str(tmp_path / "c.sock")
    control = ControlServer(ours, Commands(d).handle)  # the protocol, in a process
    control.start()  # that is no santhrottled (pytest's)
    try:
        with pytest.raises(Failed, match=r"is not santhrottled"):
            stop_daemon(ours)
    finally:
        control.close()


def _fake_proc(tmp_path, procs):
    """A /proc with a command line, a cwd, fds and net/unix for each (pid, argv, socket)."""
    proc = tmp_path / "proc"
    for pid, argv, sock in procs:
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "net").mkdir()
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (d / "cwd").symlink_to(tmp_path)
        (d / "fd" / "3").symlink_to(f"socket:[{1000 + pid}]")
        (d / "net" / "unix").write_text(
            "Num       RefCount Protocol Flags    Type St Inode Path\n"
            f"0000000000000000: 00000002 00000000 00010000 0001 01 {1000 + pid} {sock}\n"
            f"0000000000000000: 00000002 00000000 00000000 0001 03 {1000 + pid} /not/listening\n"
        )
    return proc


def test_cleanup_finds_each_running_santhrottled_and_its_socket(tmp_path):
    from santhrottle.appliance.cli.cleanup import daemon_processes, listening_sockets
    from santhrottle.appliance.config import DEFAULT_PATH

    py = "/usr/bin/python3"
    proc = _fake_proc(
        tmp_path,
        [
            (11, [py, "/usr/local/bin/santhrottled", "--config", "/etc/a.toml"], "/run/a.sock"),
            (12, ["santhrottled", "--config=rel.toml"], "/run/b.sock"),
            (13, [py, "-m", "santhrottle.appliance.daemon.main"], "/run/c.sock"),
            (14, [py, "/usr/local/bin/santhrottled", "--check"], "/run/d.sock"),
            (15, ["/usr/bin/sshd", "santhrottled"], "/run/e.sock"),
        ],
    )
    assert sorted(daemon_processes(proc)) == [
        (11, "/etc/a.toml"),
        (12, str(tmp_path / "rel.toml")),  # relative to the daemon's cwd
        (13, DEFAULT_PATH),
    ]
    assert listening_sockets(11, proc) == ["/run/a.sock"]
