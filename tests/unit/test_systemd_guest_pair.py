"""The systemd guest pair's pure parts: the link's and the shared folder's QEMU
arguments (vagrant/qemu/systemd_guest.py), and the fleet test's inventory, view
judging and barriers (tests/systemd_guest/guest_fleet.py).  The pair itself boots
in the lab tier (tests/systemd_guest/test_fleet_systemd.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from labkit.host import LabError, Settings
from labkit.images import Kernel

from tests.systemd_guest import guest_fleet
from tests.systemd_guest.guest import _guest_module

pytestmark = pytest.mark.unit


def _value(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, x in enumerate(cmd) if x == flag]


def test_the_first_guest_listens_on_the_links_socket_and_the_second_connects(tmp_path):
    sg = _guest_module()
    sock = tmp_path / "link.sock"
    a = sg.link_args(sock, True, "52:54:00:77:00:01")
    b = sg.link_args(sock, False, "52:54:00:77:00:02")
    assert a == [
        "-netdev",
        f"stream,id=link,server=on,addr.type=unix,addr.path={sock}",
        "-device",
        "virtio-net-pci,netdev=link,mac=52:54:00:77:00:01",
    ]
    assert _value(b, "-netdev") == [f"stream,id=link,server=off,addr.type=unix,addr.path={sock}"]
    assert _value(b, "-device") == ["virtio-net-pci,netdev=link,mac=52:54:00:77:00:02"]
    with pytest.raises(LabError, match="too long"):
        sg.link_args(tmp_path / ("x" * 120), True, "52:54:00:77:00:01")


def test_each_guest_of_a_pair_is_told_its_mac_its_address_and_the_others():
    sg = _guest_module()
    assert sg.pair_env(0) == {
        "SANTHROTTLE_PAIR_INDEX": "1",
        "SANTHROTTLE_PAIR_MAC": "52:54:00:77:00:01",
        "SANTHROTTLE_PAIR_ADDRESS": "10.77.0.1/24",
        "SANTHROTTLE_PAIR_PEER": "10.77.0.2",
    }
    b = sg.pair_env(1)
    assert (b["SANTHROTTLE_PAIR_INDEX"], b["SANTHROTTLE_PAIR_MAC"]) == ("2", "52:54:00:77:00:02")
    assert (b["SANTHROTTLE_PAIR_ADDRESS"], b["SANTHROTTLE_PAIR_PEER"]) == (
        "10.77.0.2/24",
        "10.77.0.1",
    )


def test_a_guest_of_a_pair_shares_the_pair_folder_and_has_the_link(monkeypatch, tmp_path):
    monkeypatch.delenv("SANTHROTTLE_LAB_KERNEL_ARGS", raising=False)
    sg = _guest_module()
    s = Settings.from_env(cache=tmp_path, smp=1, log=lambda _msg: None)
    k = Kernel("k", "6.1.0-x", tmp_path, tmp_path / "vmlinuz", tmp_path / "modules")
    img, rundir, pair = tmp_path / "root.img", tmp_path / "run", tmp_path / "pair"
    alone = sg.qemu_command(s, "qemu-x", k, tmp_path / "initrd", img, rundir, 2048)
    link = sg.link_args(tmp_path / "l.sock", True, "52:54:00:77:00:01")
    one = sg.qemu_command(s, "qemu-x", k, tmp_path / "initrd", img, rundir, 2048, pair, link)
    assert "lab_pair=1" not in alone[alone.index("-append") + 1]
    assert "lab_pair=1" in one[one.index("-append") + 1].split()
    assert _value(one, "-smp") == ["1"]
    # the single guest's command line with the link, the pair's share and lab_pair=1
    n = alone.index("-drive")
    share = ["-virtfs", f"local,path={pair},mount_tag=pair,security_model=none"]
    assert [x.replace(" lab_pair=1", "") for x in one] == alone[:n] + link + share + alone[n:]


def test_the_inventory_makes_guest_1_the_etcd_member_and_both_appliances():
    a = guest_fleet.inventory(1, "10.77.0.1")
    b = guest_fleet.inventory(2, "10.77.0.1")
    assert a["all"]["hosts"] == {
        "gw-a": {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
    }
    assert a["all"]["children"] == {
        "fleet_appliances": {"hosts": {"gw-a": {}}},
        "etcd": {"hosts": {"gw-a": {"santhrottle_etcd_address": "10.77.0.1"}}},
    }
    assert list(b["all"]["hosts"]) == ["gw-b"]
    assert b["all"]["children"] == {"fleet_appliances": {"hosts": {"gw-b": {}}}}
    json.dumps(a)  # written as JSON, which the yaml inventory plugin reads


def _view(me: str, leader: str = "gw-a", **kw) -> dict:
    v = {
        "appliance": me,
        "mode": "fleet",
        "reason": "",
        "appliances": ["gw-a", "gw-b"],
        "leaders": {"r0": {"appliance": leader, "epoch": 3}},
        "leading": ["r0"] if me == leader else [],
    }
    return v | kw


@pytest.mark.parametrize(
    ("view", "problem"),
    [
        (_view("gw-a"), None),
        (_view("gw-b"), None),
        (_view("gw-b", leader="gw-b"), None),
        (_view("gw-a", mode="degraded", reason="no engine"), "mode 'degraded'"),
        (_view("gw-a", appliances=["gw-a"]), "appliances ['gw-a']"),
        (_view("gw-a", leaders={}), "r0's leader None"),
        (_view("gw-a", leaders={"r0": {"appliance": "gw-c", "epoch": 1}}), "not one of"),
        (_view("gw-b", leading=["r0"]), "but r0's leader is gw-a"),
        (_view("gw-a", leading=[]), "but r0's leader is gw-a"),
    ],
)
def test_a_view_of_the_fleet_is_judged(view, problem):
    got = guest_fleet.view_problem(view, ["gw-a", "gw-b"])
    assert got is None if problem is None else problem in got


def test_lease_ttl_grows_with_a_slower_guest():
    assert guest_fleet.lease_ttl_s(1.0) == guest_fleet.LEASE_TTL_S
    assert guest_fleet.lease_ttl_s(2.3) == 12


@pytest.fixture
def idle_speed(monkeypatch):
    monkeypatch.setattr(guest_fleet.speed, "factor", lambda fresh=False: 1.0)
    monkeypatch.setattr(guest_fleet, "POLL_S", 0.01)


def test_a_guest_hears_what_the_other_told(tmp_path: Path, idle_speed):
    a, b = guest_fleet.Pair(1, tmp_path), guest_fleet.Pair(2, tmp_path)
    t = threading.Timer(0.05, lambda: a.tell("viewed", {"leader": "gw-a"}))
    t.start()
    assert b.hear("viewed", 5) == {"leader": "gw-a"}
    t.join()
    assert not list(tmp_path.glob(".*.tmp"))  # written whole, then renamed


def test_a_guest_stops_waiting_when_the_other_failed_or_is_late(tmp_path: Path, idle_speed):
    a, b = guest_fleet.Pair(1, tmp_path), guest_fleet.Pair(2, tmp_path)
    with pytest.raises(guest_fleet.PeerGone, match="did not reach converged within 0 s"):
        b.hear("converged", 0.05)
    a.tell("failed", "AssertionError: the first run failed")
    with pytest.raises(guest_fleet.PeerGone, match="guest 1 failed: AssertionError"):
        b.hear("converged", 5)
    with pytest.raises(guest_fleet.PeerGone, match="guest 2 did not reach"):
        a.hear("converged", 0.05)  # its own failure is not the other's


def test_a_wait_stretches_when_the_guest_measures_itself_slower(tmp_path: Path, monkeypatch):
    # a loaded host slows both guests: the waiting one measures again and waits longer
    monkeypatch.setattr(guest_fleet.speed, "factor", lambda fresh=False: 1000.0 if fresh else 1.0)
    monkeypatch.setattr(guest_fleet, "POLL_S", 0.01)
    monkeypatch.setattr(guest_fleet, "REMEASURE_S", 0)
    a, b = guest_fleet.Pair(1, tmp_path), guest_fleet.Pair(2, tmp_path)
    t = threading.Timer(0.2, lambda: a.tell("again"))
    t.start()
    assert b.hear("again", 0.05) is None  # 0.05 s at the first measure, 50 s after
    t.join()


def test_the_pair_boots_in_a_full_run_only(monkeypatch):
    """make test leaves the pair's boot out (its tests skip, naming make lab-systemd);
    SANTHROTTLE_LAB_FULL=1 boots it; the single guests boot either way."""
    from labkit.host import FULL_RUN as FULL

    from tests.systemd_guest.guest import BOOTS

    pair = BOOTS["test_fleet_systemd"]
    monkeypatch.delenv(FULL, raising=False)
    assert not pair.wanted()
    assert [m for m, b in BOOTS.items() if b.wanted()] == [
        "test_package_systemd",
        "test_role_systemd",
    ]
    with pytest.raises(pytest.skip.Exception, match="make lab-systemd"):
        pair.run()
    monkeypatch.setenv(FULL, "1")
    assert all(b.wanted() for b in BOOTS.values())
