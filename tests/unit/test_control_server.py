"""The control socket under misuse: every reproduction of issue 17's "one request stops
the protection" is a test here, against a real server on a Unix socket in tmp_path and
a Daemon built on the fakes of tests/unit/test_daemon.py."""

from __future__ import annotations

import contextlib
import grp
import json
import math
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from santhrottle.appliance.daemon.control import PROTOCOL_VERSION
from santhrottle.appliance.daemon.control.client import request
from santhrottle.appliance.daemon.control.commands import CommandError, Commands
from santhrottle.appliance.daemon.control.requests import DaemonUnavailable, RemoteError
from santhrottle.appliance.daemon.control.server import (
    MAX_REQUEST_BYTES,
    ControlServer,
    proc_groups,
)
from tests.unit.test_daemon import handle

from .test_daemon import make, run_for


@contextlib.contextmanager
def serving(path, dispatch, mode=0o600, group=None, **kw):
    srv = ControlServer(path, dispatch, mode, group, **kw)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()
    assert not os.path.exists(path)
    assert srv.loop_errors == 0  # nothing escaped into the loop


@pytest.fixture
def live(tmp_path):
    d, vt, _sensors, act = make()
    run_for(d, vt, 3.0)
    path = str(tmp_path / "run" / "control.sock")
    with serving(path, Commands(d).handle) as srv:
        yield d, vt, act, path, srv


def raw(path: str, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send bytes, return the first reply line (b"" when closed without one)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(path)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)  # a refused peer may find the connection closed already
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return buf


def reply(path: str, obj_or_line) -> dict:
    line = obj_or_line if isinstance(obj_or_line, bytes) else json.dumps(obj_or_line).encode()
    out = raw(path, line + b"\n")
    assert out.endswith(b"\n") and out.count(b"\n") == 1, out
    r = json.loads(out)
    assert r["protocol"] == PROTOCOL_VERSION and isinstance(r["ok"], bool)
    if not r["ok"]:
        assert isinstance(r["error"], str) and r["error"] and "\n" not in r["error"]
    return r


def refused(path, obj_or_line, *words) -> str:
    r = reply(path, obj_or_line)
    assert r["ok"] is False, r
    for w in words:
        assert w in r["error"], (w, r["error"])
    return r["error"]


# ---------------------------------------------------------------- 1. pin's arguments
def test_a_bogus_pin_is_refused_and_a_later_pin_still_reaches_the_kernel(live):
    d, vt, act, path, _srv = live
    pin = {"cmd": "pin", "args": {"initiator": "bogus", "class": 5, "mode": "all"}}
    refused(path, pin, "pin: initiator:", "'bogus' is not an IPv4 or IPv6 address")
    for field, value, words in (
        ("class", True, ("pin: class: true is not a whole number",)),
        ("class", 5.0, ("pin: class:",)),
        ("class", -1, ("pin: class:",)),
        ("class", 101, ("pin: class: 101 is outside 0..88",)),  # this config's max_class
        ("class", 5001, ("pin: class: 5001 is outside 0..5000",)),  # MAX_CLASSES: the server
        ("class", 10**4000, ("pin: class:", "...")),  # quoted, cut short
        ("class", "5", ("pin: class:",)),
        ("mode", "write", ("pin: mode:", "all, ack, read")),
        ("initiator", "fe80::g", ("not an IPv4 or IPv6 address",)),
        ("initiator", "fd00::1::2", ("not an IPv4 or IPv6 address",)),
        ("initiator", "fd00::/64", ("not an IPv4 or IPv6 address",)),  # a network
        ("initiator", "10.0.0.256", ("not an IPv4 or IPv6 address",)),
        ("initiator", "010.0.0.1", ("not an IPv4 or IPv6 address",)),
        ("initiator", 167772163, ("not an IPv4 or IPv6 address",)),  # an int is not one
        ("initiator", " 10.0.0.1", ("not an IPv4 or IPv6 address",)),
    ):
        args = {"initiator": "10.0.0.9", "class": 5, "mode": "all", field: value}
        refused(path, {"cmd": "pin", "args": args}, *words)
    assert d.runtime.pins == {}
    with pytest.raises(CommandError, match="pin: initiator"):  # the daemon checks too
        handle(d, "pin", {"initiator": "bogus", "class": 5, "mode": "all"})
    assert request(path, "pin", initiator="10.0.0.9", mode="all", **{"class": 5})["class"] == 5
    run_for(d, vt, 0.3)
    assert act.kernel["10.0.0.9"] == (5, "all") and d.counters.actuator_errors == 0


def test_unknown_commands_arguments_and_shapes_are_refused_in_one_line(live):
    _d, _vt, _act, path, _srv = live
    refused(path, {"cmd": "frobnicate"}, "unknown command 'frobnicate'")
    refused(path, {"cmd": 5}, "unknown command 5")
    refused(path, {"args": {}}, 'a request is {"cmd": ..., "args": {...}}')
    refused(path, {"cmd": "ping", "args": {"x": 1}}, "ping: unknown argument 'x'")
    refused(path, {"cmd": "unpin", "args": {"initiator": "10.0.0.3", "mode": "all"}}, "'mode'")
    refused(path, {"cmd": "pin", "args": {"initiator": "10.0.0.3"}}, "pin: class: missing")
    refused(path, {"cmd": "ping", "args": []}, "args must be an object")
    refused(path, {"cmd": "ping", "id": 1}, "unknown key 'id'")
    refused(path, [1, 2], "a request is")
    refused(path, b"{not json", "bad request")
    refused(path, b"\xff\xfe", "bad request")
    refused(path, b"[" * 50_000, "bad request")  # nesting: RecursionError, not a crash
    refused(path, b"1" * 5000, "bad request")  # more digits than int() takes
    assert reply(path, {"cmd": "ping"})["data"] == {"pong": True}  # args may be left out


# ---------------------------------------------------------------- 2. thresholds
def test_infinite_or_nan_thresholds_are_refused_and_status_still_works(live):
    d, _vt, _act, path, _srv = live
    for token in (b"Infinity", b"-Infinity", b"NaN"):
        line = b'{"cmd":"threshold_set","args":{"resource":"vg0","threshold_s":%s}}' % token
        refused(path, line, "is not a JSON number")
    # a JSON number too large for a float parses to inf: refused by the check
    line = b'{"cmd":"threshold_set","args":{"resource":"vg0","threshold_s":1e400}}'
    refused(path, line, "threshold_set: threshold_s: inf is not a finite number")
    for value, words in (
        (10**400, ("threshold_s:", "not a finite number")),
        (0, ("must be above 0",)),
        (-0.01, ("must be above 0",)),
        (1e-12, ("below 1ns",)),
        (True, ("not a number of seconds",)),
        ("15ms", ("not a number of seconds",)),
    ):
        args = {"resource": "vg0", "threshold_s": value}
        refused(path, {"cmd": "threshold_set", "args": args}, *words)
    refused(path, {"cmd": "threshold_set", "args": {"resource": "nope", "threshold_s": 0.01}},
            "threshold_set: resource: unknown resource 'nope'; known: vg0, vg1")  # fmt: skip
    refused(path, {"cmd": "threshold_set", "args": {"resource": "../x", "threshold_s": 0.01}},
            "not a resource name")  # fmt: skip
    with pytest.raises(CommandError, match="not a finite number"):
        handle(d, "threshold_set", {"resource": "vg0", "threshold_s": math.inf})
    assert d.runtime.thresholds == {}
    st = request(path, "status")  # encodable: nothing infinite got in
    assert {r["resource"] for r in st["resources"]} == {"vg0", "vg1"}
    # a float of whole nanoseconds is kept exactly
    assert request(path, "threshold_set", resource="vg1", threshold_s=0.0125)["threshold_s"] == (
        0.0125
    )


# ---------------------------------------------------------------- 3. overrides
def _asked(v):
    return {k: v[k] for k in ("threshold_s", "configured_s", "override")}


def test_threshold_show_marks_overrides_and_reset_returns_to_the_file(live):
    d, _vt, _act, path, _srv = live
    shown = request(path, "threshold_show")
    assert {n: _asked(v) for n, v in shown.items()} == {
        "vg0": {"threshold_s": 0.01, "configured_s": 0.01, "override": False},
        "vg1": {"threshold_s": None, "configured_s": None, "override": False},
    }
    assert shown["vg0"]["in_force_s"] == 0.01 and shown["vg1"]["in_force_s"] is None
    got = request(path, "threshold_set", resource="vg0", threshold_s=0.012)
    assert got == {
        "resource": "vg0",
        "threshold_s": 0.012,
        "configured_s": 0.01,
        "override": True,
        "in_force_s": 0.012,
        "setpoint_fraction": 0.9,
        "fit": None,
    }
    assert _asked(request(path, "threshold_show")["vg0"]) == {
        "threshold_s": 0.012,
        "configured_s": 0.01,
        "override": True,
    }
    assert d.ctl.resources["vg0"].resource.threshold_s == 0.012
    got = _asked(request(path, "threshold_reset", resource="vg0")) | {
        "resource": "vg0",
        "removed_s": 0.012,
    }
    assert got == {
        "resource": "vg0",
        "threshold_s": 0.01,
        "configured_s": 0.01,
        "override": False,
        "removed_s": 0.012,
    }
    assert d.runtime.thresholds == {} and d.ctl.resources["vg0"].resource.threshold_s == 0.01
    # no override: nothing removed, not an error
    assert request(path, "threshold_reset", resource="vg0")["removed_s"] is None
    # an override on a resource without a threshold in the file: back to observed
    request(path, "threshold_set", resource="vg1", threshold_s=0.02)
    assert "vg1" in d.ctl.resources
    assert request(path, "threshold_reset", resource="vg1")["threshold_s"] is None
    assert "vg1" not in d.ctl.resources
    with pytest.raises(RemoteError, match="threshold_reset: resource: unknown resource 'x'"):
        request(path, "threshold_reset", resource="x")


# ---------------------------------------------------------------- 6. protocol version
def test_every_reply_carries_the_protocol_version(live):
    _d, _vt, _act, path, _srv = live
    for line in (b'{"cmd":"ping"}', b'{"cmd":"status"}', b'{"cmd":"nope"}', b"garbage"):
        assert json.loads(raw(path, line + b"\n"))["protocol"] == PROTOCOL_VERSION
    big = raw(path, b"x" * (MAX_REQUEST_BYTES + 10))
    assert json.loads(big) == {"protocol": 2, "ok": False, "error": "request too large"}


def test_a_failing_or_unencodable_dispatch_is_a_one_line_refusal(tmp_path):
    def dispatch(cmd, _args, _caller):
        if cmd == "status":
            return {"x": math.nan}
        raise RuntimeError("boom\nsecond line")

    path = str(tmp_path / "c.sock")
    with serving(path, dispatch):
        assert refused(path, {"cmd": "ping"}) == "boom second line"
        refused(path, {"cmd": "status"}, "cannot encode the answer")
        with pytest.raises(RemoteError, match="boom second line"):
            request(path, "ping")


# ---------------------------------------------------------------- 4. the loop
def test_several_requests_on_one_connection_are_answered_in_order(live):
    _d, _vt, _act, path, _srv = live
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(b'{"cmd":"ping"}\n{"cmd":"nope"}\n{"cmd":"pause"}\n')
        f = s.makefile("rb")
        got = [json.loads(f.readline()) for _ in range(3)]
    assert [r["ok"] for r in got] == [True, False, True] and got[2]["data"] == {"paused": True}


def test_a_burst_of_100_parallel_calls_all_succeed(live):
    _d, _vt, _act, path, _srv = live
    failures: list[str] = []
    results: list[object] = []

    def call() -> None:
        try:
            results.append(request(path, "ping"))
        except Exception as e:
            failures.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=call) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == [] and results == [{"pong": True}] * 100


def test_1000_idle_connections_add_no_thread_and_a_ping_still_answers(live):
    _d, _vt, _act, path, srv = live
    before = threading.active_count()
    idle, full = [], 0

    def connect() -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:  # the backlog is full: the kernel says EAGAIN
            s.close()
            return False
        idle.append(s)
        return True

    try:
        # the slots first, at the server's pace (a loaded host accepts late)
        deadline = time.monotonic() + 30
        while srv.connections < srv.max_connections and time.monotonic() < deadline:
            if not connect():
                time.sleep(0.01)
        assert srv.connections == srv.max_connections
        for _ in range(1000 - len(idle)):
            full += not connect()
        assert len(idle) >= 64 + 100  # the slots and most of the backlog took them
        assert threading.active_count() <= before
        assert request(path, "ping") == {"pong": True}
        assert srv.connections <= srv.max_connections
        assert threading.active_count() <= before
        assert srv.evicted > 0  # idle ones made room for the ping
    finally:
        for s in idle:
            s.close()


def test_a_connection_without_a_complete_request_is_closed_after_the_idle_timeout(tmp_path):
    d, _vt, _sensors, _act = make()
    path = str(tmp_path / "c.sock")
    with serving(path, Commands(d).handle, idle_timeout_s=0.2) as srv:
        assert raw(path, b"") == b""  # nothing sent: closed, no answer
        assert raw(path, b'{"cmd": "pi') == b""  # half a request: the same
        assert srv.connections == 0
        assert request(path, "ping") == {"pong": True}


def test_a_client_that_never_reads_stalls_neither_the_server_nor_the_daemon(live):
    d, _vt, _act, path, srv = live
    hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hog.connect(path)
    hog.setblocking(False)
    sent = 0
    with contextlib.suppress(BlockingIOError):
        for _ in range(20_000):  # status answers pile up on the server's side
            sent += hog.send(b'{"cmd":"status"}\n')
    try:
        assert sent > 0
        assert request(path, "ping") == {"pong": True}
        assert d.lock.acquire(timeout=5)  # the server holds no lock while it waits
        d.lock.release()
        assert request(path, "pause") == {"paused": True}
    finally:
        hog.close()
    assert srv.loop_errors == 0


# ---------------------------------------------------------------- 5. who may ask
def test_a_peer_outside_the_allowed_uids_is_refused_in_one_line(tmp_path):
    d, _vt, _sensors, _act = make()
    path = str(tmp_path / "c.sock")
    with serving(path, Commands(d).handle, allow_uids=frozenset()) as srv:
        with pytest.raises(RemoteError) as e:
            request(path, "pause")
        assert str(e.value) == f"permission denied for uid {os.geteuid()}: root only"
        assert srv.refused == 1 and not d.runtime.paused
        r = json.loads(raw(path, b'{"cmd":"ping"}\n'))
        assert r["ok"] is False and r["protocol"] == PROTOCOL_VERSION


def test_the_configured_group_is_let_in_and_the_socket_is_0660_root_group(tmp_path):
    d, _vt, _sensors, _act = make()
    own = grp.getgrgid(os.getegid())
    path = str(tmp_path / "c.sock")
    with serving(path, Commands(d).handle, 0o660, own.gr_name, allow_uids=frozenset()):
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == own.gr_gid
        assert request(path, "ping") == {"pong": True}  # in by its primary group
    other = next(g for g in grp.getgrall() if g.gr_gid not in {os.getegid(), *os.getgroups()})
    with (
        serving(path, Commands(d).handle, 0o660, other.gr_name, allow_uids=frozenset()),
        pytest.raises(RemoteError, match=f"root or group {other.gr_name} only"),
    ):
        request(path, "ping")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set a peer's groups")
def test_a_peer_in_the_group_by_a_supplementary_group_is_let_in(tmp_path):
    """A peer process whose uid is not allowed (allow_uids empty) and whose primary
    group is not the socket's: let in by a supplementary group alone."""
    d, _vt, _sensors, _act = make()
    g = next(g for g in grp.getgrall() if g.gr_gid not in (0, 65534))
    path = str(tmp_path / "c.sock")
    code = (
        "import sys; from santhrottle.appliance.daemon.control import request\n"
        "print(request(sys.argv[1], 'ping'))"
    )

    def peer(extra_groups):
        return subprocess.run(
            [sys.executable, "-c", code, path],
            group=65534,
            extra_groups=extra_groups,
            capture_output=True,
            text=True,
            timeout=60,
        )

    with serving(path, Commands(d).handle, 0o660, g.gr_name, allow_uids=frozenset()) as srv:
        run = peer([g.gr_gid])
        assert run.returncode == 0 and "'pong': True" in run.stdout, run.stderr
        run = peer([])
        assert run.returncode == 1 and "RemoteError: permission denied" in run.stderr
        assert srv.refused == 1


def test_proc_groups_reads_the_supplementary_groups():
    assert proc_groups(os.getpid()) == set(os.getgroups())
    assert proc_groups(2**22 + 12345) == set()  # no such process: no group


@pytest.mark.parametrize(
    ("mode", "group", "msg"),
    [
        (0o777, None, "control socket mode 0777: must be 0600 without a group"),
        (0o660, None, "control socket mode 0660: must be 0600 without a group"),
        (0o600, "root", "control socket mode 0600: must be 0660 with group 'root'"),
        (0o660, "no-such-group-xyz", "control socket group 'no-such-group-xyz' does not exist"),
    ],
)
def test_only_0600_or_0660_with_a_group(tmp_path, mode, group, msg):
    path = str(tmp_path / "c.sock")
    with pytest.raises(ValueError) as e:
        ControlServer(path, lambda c, a, w: None, mode, group)
    assert str(e.value) == msg and not os.path.exists(path)


def test_socket_is_0600_and_a_second_server_is_refused(live):
    _d, _vt, _act, path, _srv = live
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with pytest.raises(OSError, match="another santhrottled is running"):
        ControlServer(path, lambda c, a, w: None)


# ---------------------------------------------------------------- 7. the client
@contextlib.contextmanager
def fake_daemon(path: str, answer: bytes | None):
    """Accepts one connection, reads the request, sends `answer` (None: never answers;
    b"": closes)."""
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(1)
    done = threading.Event()

    def serve() -> None:
        conn, _ = lsock.accept()
        with conn:
            conn.recv(65536)
            if answer is not None:
                conn.sendall(answer)
            if answer != b"":
                done.wait(10)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(10)
        lsock.close()


@pytest.mark.parametrize(
    ("answer", "error", "msg"),
    [
        (None, DaemonUnavailable, "does not answer on .* \\(no answer within 0.3s\\)"),
        (b"", DaemonUnavailable, "closed .* without an answer"),
        (b"<html>\n", DaemonUnavailable, "reply on .* is not JSON"),
        (b'{"ok": true, "protocol": 2, "data": NaN}\n', DaemonUnavailable, "is not JSON"),
        (b"[1, 2]\n", DaemonUnavailable, "is not an answer object"),
        (b'{"ok": true, "protocol": 1, "data": 1}\n', RemoteError,
         "speaks protocol 1, this santhrottle speaks protocol 2"),
        (b'{"ok": true, "data": 1}\n', RemoteError,
         "speaks no protocol version, this santhrottle speaks protocol 2"),
        (b'{"ok": false, "protocol": 2, "error": "no\\nway"}\n', RemoteError, "^no way$"),
        (b'{"ok": false, "protocol": 2}\n', RemoteError, "^refused$"),
    ],
)  # fmt: skip
def test_the_client_turns_every_failure_into_one_line(tmp_path, answer, error, msg):
    path = str(tmp_path / "fake.sock")
    with fake_daemon(path, answer), pytest.raises(error, match=msg) as e:
        request(path, "ping", timeout_s=0.3)
    assert "\n" not in str(e.value)


def test_the_client_without_a_daemon(tmp_path):
    with pytest.raises(DaemonUnavailable, match="is not running \\(no socket"):
        request(str(tmp_path / "none.sock"), "ping")
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()  # a socket file nobody listens on
    with pytest.raises(DaemonUnavailable, match="nobody listens"):
        request(str(stale), "ping")
    with pytest.raises(RemoteError, match="not sent"):
        request(str(stale), "threshold_set", resource="vg0", threshold_s=math.nan)


def test_threshold_auto_is_fitted_and_observed_until_confident(live):
    """threshold set vg0 auto: the PID observes (no fallback) until the LQ fit is
    confident; status and threshold_show carry the fit; the override is kept."""
    d, _vt, _act, path, _srv = live
    got = request(path, "threshold_set", resource="vg0", threshold_s="auto")
    assert got["threshold_s"] == "auto" and got["override"] and got["in_force_s"] is None
    assert got["fit"]["windows"] == 0 and not got["fit"]["fitted"]
    assert d.ctl.resources["vg0"].resource.auto
    assert d.runtime.thresholds == {"vg0": "auto"}
    with pytest.raises(RemoteError, match="threshold_s"):
        request(path, "threshold_set", resource="vg0", threshold_s="automatic")
    request(path, "threshold_reset", resource="vg0")
    assert not d.ctl.resources["vg0"].resource.auto
