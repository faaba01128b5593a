"""systemd-analyze verify on the shipped units (skipped where systemd-analyze is missing)."""

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
    # the unit names the installed paths; point them at this venv's entry points
    text = unit.read_text().replace("/usr/local/bin/", f"{BIN}/")
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
        "ExecStopPost=/usr/local/bin/santhrottle cleanup --delays-only",
        "Restart=on-failure",
        "ProtectSystem=strict",
        "RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6 AF_PACKET",
        "SystemCallFilter=@system-service",
        # installed by the wheel (share/man/man8/santhrottled.8; test_rollout.py checks)
        "Documentation=man:santhrottled(8)",
    ):
        assert line in text, line


def test_units_found():
    assert UNITS
