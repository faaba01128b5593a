"""The CLI's exit codes against real Unix sockets in tmp_path (no daemon, no kernel):
3 when nobody runs or answers (a server that accepts and never answers included),
1 when the daemon refuses, 0 with the answer; threshold show/reset against the
reply shapes of issue 17 and of a daemon of before it; --json's protocol envelope."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from santhrottle.appliance.cli import daemon as cli_daemon
from santhrottle.appliance.cli.main import main
from santhrottle.appliance.daemon.control import PROTOCOL_VERSION

Reply = Callable[[dict[str, Any]], bytes | None]


class Server:
    """A Unix stream server on `path` answering each request line with reply(req)
    (None: say nothing and keep the connection open, like a hung daemon)."""

    def __init__(self, path: Path, reply: Reply) -> None:
        self.requests: list[dict[str, Any]] = []
        self.reply = reply
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.05)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            with conn.makefile("rb") as f:
                line = f.readline()
            if not line:
                continue
            req = json.loads(line)
            self.requests.append(req)
            out = self.reply(req)
            if out is not None:
                conn.sendall(out)
                conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Reply], list[str]]]:
    servers: list[Server] = []

    def start(reply: Reply) -> list[str]:
        path = tmp_path / f"s{len(servers)}.sock"
        servers.append(Server(path, reply))
        return ["--socket", str(path)]

    yield start
    for s in servers:
        s.close()


def ok(data: Any) -> bytes:
    return json.dumps({"ok": True, "data": data, "protocol": PROTOCOL_VERSION}).encode() + b"\n"


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("santhrottle: "), err
    assert "Traceback" not in err
    return err


def test_no_daemon_is_exit_3(tmp_path, capsys):
    assert main(["status", "--socket", str(tmp_path / "none.sock")]) == 3
    assert "santhrottled is not running" in one_line(capsys.readouterr().err)


def test_a_socket_nobody_listens_on_is_exit_3(tmp_path, capsys):
    path = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))  # bound, never listening: what a killed daemon leaves
    try:
        assert main(["pause", "--socket", str(path)]) == 3
    finally:
        s.close()
    one_line(capsys.readouterr().err)


def test_a_server_that_accepts_and_never_answers_is_exit_3(serve, capsys):
    """Issue 17: this was a TimeoutError traceback."""
    sock = serve(lambda req: None)
    assert main(["status", *sock, "--timeout", "0.2"]) == 3
    err = one_line(capsys.readouterr().err)
    assert "does not answer" in err or "not running" in err


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("timed out"),
        ConnectionResetError(104, "Connection reset by peer"),
        OSError(32, "Broken pipe"),
    ],
    ids=["timeout", "reset", "oserror"],
)
def test_any_oserror_around_a_request_is_exit_3(exc, monkeypatch, tmp_path, capsys):
    """Whatever request() lets through from the socket (TimeoutError, a reset) is
    'not answering', one line, exit 3: the CLI does not rely on request() alone."""

    def boom(*_a: Any, **_k: Any) -> Any:
        raise exc

    monkeypatch.setattr(cli_daemon, "request", boom)
    assert main(["status", "--socket", str(tmp_path / "x.sock")]) == 3
    assert "does not answer" in one_line(capsys.readouterr().err)


def test_a_reply_that_is_not_json_is_one_line(serve, capsys):
    sock = serve(lambda req: b"this is not json\n")
    assert main(["status", *sock]) in (1, 3)
    one_line(capsys.readouterr().err)


def test_a_refusal_is_exit_1(serve, capsys):
    refusal = {"ok": False, "error": "unknown resource 'nope'", "protocol": PROTOCOL_VERSION}
    sock = serve(lambda req: json.dumps(refusal).encode() + b"\n")
    assert main(["threshold", "set", "nope", "5ms", *sock]) == 1
    assert "unknown resource 'nope'" in one_line(capsys.readouterr().err)
    assert main(["reload", *sock]) == 1
    one_line(capsys.readouterr().err)


def test_bad_input_never_reaches_the_socket(serve, capsys):
    seen: list[dict[str, Any]] = []
    sock = serve(lambda req: seen.append(req) or ok({}))
    assert main(["threshold", "set", "vg0", "0ms", *sock]) == 2
    assert "must be above 0" in one_line(capsys.readouterr().err)
    assert seen == []


def th(threshold_s: Any, configured_s: Any, override: bool) -> dict[str, Any]:
    """A ThresholdView's JSON (status/views.py), as the daemon answers it."""
    return {
        "threshold_s": threshold_s,
        "configured_s": configured_s,
        "override": override,
        "in_force_s": threshold_s,
        "setpoint_fraction": None if threshold_s is None else 0.9,
        "fit": None,
    }


SHOW_NEW = {
    "vg0": th(0.015, 0.03, True),
    "vg1": th(0.03, 0.03, False),
    "vg2": th(None, None, False),
    "vg3": th(0.005, None, True),
}


def test_threshold_show_marks_overrides(serve, capsys):
    sock = serve(lambda req: ok(SHOW_NEW))
    assert main(["threshold", "show", *sock]) == 0
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert lines == {
        "vg0": "15.00ms (override; file: 30.00ms)",
        "vg1": "30.00ms",
        "vg2": "none (observe only)",
        "vg3": "5.00ms (override; file: none)",
    }


def test_a_threshold_answer_that_is_not_a_threshold_view_is_one_line(serve, capsys):
    sock = serve(lambda req: ok({"vg0": 0.0125, "vg1": None}))
    assert main(["threshold", "show", *sock]) == 1
    assert "vg0: an object is needed" in one_line(capsys.readouterr().err)


def test_threshold_reset_sends_the_command_and_shows_the_files_value(serve, capsys):
    def reply(req: dict[str, Any]) -> bytes:
        name = req["args"]["resource"]
        thr = 0.03 if name == "vg0" else None
        return ok({"resource": name, **th(thr, thr, False), "removed_s": None})

    srv = serve(reply)
    assert main(["threshold", "reset", "vg0", *srv]) == 0
    assert capsys.readouterr().out == "vg0: threshold 30.00ms (the configuration's)\n"
    assert main(["threshold", "reset", "vg1", *srv]) == 0
    assert "vg1: no threshold (observe only)" in capsys.readouterr().out
    assert main(["threshold", "reset", "vg0", "--json", *srv]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "protocol": PROTOCOL_VERSION,
        "data": {"resource": "vg0", **th(0.03, 0.03, False), "removed_s": None},
    }


def test_threshold_reset_sends_threshold_reset(tmp_path):
    seen: list[dict[str, Any]] = []
    srv = Server(
        tmp_path / "r.sock",
        lambda req: seen.append(req) or ok({"resource": "vg0", **th(None, None, False)}),
    )
    try:
        assert main(["threshold", "reset", "vg0", "--socket", str(tmp_path / "r.sock")]) == 0
    finally:
        srv.close()
    assert seen == [{"cmd": "threshold_reset", "args": {"resource": "vg0"}}]


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["threshold", "show"],
        ["threshold", "set", "vg0", "15ms"],
        ["pause"],
        ["resume"],
        ["reload"],
        ["top", "0.01", "2"],
    ],
    ids=" ".join,
)
def test_every_json_output_carries_the_protocol(argv, serve, capsys):
    sock = serve(lambda req: ok({"resource": "vg0", "threshold_s": 0.015}))
    assert main([*argv, "--json", *sock]) == 0
    for line in capsys.readouterr().out.strip().split("\n" if argv[0] == "top" else "\0"):
        out = json.loads(line)
        assert out["protocol"] == PROTOCOL_VERSION and out["data"]["resource"] == "vg0"


@pytest.mark.parametrize("verb", [["pin", "10.0.0.9", "--delay", "5ms"], ["unpin", "10.0.0.9"]])
def test_pin_never_goes_behind_a_silent_daemons_back(verb, serve, tmp_path, monkeypatch, capsys):
    """The configuration's socket has a daemon that does not answer: pin and unpin
    stop there (exit 3); only a socket nobody listens on sends them to the kernel."""
    import santhrottle.appliance.datapath as dp

    def kernel(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("pin went to the kernel behind the daemon's back")

    monkeypatch.setattr(dp, "Datapath", kernel)
    monkeypatch.setattr(dp, "discover", kernel)
    sock = serve(lambda req: None)[1]
    conf = tmp_path / "s.toml"
    conf.write_text(f'[daemon]\ncontrol_socket = "{sock}"\n[datapath]\ndevices = ["eth1"]\n')
    assert main([*verb, "--config", str(conf), "--timeout", "0.2"]) == 3
    assert "does not answer" in one_line(capsys.readouterr().err)
