"""pytest plugin loaded in the lab guest (``-p lab_guest_report``).

Appends every test report, serialized the way pytest-xdist ships reports
between processes (pytest_report_to_serializable), as one JSON line to
$SANTHROTTLE_LAB_REPORT (in the shared work folder).  Lines are flushed one
by one, so a guest that crashes half way still hands back what it finished.
The host side (tests/lab/conftest.py) replays them onto its own items.
"""

from __future__ import annotations

import json
import os

_config = None


def _write(record: dict) -> None:
    path = os.environ.get("SANTHROTTLE_LAB_REPORT")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def pytest_configure(config) -> None:
    global _config
    _config = config


def pytest_runtest_logreport(report) -> None:
    data = _config.hook.pytest_report_to_serializable(config=_config, report=report)
    _write({"kind": "test", "data": data})


def pytest_collectreport(report) -> None:
    if report.failed:
        _write({"kind": "collect", "nodeid": report.nodeid, "text": str(report.longrepr)})
