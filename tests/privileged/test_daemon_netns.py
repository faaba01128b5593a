"""santhrottled for real in a network namespace it owns.

Start -> throttle -> SIGTERM -> nothing left.

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


def kernel_state(ns: str) -> tuple[str, str, str]:
    return (
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "st-d0"),
        sh("ip", "netns", "exec", ns, "ipset", "list", "-n"),
        sh("ip", "netns", "exec", ns, "iptables", "-t", "mangle", "-S"),
    )


def test_start_throttle_sigterm_leaves_nothing(ns, tmp_path):
    before = kernel_state(ns)
    sock = str(tmp_path / "control.sock")
    conf = tmp_path / "s.toml"
    disk = next(iter(sorted(p.name for p in Path("/sys/block").iterdir())), "vda")
    conf.write_text(
        f'[daemon]\ncontrol_socket = "{sock}"\nnetns = "{ns}"\n'
        f'[datapath]\ndevices = ["st-d0"]\nleaf = "pfifo"\nlink_speed = "10gbit"\n'
        f'[metrics]\nport = 0\n[resources.r0]\nthreshold = "20ms"\ndevices = ["{disk}"]\n'
    )
    proc = subprocess.Popen(
        [str(BIN / "santhrottled"), "--config", str(conf)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.05)
        time.sleep(0.3)
        assert "santhrottle-all" in kernel_state(ns)[1]
        request(sock, "pin", initiator="192.0.2.7", **{"class": 5, "mode": "all"})
        time.sleep(0.3)  # applied by the next tick
        listing = sh("ip", "netns", "exec", ns, "ipset", "list", "santhrottle-all")
        assert "192.0.2.7" in listing and "skbprio 5374:5" in listing, listing
        st = request(sock, "status")
        (ini,) = [i for i in st["initiators"] if i["initiator"] == "192.0.2.7"]
        assert ini["class"] == 5 and ini["pinned"]
        proc.send_signal(signal.SIGTERM)  # our own child, by PID
        assert proc.wait(timeout=30) == 0, proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert kernel_state(ns) == before
    assert not os.path.exists(sock)
