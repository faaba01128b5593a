"""A volume group appearing and disappearing under a running santhrottled, in the lab guest
(the host kernel has no device-mapper: no LV can be made there).

The daemon runs in target mode as its unit would (test_daemon_lab.py), every discovered
volume group controlled ([controller] default_threshold). A VG on a loop device is made
while it runs: discovery finds it, it becomes a resource; it is removed (its LV
deactivated, the VG, the PV and the loop device gone): the resource goes, with no
sensor error, nothing in the log above INFO but the warning that names the devices gone
from /proc/diskstats (its LV's dm-N, the loop device) and late ticks (the guest runs
under TCG: its speed, not what this checks), nobody left delayed, the ticks going on.
Twice, so the second appearance is found as the first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from labkit import speed
from labkit.topology.names import LVM_ENV

from tests.lab.test_daemon_lab import BIN, SOCK, _ticked

pytestmark = pytest.mark.lab

VG = "stcomego"  # the volume group that comes and goes
ENV = {**os.environ, **LVM_ENV}


def _sh(*cmd: str, check: bool = True) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=speed.budget(60))
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}: {p.returncode} {p.stderr.strip()}")
    return p.stdout


def _status() -> dict:
    from santhrottle.appliance.daemon.control.client import request

    return request(SOCK, "status", timeout_s=speed.budget(10))


def _resources() -> set[str]:
    return {r["resource"] for r in _status()["resources"]}


def _until(what, budget_s: float) -> bool:
    deadline = time.monotonic() + speed.budget(budget_s)
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _remove(loop: str | None) -> None:
    """The VG and its loop device gone, whatever is left of them."""
    _sh("vgremove", "-qq", "-f", "-y", VG, check=False)
    if loop:
        _sh("pvremove", "-qq", "-y", loop, check=False)
        _sh("losetup", "-d", loop, check=False)


@pytest.fixture
def daemon(topology, tmp_path):
    conf = tmp_path / "santhrottle.toml"
    conf.write_text(
        f'[daemon]\ncontrol_socket = "{SOCK}"\nnetns = "{topology["netns"]}"\n'
        f'state_dir = "{tmp_path / "state"}"\n'
        '[datapath]\ndevices = ["lab-tgt"]\nmax_delay = "50ms"\nlink_speed = "10gbit"\n'
        '[metrics]\nport = 0\n[controller]\ndefault_threshold = "50ms"\n'
    )
    log = tmp_path / "daemon.log"
    with open(log, "w") as out:
        cmd = [str(BIN / "santhrottled"), "--config", str(conf)]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        assert _until(lambda: proc.poll() is not None or _ticked(), 60), log.read_text()
        assert proc.poll() is None, log.read_text()
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # our own child, by PID
            try:
                proc.wait(timeout=speed.budget(20))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # the data path gone whatever happened: the guest's next tests start clean
        cleanup = [str(BIN / "santhrottle"), "cleanup", "--config", str(conf)]
        subprocess.run(cleanup, capture_output=True, timeout=speed.budget(60))
        print(log.read_text()[-3000:])


def test_a_volume_group_that_comes_and_goes(topology, daemon, tmp_path: Path):
    proc, log = daemon
    _sh("modprobe", "loop", check=False)
    img = tmp_path / "vg.img"
    st0 = _status()
    assert VG not in _resources()
    for _ in range(2):
        with open(img, "wb") as f:
            f.truncate(64 << 20)
        loop = _sh("losetup", "-f", "--show", str(img)).strip()
        try:
            _sh("vgcreate", "-qq", "-y", VG, loop)
            _sh("lvcreate", "-qq", "-W", "n", "-Z", "n", "-y", "-L", "16m", "-n", "lv0", VG)
            assert _until(lambda: VG in _resources(), 30), _status()["resources"]
        finally:
            _remove(loop)
        assert _until(lambda: VG not in _resources(), 30), _status()["resources"]
    st = _status()
    assert proc.poll() is None
    assert topology["vg"] in _resources()  # the lab's own VG stays
    assert st["counters"]["sensor_errors"] == st0["counters"]["sensor_errors"], st["counters"]
    assert st["counters"]["actuator_errors"] == st0["counters"]["actuator_errors"]
    assert st["counters"]["ticks"] > st0["counters"]["ticks"]
    assert [i["initiator"] for i in st["initiators"] if i["class"]] == []  # nobody delayed
    members = subprocess.run(
        ["ip", "netns", "exec", topology["netns"], "ipset", "list", "santhrottle-all"],
        capture_output=True,
        text=True,
    ).stdout
    assert "skbprio" not in members, members
    text = log.read_text()
    loud = [ln for ln in text.splitlines() if _loud(ln)]
    assert "Traceback" not in text and loud == [], text


GONE = "diskstats: device(s) gone: "  # appliance/sensing/target.py's warning
LATE = "santhrottled: tick late by "  # core/loop.py's, under TCG


def _loud(line: str) -> bool:
    """A log line above INFO, but the warning naming the VG's devices as they went and
    a late tick's."""
    if " ERROR " in line or " CRITICAL " in line:
        return True
    if " WARNING " not in line or LATE in line:
        return False
    if GONE not in line:
        return True
    gone = line.split(GONE, 1)[1].split(", ")
    return not all(d.startswith(("dm-", "loop")) for d in gone)
