"""The Ansible role's own tests (ansible/roles/santhrottle/tests/tests_*.yml) against a
host that runs systemd: the systemd guest (vagrant/qemu/systemd_guest.py).

One boot runs tests/systemd_guest/guest_role.py: with the Debian package of
dist-deb/ (`make deb`), in order, the defaults, control mode twice (the second run
must change nothing), check mode with diff, the negative cases, and in a full run
(make lab-systemd) a reload (which must change nothing but the file) and a restart.
Each playbook checks its own outcome (its post_tasks); these tests read the recaps
and the handlers.  The lab tier: QEMU/TCG; a host without QEMU or Debian's kernel
package skips with the reason.
"""

from __future__ import annotations

import pytest
from labkit.host import FULL_RUN

from .guest import booted

pytestmark = pytest.mark.lab

RELOAD = "santhrottle : Reload santhrottled with systemd"
RESTART = "santhrottle : Restart santhrottled with systemd"


@pytest.fixture(scope="module")
def runs() -> dict:
    obs = booted("test_role_systemd")
    print(obs["boot"])
    print("runs (s): " + ", ".join(f"{k} {r['wall_s']}" for k, r in obs["runs"].items()))
    return obs["runs"]


def _passed(r: dict) -> dict:
    assert r["rc"] == 0 and r["recap"] and r["recap"]["failed"] == 0, r["out"][-6000:]
    return r["recap"]


def _result(r: dict, kind: str, name: str) -> str | None:
    return next((res for k, n, res in r["results"] if (k, n) == (kind, name)), None)


def _changed(r: dict) -> list[tuple[str, str]]:
    return [(k, n) for k, n, res in r["results"] if res == "changed"]


def test_the_role_converges_and_a_second_run_changes_nothing(runs):
    first = _passed(runs["control"])
    assert first["changed"] > 0
    again = runs["control-again"]
    changed = [f"{n}: {res}" for k, n, res in again["results"] if res == "changed"]
    assert _passed(again)["changed"] == 0, changed


def test_the_first_run_installs_the_debian_package(runs):
    r = runs["default"]
    assert _result(r, "TASK", "santhrottle : Install santhrottle from the Debian package") == (
        "changed"
    )
    # the venv path is not taken with a package (its imported tasks show as skipped)
    assert _result(r, "TASK", "santhrottle : Create the venv") in (None, "skipping")


def test_control_mode_starts_it_under_systemd(runs):
    r = runs["control"]
    _passed(r)
    assert _result(r, "TASK", "santhrottle : Start or stop santhrottled with systemd") == "changed"
    # just started: the handlers notified by the new file have nothing to do
    assert _result(r, "HANDLER", RELOAD) in (None, "skipping")


def test_check_mode_with_diff_reports_and_changes_nothing(runs):
    r = runs["check-mode"]
    recap = _passed(r)
    assert recap["changed"] > 0  # it says what it would do...
    assert '+threshold = "30ms"' in r["out"] and '-threshold = "15ms"' in r["out"]
    # ...and its post_tasks checked that the file and the process are unchanged


def test_a_new_threshold_reloads_the_same_process(runs):
    if "reload" not in runs:
        pytest.skip(f"the reload run is the full run's ({FULL_RUN}=1, make lab-systemd)")
    r = runs["reload"]
    _passed(r)
    # the file and the reload it notifies, nothing else (the role is idempotent)
    assert _changed(r) == [("TASK", "santhrottle : Write santhrottle.toml"), ("HANDLER", RELOAD)]
    assert _result(r, "HANDLER", RESTART) is None


def test_a_restart_key_restarts(runs):
    if "restart" not in runs:
        pytest.skip(f"the restart run is the full run's ({FULL_RUN}=1, make lab-systemd)")
    r = runs["restart"]
    _passed(r)
    assert _result(r, "HANDLER", RESTART) == "changed"


def test_bad_variables_are_refused_before_any_change(runs):
    recap = _passed(runs["negative"])
    assert recap["rescued"] == 4
