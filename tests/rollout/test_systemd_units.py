"""systemd-analyze verify on the shipped units (skipped where systemd-analyze is missing)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = sorted((Path(__file__).parents[2] / "systemd").glob("*.service"))
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_verifies(unit, tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    # the unit names its commands without a directory (systemd's search path finds
    # them in /usr/local/bin or /usr/bin); point them at this venv's entry points
    text = re.sub(
        r"^(Exec\w+=[-+!@:]*)(santhrottled?) ", rf"\g<1>{BIN}/\2 ", unit.read_text(), flags=re.M
    )
    f = tmp_path / unit.name
    f.write_text(text)
    p = subprocess.run(
        [tool, "verify", "--man=no", str(f)],
        capture_output=True,
        text=True,
        env={"SYSTEMD_LOG_LEVEL": "notice", "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr


def test_unit_has_what_the_appliance_needs():
    text = (Path(__file__).parents[2] / "systemd" / "santhrottled.service").read_text()
    for line in (
        "Type=notify",
        "WatchdogSec=",
        "ExecStartPre=+santhrottled --check --config /etc/santhrottle/santhrottle.toml",
        "ExecStart=santhrottled --config /etc/santhrottle/santhrottle.toml",
        # the daemon's answer is systemctl reload's: a refused file fails it
        "ExecReload=santhrottle reload --socket /run/santhrottle/control.sock",
        "ExecStopPost=santhrottle cleanup --delays-only",
        # the limit of the stop and of the ExecStopPost after it: the cleanup took 17 s in
        # a loaded lab guest (make test beside two busy loops), past half of a 20 s limit
        "TimeoutStopSec=90s",
        "Restart=on-failure",
        "ProtectSystem=strict",
        "RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6 AF_PACKET",
        "SystemCallFilter=@system-service",
        # installed by the wheel (share/man/man8/santhrottled.8; test_rollout.py checks)
        "Documentation=man:santhrottled(8)",
    ):
        assert line in text, line
    # no install prefix: the same unit serves the Debian package (/usr/bin) and pip
    # as root (/usr/local/bin); every Documentation= is a man page both install
    settings = [line for line in text.splitlines() if not line.startswith("#")]
    assert not [line for line in settings if "/usr/local" in line or "kill -HUP" in line]
    docs = [d for line in re.findall(r"^Documentation=(.*)$", text, re.M) for d in line.split()]
    assert docs and all(re.fullmatch(r"man:[\w.]+\(\d\)", d) for d in docs), docs


def test_units_found():
    assert UNITS
