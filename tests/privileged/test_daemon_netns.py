"""santhrottled for real in a network namespace it owns.

Start -> throttle -> SIGTERM -> nothing left.  A start that fails leaves the
kernel as it was; kill -9 then a start adopts what was left; cleanup
--delays-only works with a broken config; --check tells the truth.

The host kernel has no sch_netem, so the classes get a pfifo leaf
(`datapath.leaf = "pfifo"`): packets are classified, not delayed. The
delay itself is proven in the lab tier (tests/lab/test_daemon_lab.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from santhrottle.appliance.daemon.control import request

pytestmark = pytest.mark.privileged
BIN = Path(sys.executable).parent


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout


@pytest.fixture
def ns():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    for tool in ("ip", "tc", "ipset", "iptables-restore"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    name = f"st-d-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(
            ["ip", "-n", name, "link", "add", "st-d0", "type", "veth", "peer", "st-d1"], check=True
        )
        subprocess.run(["ip", "-n", name, "link", "set", "st-d0", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def kernel_state(ns: str) -> tuple[str, str, str, str]:
    return (
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "st-d0"),
        sh("ip", "netns", "exec", ns, "ipset", "list", "-n"),
        sh("ip", "netns", "exec", ns, "iptables", "-t", "mangle", "-S"),
        sh("ip", "netns", "exec", ns, "ip6tables", "-t", "mangle", "-S"),
    )


def test_start_throttle_sigterm_leaves_nothing(ns, tmp_path):
    before = kernel_state(ns)
    sock = str(tmp_path / "control.sock")
    conf = tmp_path / "s.toml"
    disk = next(iter(sorted(p.name for p in Path("/sys/block").iterdir())), "vda")
    conf.write_text(
        f'[daemon]\ncontrol_socket = "{sock}"\nnetns = "{ns}"\n'
        f'state_dir = "{tmp_path / "state"}"\n'
        f'[datapath]\ndevices = ["st-d0"]\nleaf = "pfifo"\nlink_speed = "10gbit"\n'
        f'[metrics]\nport = 0\n[resources.r0]\nthreshold = "20ms"\ndevices = ["{disk}"]\n'
    )
    proc = _start(conf, sock)
    try:
        assert "santhrottle-all" in kernel_state(ns)[1]
        request(sock, "pin", initiator="192.0.2.7", **{"class": 5, "mode": "all"})
        request(sock, "pin", initiator="FD00::7", **{"class": 6, "mode": "read"})

        def listing(name: str) -> str:
            return sh("ip", "netns", "exec", ns, "ipset", "list", name)

        deadline = time.monotonic() + 10  # applied by the next tick
        while "fd00::7" not in listing("santhrottle-read6") and time.monotonic() < deadline:
            time.sleep(0.05)
        got = listing("santhrottle-all")
        assert "192.0.2.7" in got and "skbprio 5374:5" in got, got
        got = listing("santhrottle-read6")
        assert "fd00::7" in got and "skbprio 5374:6" in got, got
        assert "-j SANTHROTTLE" in kernel_state(ns)[3]  # the jump in ip6tables too
        st = request(sock, "status")
        pinned = {i["initiator"]: i for i in st["initiators"] if i["pinned"]}
        assert pinned["192.0.2.7"]["class"] == 5 and pinned["fd00::7"]["class"] == 6
        proc.send_signal(signal.SIGTERM)  # our own child, by PID
        assert proc.wait(timeout=30) == 0, proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert kernel_state(ns) == before
    assert not os.path.exists(sock)


def _conf(tmp_path: Path, ns: str, extra: str = "", metrics_port: int = 0) -> Path:
    conf = tmp_path / "s.toml"
    conf.write_text(
        f'[daemon]\ncontrol_socket = "{tmp_path / "control.sock"}"\nnetns = "{ns}"\n'
        f'state_dir = "{tmp_path / "state"}"\n'
        f'[datapath]\ndevices = ["st-d0"]\nleaf = "pfifo"\nlink_speed = "10gbit"\n'
        f"[metrics]\nport = {metrics_port}\n{extra}"
    )
    return conf


def _run(prog: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / prog), *argv], capture_output=True, text=True, timeout=120, check=False
    )


def _start(
    conf: Path, sock: str, prefix: tuple[str, ...] = (), log: Path | None = None
) -> subprocess.Popen:
    """santhrottled on conf (after prefix: `ip netns exec NS`), once it answers on
    sock; its output to log (a file: it may log much) or to a pipe."""
    out = subprocess.PIPE if log is None else open(log, "w")  # noqa: SIM115 (the child's)
    proc = subprocess.Popen(
        [*prefix, str(BIN / "santhrottled"), "--config", str(conf)],
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            request(sock, "ping")
            return proc
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:  # hung: end it (our own child), then its output
                    proc.kill()
                    proc.wait()
                why = proc.stdout.read() if log is None else log.read_text()
                raise AssertionError(f"santhrottled did not start: {why}") from None
            time.sleep(0.05)


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)  # our own child, by PID
        proc.wait(timeout=30)


def _members(ns: str) -> str:
    return sh("ip", "netns", "exec", ns, "ipset", "list", "santhrottle-all")


def _until_members(ns: str, *ips: str, within_s: float = 15.0) -> None:
    """Wait until every ip is in the kernel's sets: a pin reaches the kernel at a tick
    after its request, later on a loaded host (a fixed sleep flaked there)."""
    deadline = time.monotonic() + within_s
    while not all(ip in _members(ns) for ip in ips):
        assert time.monotonic() < deadline, (ips, _members(ns))
        time.sleep(0.1)


def test_a_start_that_cannot_take_the_metrics_port_leaves_the_kernel_as_it_was(ns, tmp_path):
    import socket as _socket

    before = kernel_state(ns)
    with _socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        conf = _conf(tmp_path, ns, metrics_port=port)
        p = _run("santhrottled", "--config", str(conf))
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Address already in use" in lines[0], p.stderr
    assert kernel_state(ns) == before
    assert not (tmp_path / "control.sock").exists()


def test_a_second_daemon_on_the_socket_touches_nothing(ns, tmp_path):
    conf = _conf(tmp_path, ns)
    sock = str(tmp_path / "control.sock")
    first = _start(conf, sock)
    try:
        request(sock, "pin", initiator="192.0.2.7", **{"class": 5, "mode": "all"})
        _until_members(ns, "192.0.2.7")
        state = kernel_state(ns)
        p = _run("santhrottled", "--config", str(conf))
        assert p.returncode == 1 and "another santhrottled" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
        assert kernel_state(ns) == state and "192.0.2.7" in _members(ns)
        assert request(sock, "ping")
    finally:
        _stop(first)


def test_kill_9_then_start_adopts_pins_and_releases_the_rest(ns, tmp_path):
    conf = _conf(tmp_path, ns, extra='[controller]\nconverge = "200ms"\n')
    sock = str(tmp_path / "control.sock")
    proc = _start(conf, sock)
    try:
        request(sock, "pin", initiator="192.0.2.7", **{"class": 88, "mode": "all"})
        request(sock, "pin", initiator="192.0.2.8", **{"class": 3, "mode": "all"})
        request(sock, "pause")
        request(sock, "resume")
        _until_members(ns, "192.0.2.7", "192.0.2.8")
        # the pin of .8 is lost from the state file: the kernel alone knows it
        state = tmp_path / "state" / "state.json"
        import json as _json

        doc = _json.loads(state.read_text())
        proc.kill()  # SIGKILL, our own child
        proc.wait()
        del doc["pins"]["192.0.2.8"]
        state.write_text(_json.dumps(doc))
        proc = _start(conf, sock)
        st = {i["initiator"]: i for i in request(sock, "status")["initiators"]}
        assert st["192.0.2.7"]["pinned"] and st["192.0.2.7"]["class"] == 88
        assert st["192.0.2.8"]["adopted"] and st["192.0.2.8"]["class"] == 3
        deadline = time.monotonic() + 15  # held 3 x 200 ms, then a class per tick
        while "192.0.2.8" in _members(ns):
            assert time.monotonic() < deadline, _members(ns)
            time.sleep(0.1)
        request(sock, "unpin", initiator="192.0.2.7")
        deadline = time.monotonic() + 10  # through a glide leaf: 2 x 250 ms and quiet looks
        while "192.0.2.7" in _members(ns):
            assert time.monotonic() < deadline, _members(ns)
            time.sleep(0.1)
    finally:
        _stop(proc)


def test_cleanup_delays_only_works_with_a_broken_config(ns, tmp_path):
    conf = _conf(tmp_path, ns)
    sock = str(tmp_path / "control.sock")
    proc = _start(conf, sock)
    try:
        request(sock, "pin", initiator="192.0.2.7", **{"class": 9, "mode": "all"})
        _until_members(ns, "192.0.2.7")
    finally:
        proc.kill()  # SIGKILL: the delay stays in the kernel
        proc.wait()
    assert "192.0.2.7" in _members(ns)
    conf.write_text(conf.read_text() + "[datapath.nope]\nports = [1, 1]\n[[[")
    p = _run("santhrottle", "cleanup", "--delays-only", "--config", str(conf))
    assert p.returncode == 0, p.stderr
    assert "192.0.2.7" not in _members(ns)
    assert "Traceback" not in p.stderr


def test_check_tells_the_truth(ns, tmp_path):
    conf = _conf(tmp_path, ns)
    ok = _run("santhrottled", "--check", "--config", str(conf))
    assert ok.returncode == 0, ok.stderr
    netem = conf.read_text().replace('leaf = "pfifo"\n', "")
    (tmp_path / "netem.toml").write_text(netem)
    bad = _run("santhrottled", "--check", "--config", str(tmp_path / "netem.toml"))
    if Path("/sys/module/sch_netem").exists():
        assert bad.returncode == 0, bad.stderr
    else:
        assert bad.returncode == 1 and "sch_netem" in bad.stderr, bad.stderr
    (tmp_path / "gone.toml").write_text(
        conf.read_text().replace(f'netns = "{ns}"', 'netns = "st-none"')
    )
    gone = _run("santhrottled", "--check", "--config", str(tmp_path / "gone.toml"))
    assert gone.returncode == 1 and "st-none" in gone.stderr
    (tmp_path / "dev.toml").write_text(conf.read_text().replace('"st-d0"', '"st-nodev"'))
    dev = _run("santhrottled", "--check", "--config", str(tmp_path / "dev.toml"))
    assert dev.returncode == 1 and "st-nodev" in dev.stderr
    assert not [n for n in sh("ip", "netns", "list").split() if n.startswith("santhrottle-check")]


def test_metrics_bound_the_initiator_series_reload_the_bound_and_have_process_series(ns, tmp_path):
    """The real daemon's exporter: metrics.initiator_series keeps the most delayed
    initiators' series (the rest counted in santhrottle_initiators_omitted), a reload
    changes it at the next scrape, process_* are this daemon's; its log lines start with
    their time (stderr is not journald's)."""
    import re as _re
    import socket as _socket
    import urllib.request

    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = _conf(tmp_path, ns, "initiator_series = 2\n", metrics_port=port)
    sock = str(tmp_path / "control.sock")
    log = tmp_path / "daemon.log"
    proc = _start(conf, sock, log=log)
    try:
        for k, ip in enumerate(("192.0.2.5", "192.0.2.6", "192.0.2.7"), start=5):
            request(sock, "pin", initiator=ip, **{"class": k, "mode": "all"})

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                return r.read().decode()

        def series(text: str) -> set[str]:
            return set(_re.findall(r'^santhrottle_initiator_\w+\{initiator="([^"]+)"', text, _re.M))

        deadline = time.monotonic() + 10  # the pins reach the kernel at the next ticks
        pinned = ("192.0.2.5", "192.0.2.6", "192.0.2.7")
        while not all(ip in _members(ns) for ip in pinned) and time.monotonic() < deadline:
            time.sleep(0.05)
        text = scrape()
        assert series(text) == {"192.0.2.6", "192.0.2.7"}, text
        assert "santhrottle_initiators_omitted 1.0" in text
        assert 'santhrottle_initiator_delayed_packets_total{initiator="192.0.2.7"' in text
        assert 'santhrottle_initiator_delayed_packets_total{initiator="192.0.2.5"' not in text
        pid_fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        (fds,) = _re.findall(r"^process_open_fds (\S+)$", text, _re.M)
        assert abs(float(fds) - pid_fds) <= 4, (fds, pid_fds)  # the daemon's, not ours
        assert _re.search(r"^process_cpu_seconds_total \S+$", text, _re.M)
        conf.write_text(conf.read_text().replace("initiator_series = 2", "initiator_series = 0"))
        assert _run("santhrottle", "reload", "--socket", sock).returncode == 0
        text = scrape()
        assert series(text) == set() and "santhrottle_initiators_omitted 3.0" in text
        assert "santhrottle_initiators 3.0" in text
    finally:
        _stop(proc)
    lines = [ln for ln in log.read_text().splitlines() if " santhrottled" in ln]
    assert lines and all(
        _re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d (INFO|WARNING|ERROR) ", ln)
        for ln in lines
    ), lines[:5]
