"""santhrottled's log (daemon/main.py setup_logging): the time first when stderr is not
journald's, the syslog priority and no time when it is; journald recognised as
systemd.exec(5) says (JOURNAL_STREAM equal to stderr's device and inode), not by the
variable's mere presence (inherited by a child whose stderr goes elsewhere)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

from santhrottle.appliance.daemon import main as daemon_main

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"
CODE = (
    "import logging\n"
    "from santhrottle.appliance.daemon.main import setup_logging\n"
    "setup_logging('INFO')\n"
    "logging.getLogger('santhrottled').warning('reloaded %s', 'a\\nb')\n"
    "logging.getLogger('santhrottled').info('started')\n"
)


def _run(stderr_path, journal_stream=None):
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    if journal_stream is not None:
        env["JOURNAL_STREAM"] = journal_stream
    with open(stderr_path, "w") as err:
        st = os.fstat(err.fileno())
        if journal_stream == "match":
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        subprocess.run([sys.executable, "-c", CODE], stderr=err, env=env, check=True, timeout=60)
    return open(stderr_path).read().splitlines()


def test_outside_journald_every_line_starts_with_its_time(tmp_path):
    lines = _run(tmp_path / "err")
    assert len(lines) == 2, lines
    assert re.fullmatch(rf"{STAMP} WARNING santhrottled: reloaded a\\nb", lines[0]), lines
    assert re.fullmatch(rf"{STAMP} INFO santhrottled: started", lines[1]), lines


def test_an_inherited_journal_stream_that_is_not_stderr_still_gets_times(tmp_path):
    for value in ("1:2", "garbage", ":", "12"):
        lines = _run(tmp_path / "err", value)
        assert re.match(STAMP, lines[0]), (value, lines)


def test_on_journalds_stream_the_priority_leads_and_no_time(tmp_path):
    # the file stands for journald's socket: its device and inode in JOURNAL_STREAM
    # (python-systemd, when there, takes this path instead: test_audit.py)
    py_systemd = subprocess.run(
        [sys.executable, "-c", "import systemd.journal"], capture_output=True, check=False
    )
    lines = _run(tmp_path / "err", "match")
    if py_systemd.returncode == 0:
        assert lines == [], lines  # gone to the journal's socket instead
        return
    assert lines == ["<4>WARNING santhrottled: reloaded a\\nb", "<6>INFO santhrottled: started"]


def test_under_journald_compares_device_and_inode(tmp_path, monkeypatch):
    with open(tmp_path / "f", "w") as f:
        st = os.fstat(f.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert daemon_main.under_journald(f)
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")
        assert not daemon_main.under_journald(f)
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not daemon_main.under_journald(sys.stderr)


def test_every_level_has_a_syslog_priority():
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL):
        assert level in daemon_main.SYSLOG_PRIORITY
