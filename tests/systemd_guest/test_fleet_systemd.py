"""The role's fleet of two (ansible/roles/santhrottle/tests/tests_fleet.yml) on two
systemd guests booted at once (vagrant/qemu/systemd_guest.py's run_pair), joined by
a link of their own (no host interface, no host address).

Both guests run tests/systemd_guest/guest_fleet.py with the Debian package of
dist-deb/ (`make deb`): gw-a gets the fleet's etcd member (the role santhrottle_etcd)
and the appliance, gw-b the appliance; then each reads its fleet status, gw-a runs
the playbook again, and the leader of r0 stops santhrottled.  These tests read what
both recorded: the runs' recaps, the two views of the fleet (the same appliances,
leader and epoch), the second run (nothing changed) and the failover.  The lab
tier: QEMU/TCG; a host without QEMU or Debian's kernel package skips with the reason.
A full run's only (`make lab-systemd`, SANTHROTTLE_LAB_FULL=1): make test skips it.
"""

from __future__ import annotations

import pytest

from .guest import booted
from .guest_fleet import APPLIANCES, view_problem

pytestmark = pytest.mark.lab

ETCD_START = "santhrottle_etcd : Start the members of a new cluster together"
INSTALL_DEB = "santhrottle : Install santhrottle from the Debian package"
START = "santhrottle : Start or stop santhrottled with systemd"


@pytest.fixture(scope="module")
def guests() -> dict[str, dict]:
    obs = booted("test_fleet_systemd")
    for g in obs:
        print(g["boot"])
        runs = ", ".join(f"{k} {r['wall_s']} s" for k, r in g["runs"].items())
        end = g.get("error") or ("done" if "wall_s" in g else "cut off")
        print(f"{g['appliance']}: {runs}; {end} after {g.get('wall_s')} s")
    return {g["appliance"]: g for g in obs}


def _failed(g: dict, what: str):
    last = next(reversed(g["runs"].values()), {"out": "(no run)"})
    pytest.fail(f"{g['appliance']}: no {what}: {g.get('error')}\n"
                f"{last['out'][-5000:]}\n{g.get('journal', '')}")  # fmt: skip


def _got(g: dict, key: str):
    """g[key], or a failure with what went wrong in that guest."""
    if key not in g:
        _failed(g, key)
    return g[key]


def _passed(g: dict, label: str) -> dict:
    r = g["runs"].get(label)
    if r is None:
        _failed(g, f"{label} run")
    assert r["rc"] == 0 and r["recap"] and r["recap"]["failed"] == 0, r["out"][-6000:]
    return r


def _result(r: dict, name: str) -> str | None:
    return next((res for k, n, res in r["results"] if (k, n) == ("TASK", name)), None)


def test_the_first_run_makes_an_etcd_member_on_gw_a_and_two_appliances(guests):
    a, b = (_passed(guests[n], "first") for n in APPLIANCES)
    assert _result(a, ETCD_START) == "changed"
    assert _result(b, ETCD_START) is None  # gw-b is not in the group etcd
    for r in (a, b):
        assert _result(r, INSTALL_DEB) == "changed"
        assert _result(r, START) == "changed"


def test_both_appliances_see_the_same_fleet_with_one_leader_of_r0(guests):
    va, vb = (_got(guests[n], "view") for n in APPLIANCES)
    for name, v in zip(APPLIANCES, (va, vb), strict=True):
        assert v["appliance"] == name
        assert view_problem(v, list(APPLIANCES)) is None, v
    assert va["leaders"]["r0"] == vb["leaders"]["r0"]  # the same leader and epoch
    assert sorted([va["leading"], vb["leading"]]) == [[], ["r0"]]
    assert _got(guests["gw-a"], "peer_view") == vb and _got(guests["gw-b"], "peer_view") == va


def test_a_second_run_of_both_roles_changes_nothing(guests):
    again = _passed(guests["gw-a"], "again")
    changed = [n for k, n, res in again["results"] if res == "changed"]
    assert again["recap"]["changed"] == 0, changed
    assert _result(again, "santhrottle_etcd : Run etcd at boot") == "ok"
    assert _result(again, "santhrottle : Write santhrottle.toml") == "ok"


def test_the_other_appliance_leads_r0_after_the_leaders_systemctl_stop(guests):
    stopped = [n for n in APPLIANCES if "stopped" in guests[n]]
    assert len(stopped) == 1, {n: guests[n].get("error") for n in APPLIANCES}
    leader = stopped[0]
    follower = next(n for n in APPLIANCES if n != leader)
    assert guests[leader]["stopped"]["rc"] == 0, guests[leader]["stopped"]
    f = _got(guests[follower], "failover")
    print(f"{leader} stopped -> {follower} leads r0 after {f['took_s']} s "
          f"(lease {guests[follower]['lease_ttl_s']} s)")  # fmt: skip
    assert f["before"]["appliance"] == leader
    v = f["view"]
    assert v["leading"] == ["r0"] and v["leaders"]["r0"]["appliance"] == follower
    assert v["leaders"]["r0"]["epoch"] > f["before"]["epoch"]
    assert v["appliances"] == [follower] and v["mode"] == "fleet"
    assert guests[leader]["failover"] == f  # the leader heard it too, and stayed up
