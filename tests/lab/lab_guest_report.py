"""pytest plugin loaded in the lab guest (``-p lab_guest_report``).

Appends every test report, serialized the way pytest-xdist ships reports
between processes (pytest_report_to_serializable), as one JSON line to
$SANTHROTTLE_LAB_REPORT (in the shared work folder).  Lines are flushed one
by one, so a guest that crashes half way still hands back what it finished.
The host side (tests/lab/conftest.py) replays them onto its own items.

Each test, its setup and teardown included, also runs within a time limit: what it
needs on an idle host (its module's LAB_TEST_S, else LAB_TEST_S), stretched by how much
slower the guest runs now (labkit.speed).  The limit goes into the test's report
(user_properties: lab_limit_s), so the host prints every test's time against it.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

# A lab test's time limit on an idle host, setup and teardown included: what the slowest
# needs there, several times over (a module's LAB_TEST_S overrides)
LAB_TEST_S = 300.0


class LabTestOverLimit(Exception):
    """A lab test ran past its time limit."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    from labkit import speed

    limit = speed.budget(float(getattr(item.module, "LAB_TEST_S", LAB_TEST_S)))
    item.user_properties.append(("lab_limit_s", round(limit, 1)))

    def over(signum, frame):
        raise LabTestOverLimit(f"{item.nodeid} ran past its {limit:.0f} s limit")

    old = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


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
